"""The synth template check: do a record's token ids say what its text fields say?

A record holds the ids the server saw (``prompt_token_ids``) and produced
(``completion_token_ids``), and the text the server returned (``content`` and, with a reasoning
parser, ``reasoning``). Training uses the ids; the check makes sure they belong to the
conversation and answer they are stored with:

- the prompt ids are the chat template's rendering of the messages with the generation prompt;
- without a reasoning parser, the ids of prompt and answer are a prefix of the rendering of the
  conversation with the answer appended (:func:`rerender_check`);
- with a reasoning parser, the completion decodes to the reasoning and the answer wrapped in the
  parser's markers exactly once (:func:`check_completion`), taking into account a generation
  prompt that already opens the thinking block. Re-rendering the answer through the template
  cannot work here: templates differ in what they do with a finished turn's reasoning (Qwen3
  keeps the last one, DeepSeek-R1 drops it, Kimi renders an empty thinking block) while the
  model produced the same ids.

A problem is a dict with ``part`` (prompt or completion), ``kind`` (``text`` when the text
differs, ``tokenization`` when the same text was split into other tokens) and, for a completion
with a reasoning parser, ``cause`` (:data:`CAUSES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..target.chat import render_ids, render_text

# What a failed check most likely means, per cause, in the words a user reads.
CAUSES = {
    "prompt": (
        "the prompt ids differ from the tokenizer's rendering of the messages: the server's chat "
        "template (or the tokenizer) is not the one the check renders with - serve and check "
        "with the same template (target.chat_template) and synth.chat_template_kwargs"
    ),
    "markers_missing": (
        "the server returned reasoning, but the completion ids hold none of the markers of "
        "synth.reasoning_parser: the parser does not match what this model writes (choose the "
        "parser of the model's family) or the stored ids lost the wrapper"
    ),
    "outside": (
        "the completion has text outside the thinking block (before its start marker): the "
        "chat template's generation prompt and the reasoning parser disagree on where the "
        "block starts"
    ),
    "doubled": (
        "the thinking block is opened or closed more than once (e.g. the generation prompt "
        "opens it and the model opens it again): the chat template and the reasoning parser "
        "disagree on who writes the start marker"
    ),
    "unclosed": (
        "an end marker without a start marker, in a completion whose generation prompt does "
        "not open the block: the chat template and the reasoning parser disagree on the markers"
    ),
    "rerender": (
        "the answer ids are not what the chat template renders for the answer: for a thinking "
        "target, set synth.reasoning_parser so that the check follows the thinking block "
        "instead of re-rendering the answer (templates drop or empty a finished turn's "
        "reasoning)"
    ),
    "fields": (
        "the markers are in place but the server's reasoning/content fields do not match the "
        "text between them: the server parses reasoning differently from "
        "synth.reasoning_parser (an external endpoint with another parser?) or rewrites the text"
    ),
}


@dataclass(frozen=True)
class Markers:
    """The strings that open and close the thinking block, as the parser knows them (None for
    a parser without fixed markers, e.g. gpt-oss's, which leaves parsing to harmony)."""

    parser: str
    start: str | None
    end: str | None


def parser_markers(name: str, tokenizer) -> Markers:
    """The markers of vLLM's reasoning parser ``name``, from the installed vLLM: the parser is
    built for ``tokenizer`` as the server builds it and asked for its
    ``reasoning_start_str``/``reasoning_end_str``."""
    from vllm.reasoning import ReasoningParserManager

    parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    return Markers(name, parser.reasoning_start_str, parser.reasoning_end_str)


# ---- rendering -------------------------------------------------------------------------------


def generation_prompt(tokenizer, messages: list[dict], kwargs: dict, chat_template=None) -> str:
    """The text the template appends for the assistant to answer (e.g. ``<|im_start|>assistant\\n``
    or, for a template that opens the thinking block itself, ``...assistant\\n<think>\\n``)."""
    with_prompt = render_text(
        tokenizer, messages, kwargs, add_generation_prompt=True, chat_template=chat_template
    )
    without = render_text(
        tokenizer, messages, kwargs, add_generation_prompt=False, chat_template=chat_template
    )
    common = 0
    for a, b in zip(with_prompt, without, strict=False):
        if a != b:
            break
        common += 1
    return with_prompt[common:]


def block_state(gen_prompt: str, markers: Markers) -> str:
    """``open`` when the generation prompt opens the thinking block (the model writes only the
    end marker), ``closed`` when it opens and closes it (thinking switched off, e.g. Qwen3's
    enable_thinking=False), else ``none``."""
    start = gen_prompt.rfind(markers.start)
    if start < 0:
        return "none"
    return "closed" if gen_prompt.rfind(markers.end) > start else "open"


# ---- the checks ------------------------------------------------------------------------------


def check_record(
    tokenizer,
    rec: dict,
    template_kwargs: dict,
    markers: Markers | None = None,
    chat_template: str | None = None,
) -> dict[str, Any] | None:
    """None when the record's ids agree with its messages and text; else the first problem.
    ``markers`` are those of the server's reasoning parser (None without one)."""
    problem = prompt_check(tokenizer, rec, template_kwargs, chat_template)
    if problem:
        return problem
    if markers is None:
        return rerender_check(tokenizer, rec, template_kwargs, chat_template, prompt_checked=True)
    gen = generation_prompt(tokenizer, rec["messages"], template_kwargs, chat_template)
    return check_completion(tokenizer, rec, markers, gen)


def prompt_check(tokenizer, rec: dict, template_kwargs: dict, chat_template=None):
    """None when the prompt ids are the rendering of the messages with the generation prompt
    (what the model saw); else the mismatch, with cause 'prompt'."""
    rendered = render_ids(
        tokenizer,
        rec["messages"],
        template_kwargs,
        add_generation_prompt=True,
        chat_template=chat_template,
    )
    prompt = rec["prompt_token_ids"]
    if rendered == prompt:
        return None
    return dict(mismatch(tokenizer, "prompt", rendered, prompt, rec["id"]), cause="prompt")


def rerender_check(
    tokenizer, rec: dict, template_kwargs: dict, chat_template=None, prompt_checked=False
) -> dict[str, Any] | None:
    """The check for targets without a reasoning parser: prompt and answer ids must be a prefix
    of the rendering of the conversation with the answer appended (what follows the
    end-of-turn token, e.g. a newline, is not generated). The answer is rendered with its
    reasoning in ``reasoning_content``, so for a thinking target this is right only for
    templates that re-wrap a finished turn's reasoning as the model wrote it."""
    prompt = rec["prompt_token_ids"]
    if not prompt_checked:
        problem = prompt_check(tokenizer, rec, template_kwargs, chat_template)
        if problem:
            return problem
    turn = {"role": "assistant", "content": rec["content"]}
    if rec.get("reasoning"):
        turn["reasoning_content"] = rec["reasoning"]
    full = render_ids(
        tokenizer, rec["messages"] + [turn], template_kwargs, chat_template=chat_template
    )
    produced = prompt + rec["completion_token_ids"]
    if full[: len(produced)] != produced:
        return dict(mismatch(tokenizer, "completion", full, produced, rec["id"]), cause="rerender")
    return None


def completion_text(tokenizer, ids: list[int], markers: Markers) -> str:
    """The completion as text with its markers, without the special tokens that end it
    (end of turn) or that the server's text leaves out."""
    keep = {markers.start, markers.end}
    special = {t for t in tokenizer.all_special_tokens if t not in keep}
    text = tokenizer.decode(ids, skip_special_tokens=False)
    for tok in special:
        text = text.replace(tok, "")
    return text


def check_completion(tokenizer, rec: dict, markers: Markers, gen_prompt: str) -> dict | None:
    """The completion decodes to reasoning and answer wrapped as the parser splits them."""
    text = completion_text(tokenizer, rec["completion_token_ids"], markers)
    reasoning = (rec.get("reasoning") or "").strip()
    content = (rec.get("content") or "").strip()

    def problem(cause: str, expected: str) -> dict:
        return {
            "id": rec["id"],
            "part": "completion",
            "kind": "text",
            "cause": cause,
            "block": state,
            "expected": _excerpt(expected),
            "stored": _excerpt(text),
        }

    if markers.start is None or markers.end is None:
        # A parser without fixed markers (gpt-oss's channels, parsed by harmony): the
        # completion must hold the reasoning, then the answer.
        state = "unmarked"
        at = text.find(reasoning) if reasoning else 0
        if at < 0 or text.find(content, at + len(reasoning)) < 0:
            return problem("fields", f"...{reasoning}...{content}...")
        return None

    start, end = markers.start, markers.end
    state = block_state(gen_prompt, markers)
    wrapped = f"{start}{reasoning}{end}{content}"
    if state == "closed":  # thinking switched off in the prompt: an answer only
        if start in text or end in text:
            return problem("doubled", content)
        return None if (not reasoning and text.strip() == content) else problem("fields", content)
    if state == "open":
        wrapped = wrapped[len(start) :]
        if start in text:
            return problem("doubled", wrapped)
        body = text
    else:
        lead, opened, body = text.partition(start)
        if not opened:
            if end in text:
                return problem("unclosed", wrapped)
            # No block at all: an answer without thinking, which the parser puts whole into
            # one of the two fields (which one differs between parsers).
            if reasoning and content:
                return problem("markers_missing", wrapped)
            return None if text.strip() == (reasoning or content) else problem("fields", wrapped)
        if lead.strip():
            return problem("outside", wrapped)
        if start in body:
            return problem("doubled", wrapped)
    if body.count(end) > 1:
        return problem("doubled", wrapped)
    if end not in body:
        # Cut by max_tokens (or stopped) inside the thinking block: all of it is one field.
        if reasoning and content:
            return problem("markers_missing", wrapped)
        return None if body.strip() == (reasoning or content) else problem("fields", wrapped)
    think, _, answer = body.partition(end)
    if think.strip() != reasoning or answer.strip() != content:
        return problem("fields", wrapped)
    return None


def _excerpt(text: str, n: int = 160) -> str:
    return text if len(text) <= n else f"{text[: n // 2]} ... {text[-n // 2 :]}"


def mismatch(tokenizer, part: str, rendered: list[int], stored: list[int], rid: str) -> dict:
    """Where rendering and stored ids part. ``kind`` tells the benign case (the same text,
    tokenized differently: models often emit non-canonical BPE splits) from a real one (the
    text differs, e.g. a stripped thinking wrapper)."""
    pos = next(
        (i for i, (a, b) in enumerate(zip(rendered, stored, strict=False)) if a != b),
        min(len(rendered), len(stored)),
    )
    lo = max(0, pos - 8)
    # The stored text must be a prefix of the rendering (which closes the turn); a length-cut
    # answer may end inside a multi-byte character, which decodes to U+FFFD.
    same_text = tokenizer.decode(rendered).startswith(tokenizer.decode(stored).rstrip("\ufffd"))
    return {
        "id": rid,
        "part": part,
        "kind": "tokenization" if same_text else "text",
        "position": pos,
        "rendered_len": len(rendered),
        "stored_len": len(stored),
        "rendered": tokenizer.decode(rendered[lo : pos + 8]),
        "stored": tokenizer.decode(stored[lo : pos + 8]),
    }


def explain(by_cause: dict[str, int]) -> str:
    """The likely cause of the most frequent failure, for the error message."""
    if not by_cause:
        return ""
    cause = max(by_cause, key=by_cause.get)
    return CAUSES.get(cause, cause)


def failure_message(
    failed: int, checked: int, causes: dict, examples: list, cfg: dict, work_dir
) -> str:
    """The message of a failed template check: what failed, its likely cause, and how to go on
    without asking for the answers again."""
    first = next((e for e in examples if e["kind"] == "text"), None)
    return (
        f"template check: {failed} of {checked} records differ in text from what their ids "
        f"say (by cause: {causes}), more than "
        f"synth.max_template_mismatch_fraction={cfg['max_template_mismatch_fraction']}.\n"
        f"Likely cause: {explain(causes)}.\n"
        f"First: {first}\n"
        f"The answers are kept in {work_dir}: re-running the same command asks "
        "for no answer again and repeats only this check. To accept the "
        "records as they are (training uses their ids), set "
        "synth.max_template_mismatch_fraction: 1.0 - it re-runs nothing else. Changing "
        "synth.reasoning_parser, synth.chat_template_kwargs or target.chat_template asks for "
        "every answer again."
    )
