"""The synth template check for thinking targets, under chat templates written to behave as the
real families do with a finished turn's reasoning: Qwen3 keeps the last one, DeepSeek-R1 drops
it (and its generation prompt opens the thinking block), Kimi renders an empty block; and a
channel format like gpt-oss's. Markers come from the installed vLLM's reasoning parsers; the
tokenizer is the packaged one (with <think> and </think> added as single tokens, as Qwen3's and
DeepSeek-R1's tokenizers have them, where the family's parser needs that)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from eagle3_pipeline.synth import answers, records
from eagle3_pipeline.synth import check as reasoning
from eagle3_pipeline.synth import stage as synth

CHATML_USER = "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"

# Qwen3: a finished turn keeps its reasoning only when it is the last assistant turn.
QWEN3_LIKE = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.last and m.reasoning_content -%}"
    "{{- '<think>\\n' + m.reasoning_content.strip() + '\\n</think>\\n\\n' -}}{%- endif -%}"
    "{{- m.content.strip() + '<|im_end|>\\n' -}}"
    "{%- else -%}" + CHATML_USER + "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# DeepSeek-R1: finished turns keep what follows </think>; the generation prompt opens <think>.
R1_LIKE = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}"
    "{%- set c = m.content -%}{%- if '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + c.strip() + '<|im_end|>\\n' -}}"
    "{%- else -%}" + CHATML_USER + "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)
# Kimi: every finished turn with an empty thinking block.
KIMI_LIKE = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n<think></think>' + m.content + '<|im_end|>\\n' -}}"
    "{%- else -%}" + CHATML_USER + "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# gpt-oss: channels; finished turns keep the final channel only.
CHANNEL_LIKE = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' -}}"
    "{%- else -%}{{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

HISTORY = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four."},
    {"role": "user", "content": "And 3 + 3?"},
]
REASONING = "Three and three make six."
CONTENT = "It is 6."

# family: (template, parser, completion text of a correct answer, its opened/not state)
FAMILIES = {
    "qwen3": (QWEN3_LIKE, "qwen3", f"<think>\n{REASONING}\n</think>\n\n{CONTENT}"),
    "deepseek_r1": (R1_LIKE, "deepseek_r1", f"{REASONING}\n</think>\n\n{CONTENT}"),
    "kimi": (KIMI_LIKE, "kimi_k2", f"<think>{REASONING}</think>{CONTENT}"),
}
# what a model could write instead, per family: (cause, completion text)
BROKEN = {
    "qwen3": [
        ("markers_missing", f"{REASONING}\n\n{CONTENT}"),  # wrapper stripped
        ("outside", f"{REASONING}<think>\n</think>\n\n{CONTENT}"),  # reasoning before the block
        ("fields", f"<think>\n</think>\n\n{REASONING} {CONTENT}"),  # reasoning after the block
        ("doubled", f"<think><think>\n{REASONING}\n</think></think>\n\n{CONTENT}"),
    ],
    "deepseek_r1": [
        ("markers_missing", f"{REASONING}\n\n{CONTENT}"),
        ("fields", f"</think>\n\n{REASONING} {CONTENT}"),
        ("doubled", f"<think>\n{REASONING}\n</think>\n\n{CONTENT}"),  # prompt opened it already
        ("doubled", f"{REASONING}\n</think></think>\n\n{CONTENT}"),
    ],
    "kimi": [
        ("markers_missing", f"{REASONING}{CONTENT}"),
        ("outside", f"{REASONING}<think></think>{CONTENT}"),
        ("fields", f"<think></think>{REASONING} {CONTENT}"),
        ("doubled", f"<think><think>{REASONING}</think></think>{CONTENT}"),
    ],
}


@pytest.fixture(scope="module")
def think_tokenizer(tokenizer):
    """The packaged tokenizer with <think> and </think> as single tokens."""
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["<think>", "</think>"])
    return tok


def record(tok, template: str, completion: str, reasoning_text, content: str, **extra) -> dict:
    """A record as synth stores it: the server's ids, and its reasoning/content split."""
    prompt = reasoning.render_ids(
        tok, HISTORY, {}, add_generation_prompt=True, chat_template=template
    )
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    ids = [*tok.encode(completion, add_special_tokens=False), end_of_turn]
    return {
        "id": "t:0",
        "messages": HISTORY,
        "prompt_token_ids": prompt,
        "completion_token_ids": ids,
        "reasoning": reasoning_text,
        "content": content,
        "finish_reason": "stop",
        **extra,
    }


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_correct_record_passes_whatever_the_template_does_with_old_reasoning(
    family, think_tokenizer
):
    template, parser, completion = FAMILIES[family]
    markers = reasoning.parser_markers(parser, think_tokenizer)
    assert (markers.start, markers.end) == ("<think>", "</think>")
    rec = record(think_tokenizer, template, completion, REASONING, CONTENT)
    assert reasoning.check_record(think_tokenizer, rec, {}, markers, template) is None


@pytest.mark.parametrize(
    ("family", "trap"), [("deepseek_r1", True), ("kimi", True), ("qwen3", False)]
)
def test_the_rerender_check_flags_templates_that_drop_or_empty_reasoning(
    family, trap, think_tokenizer
):
    """The check for targets without a parser re-renders the answer: right for Qwen3's
    template, a text mismatch on every record for DeepSeek-R1's and Kimi's."""
    template, _, completion = FAMILIES[family]
    rec = record(think_tokenizer, template, completion, REASONING, CONTENT)
    problem = reasoning.rerender_check(think_tokenizer, rec, {}, template)
    assert (problem is not None and problem["kind"] == "text") == trap


@pytest.mark.parametrize(
    ("family", "cause", "completion"),
    [(family, cause, text) for family, cases in BROKEN.items() for cause, text in cases],
)
def test_a_broken_wrapper_fails_as_text(family, cause, completion, think_tokenizer):
    template, parser, _ = FAMILIES[family]
    markers = reasoning.parser_markers(parser, think_tokenizer)
    rec = record(think_tokenizer, template, completion, REASONING, CONTENT)
    problem = reasoning.check_record(think_tokenizer, rec, {}, markers, template)
    assert problem is not None
    assert (problem["part"], problem["kind"], problem["cause"]) == ("completion", "text", cause)


def test_an_answer_cut_inside_the_thinking_block_passes(think_tokenizer):
    template, parser, _ = FAMILIES["deepseek_r1"]
    markers = reasoning.parser_markers(parser, think_tokenizer)
    rec = record(think_tokenizer, template, REASONING, REASONING, "", finish_reason="length")
    rec["completion_token_ids"] = rec["completion_token_ids"][:-1]  # no end of turn either
    assert reasoning.check_record(think_tokenizer, rec, {}, markers, template) is None
    # ... but not when the server says there was an answer after it
    rec["content"] = CONTENT
    assert reasoning.check_record(think_tokenizer, rec, {}, markers, template)["cause"] == (
        "markers_missing"
    )


def test_thinking_switched_off_in_the_prompt_expects_an_answer_only(think_tokenizer):
    # Qwen3's enable_thinking=False: the generation prompt holds an empty, closed block.
    template = QWEN3_LIKE[: QWEN3_LIKE.rindex("{%- if add_generation_prompt")] + (
        "{%- if add_generation_prompt -%}"
        "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    )
    markers = reasoning.parser_markers("qwen3", think_tokenizer)
    ok = record(think_tokenizer, template, CONTENT, None, CONTENT)
    assert reasoning.check_record(think_tokenizer, ok, {}, markers, template) is None
    again = record(think_tokenizer, template, f"<think>{REASONING}</think>{CONTENT}", None, CONTENT)
    assert reasoning.check_record(think_tokenizer, again, {}, markers, template)["cause"] == (
        "doubled"
    )


def test_markers_as_ordinary_text_with_the_olmo3_parser(tokenizer):
    """SmolLM2 has no <think> token: vLLM's olmo3 parser matches the markers as text (the
    parser the CPU thinking run uses); deepseek_r1's cannot even be built for it."""
    markers = reasoning.parser_markers("olmo3", tokenizer)
    template, _, completion = FAMILIES["deepseek_r1"]
    good = record(tokenizer, template, completion, REASONING, CONTENT)
    assert reasoning.check_record(tokenizer, good, {}, markers, template) is None
    stripped = record(tokenizer, template, f"{REASONING}\n\n{CONTENT}", REASONING, CONTENT)
    assert reasoning.check_record(tokenizer, stripped, {}, markers, template)["kind"] == "text"
    with pytest.raises(RuntimeError, match="think start/end tokens"):
        reasoning.parser_markers("deepseek_r1", tokenizer)


def test_a_channel_format_without_markers_checks_order_only(tokenizer):
    """vLLM's gpt-oss parser (openai_gptoss) has no markers (harmony parses the channels), so
    the check can only require the reasoning, then the answer, in the completion: a stripped or
    doubled channel header is not caught."""
    markers = reasoning.parser_markers("openai_gptoss", tokenizer)
    assert (markers.start, markers.end) == (None, None)
    completion = (
        f"<|channel|>analysis<|message|>{REASONING}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{CONTENT}<|return|>"
    )
    good = record(tokenizer, CHANNEL_LIKE, completion, REASONING, CONTENT)
    assert reasoning.check_record(tokenizer, good, {}, markers, CHANNEL_LIKE) is None
    lost = record(tokenizer, CHANNEL_LIKE, completion.replace(REASONING, ""), REASONING, CONTENT)
    assert reasoning.check_record(tokenizer, lost, {}, markers, CHANNEL_LIKE)["kind"] == "text"
    swapped = record(tokenizer, CHANNEL_LIKE, f"{CONTENT} then {REASONING}", REASONING, CONTENT)
    assert reasoning.check_record(tokenizer, swapped, {}, markers, CHANNEL_LIKE)["kind"] == "text"


def test_a_prompt_rendered_by_another_template_names_the_template(think_tokenizer):
    template, parser, completion = FAMILIES["kimi"]
    markers = reasoning.parser_markers(parser, think_tokenizer)
    rec = record(
        think_tokenizer,
        QWEN3_LIKE.replace("assistant\\n'", "bot\\n'"),
        completion,
        REASONING,
        CONTENT,
    )
    problem = reasoning.check_record(think_tokenizer, rec, {}, markers, template)
    assert (problem["part"], problem["kind"], problem["cause"]) == ("prompt", "text", "prompt")
    assert "chat template" in reasoning.explain({"prompt": 1})


def test_the_failure_message_names_the_cause_and_how_to_go_on():
    cfg = {"max_template_mismatch_fraction": 0.02}
    example = {"kind": "text", "cause": "markers_missing", "id": "t:0"}
    msg = reasoning.failure_message(
        30, 32, {"markers_missing": 30}, [example], cfg, "results/x/synth/.partial"
    )
    assert "synth.reasoning_parser" in msg and "parser" in msg.split("Likely cause:")[1]
    assert "kept in results/x/synth/.partial:" in msg
    assert "synth.max_template_mismatch_fraction: 1.0" in msg
    assert reasoning.CAUSES["markers_missing"] in msg


def test_a_chat_template_override_is_served_and_part_of_the_targets_identity(tmp_path, target_json):
    from eagle3_pipeline.config import validate
    from eagle3_pipeline.engine.spec import spec_for_target
    from eagle3_pipeline.target import stage as target_lib

    template = tmp_path / "thinking.jinja"
    template.write_text(R1_LIKE)
    extra = target_lib.copy_chat_template({"chat_template": str(template)}, tmp_path / "target")
    info = {**target_lib.load_info(target_json), **extra}
    assert target_lib.chat_template_text(info) == R1_LIKE
    spec = spec_for_target(validate({})["vllm"], info, extra_args=["--max-num-seqs", "4"])
    assert spec.extra_args[-4:] == [
        "--chat-template",
        extra["chat_template_file"],
        "--max-num-seqs",
        "4",
    ]
    assert target_lib.chat_template_text(target_lib.load_info(target_json)) is None


def test_a_parser_the_check_cannot_use_fails_before_any_answer(target_json):
    from eagle3_pipeline.target.stage import load_info

    target = load_info(target_json)
    with pytest.raises(synth.SynthError, match=r"synth\.reasoning_parser='deepseek_r1'"):
        records.check_tools(target, {"reasoning_parser": "deepseek_r1"})
    assert records.check_tools(target, {"reasoning_parser": None})[1] is None


def test_a_failed_check_keeps_the_answers_and_relaxing_it_asks_for_none(tmp_path, target_json):
    """synth.run on a journal that already holds every answer (as after a failed check): the
    check runs alone, fails with its cause, and passes with the threshold relaxed - without a
    server (the endpoint is unreachable) and without asking for an answer again."""
    import json

    from eagle3_pipeline.config import validate
    from eagle3_pipeline.runtime.files import iter_jsonl, write_jsonl_zst
    from eagle3_pipeline.target.stage import copy_chat_template, load_info

    template_file = tmp_path / "r1.jinja"
    template_file.write_text(R1_LIKE)
    info = {
        **load_info(target_json),
        **copy_chat_template({"chat_template": str(template_file)}, tmp_path),
    }
    target = tmp_path / "target.json"
    target.write_text(json.dumps(info))
    tok = tokenizer_of(info)
    prompts = [{"id": f"t:{i}", "messages": HISTORY} for i in range(3)]
    write_jsonl_zst(tmp_path / "prompts.jsonl.zst", prompts)
    # answers split by a parser with other markers than the model writes
    cfg = validate({"synth": {"endpoint": "http://127.0.0.1:9/v1", "reasoning_parser": "kimi_k3"}})
    work = tmp_path / ".partial"
    journal = answers.AnswerStore(
        work, answers.fingerprint(info, cfg["synth"], cfg["vllm"])
    ).journal(0, 1)
    for p in prompts:
        rec = record(tok, R1_LIKE, FAMILIES["deepseek_r1"][2], REASONING, CONTENT, id=p["id"])
        journal.append({"status": "ok", "key": answers.prompt_key(p), "latency_s": 0.1, **rec})
    journal.close()

    def run(synth_cfg):
        return synth.run(
            target,
            tmp_path / "prompts.jsonl.zst",
            tmp_path / "synth.jsonl.zst",
            tmp_path / "stats.json",
            synth_cfg,
            cfg["vllm"],
            work,
        )

    with pytest.raises(synth.SynthError) as failed:
        run(cfg["synth"])
    message = str(failed.value)
    assert "3 of 3 records" in message and "'markers_missing': 3" in message
    assert reasoning.CAUSES["markers_missing"] in message
    assert f"kept in {work}/" in message and not (tmp_path / "synth.jsonl.zst").exists()
    stats = run({**cfg["synth"], "max_template_mismatch_fraction": 1.0})
    assert stats["this_run"]["reused"] == 3 and stats["this_run"]["answered"] == 0
    assert stats["template_check"]["text_by_cause"] == {"markers_missing": 3}
    assert len(list(iter_jsonl(tmp_path / "synth.jsonl.zst"))) == 3


def tokenizer_of(info: dict):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(info["model_path"])


@pytest.mark.server
@pytest.mark.slow  # the synth stage's own server, under a thinking template
def test_the_thinking_run_on_vllm_cpu(tmp_path, target_json):
    """benchmarks/thinking_check.py in small: the synth stage of its config
    (benchmarks/configs/thinking_cpu.yaml: the packaged SmolLM2 under a thinking template whose
    generation prompt opens <think>, answers split by vLLM's olmo3 parser on a real vllm-cpu
    server) on a few prompts, then the benchmark's own comparison of the two checks: the
    parser-marker check passes every record, the re-render check flags every one (the template
    drops a finished turn's reasoning). The full DAG run of the benchmark takes about 20
    minutes; what it adds (extraction, training, bench) is tested elsewhere."""
    import importlib.util
    import json

    from eagle3_pipeline.config import load_files
    from eagle3_pipeline.runtime.files import iter_jsonl, write_jsonl_zst
    from eagle3_pipeline.target.stage import copy_chat_template, load_info

    repo = Path(__file__).resolve().parents[1]
    path = repo / "benchmarks" / "thinking_check.py"
    spec = importlib.util.spec_from_file_location("thinking_check", path)
    thinking_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(thinking_check)
    cfg = load_files([repo / thinking_check.CONFIG])
    run = tmp_path / "run"
    template = repo / cfg["target"]["chat_template"]
    info = {**load_info(target_json), **copy_chat_template({"chat_template": str(template)}, run)}
    (run / "target").mkdir(parents=True)
    (run / "target" / "target.json").write_text(json.dumps(info))
    questions = ["What is 7 times 8?", "Name a primary color.", "Is 9 a prime number?"]
    prompts = [
        {"id": f"t:{i}", "source": "t", "messages": [{"role": "user", "content": q}]}
        for i, q in enumerate(questions)
    ]
    write_jsonl_zst(tmp_path / "prompts.jsonl.zst", prompts)
    synth_cfg = {**cfg["synth"], "max_tokens": 64, "concurrency": 3}
    stats = synth.run(
        run / "target" / "target.json",
        tmp_path / "prompts.jsonl.zst",
        run / "synth" / "synth.jsonl.zst",
        run / "synth" / "stats.json",
        synth_cfg,
        cfg["vllm"],
        tmp_path / ".partial",
        tmp_path / "synth.log",
    )
    assert stats["samples_ok"] == 3 and stats["reasoning_parser"] == "olmo3"
    check = stats["template_check"]
    assert check["text_mismatches"] == 0 and check["markers"] == ["<think>", "</think>"]
    records = list(iter_jsonl(run / "synth" / "synth.jsonl.zst"))
    assert any(r["reasoning"] for r in records)  # the parser split thinking from the answers
    compared = thinking_check.compare_checks(run, synth_cfg)
    assert compared["marker_check"] == {"ok": 3}
    assert compared["rerender_check"] == {"text": 3}
