"""The synth template check under the real chat templates of Qwen3, DeepSeek-R1 (both revisions)
and Kimi-K2-Thinking (tests/data/templates, with their sources), with vLLM's reasoning parser of
each family. The tokenizer is the packaged one with each family's special tokens added (its
turn markers and end of turn as special tokens, <think> and </think> as single tokens, as the
families' tokenizers have them): the templates and the parsers are the real ones, the
vocabulary is not, which changes no text the check compares."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagle3_pipeline.synth import check as reasoning

# the conversation and answer the hand-written templates are checked with
from test_reasoning_check import CONTENT, HISTORY, REASONING

TEMPLATES = Path(__file__).parent / "data" / "templates"


def deepseek(name: str) -> str:
    """A DeepSeek special token: its name between '<' + U+FF5C (a fullwidth bar) and the same
    bar + '>'."""
    return f"<\uff5c{name}\uff5c>"


DEEPSEEK_BOS, DEEPSEEK_EOS = deepseek("begin▁of▁sentence"), deepseek("end▁of▁sentence")
DEEPSEEK_TOKENS = (DEEPSEEK_BOS, DEEPSEEK_EOS, deepseek("User"), deepseek("Assistant"))
KIMI_TOKENS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>")


@dataclass(frozen=True)
class Family:
    template: str  # file of tests/data/templates
    parser: str  # vLLM's --reasoning-parser
    special: tuple[str, ...]  # the special tokens the template writes
    end_of_turn: str
    completion: str  # what the model writes after the generation prompt
    block: str  # who opens the thinking block: block_state of the generation prompt
    drops_reasoning: bool  # a finished turn is rendered without the reasoning the model wrote
    bos: str | None = None


FAMILIES = {
    # Qwen3 keeps the reasoning of the last turn; the model opens <think> itself.
    "qwen3": Family(
        "qwen3.jinja",
        "qwen3",
        ("<|im_start|>", "<|im_end|>"),
        "<|im_end|>",
        f"<think>\n{REASONING}\n</think>\n\n{CONTENT}",
        "none",
        drops_reasoning=False,
    ),
    # DeepSeek-R1 now: the generation prompt opens <think>, the model writes only </think>.
    "deepseek_r1": Family(
        "deepseek-r1.jinja",
        "deepseek_r1",
        DEEPSEEK_TOKENS,
        DEEPSEEK_EOS,
        f"{REASONING}\n</think>\n\n{CONTENT}",
        "open",
        drops_reasoning=True,
        bos=DEEPSEEK_BOS,
    ),
    # DeepSeek-R1 as first published: the model opens <think> itself.
    "deepseek_r1_2025_01": Family(
        "deepseek-r1-2025-01.jinja",
        "deepseek_r1",
        DEEPSEEK_TOKENS,
        DEEPSEEK_EOS,
        f"<think>\n{REASONING}\n</think>\n\n{CONTENT}",
        "none",
        drops_reasoning=True,
        bos=DEEPSEEK_BOS,
    ),
    # Kimi-K2-Thinking renders a finished turn with an empty thinking block.
    "kimi_k2_thinking": Family(
        "kimi-k2-thinking.jinja",
        "kimi_k2",
        KIMI_TOKENS,
        "<|im_end|>",
        f"<think>{REASONING}</think>{CONTENT}",
        "none",
        drops_reasoning=True,
    ),
}


def template(family: Family) -> str:
    return (TEMPLATES / family.template).read_text()


@pytest.fixture(scope="module")
def family_tokenizer(tokenizer):
    """``family_tokenizer(family)``: the packaged tokenizer with the family's tokens."""
    made = {}

    def make(family: Family):
        if family.template not in made:
            tok = copy.deepcopy(tokenizer)
            tok.add_tokens(["<think>", "</think>"])
            tok.add_special_tokens({"additional_special_tokens": list(family.special)})
            if family.bos:
                tok.bos_token = family.bos
            made[family.template] = tok
        return made[family.template]

    return make


def record(tok, family: Family, completion: str, kwargs=None, **extra) -> dict:
    """A record as synth stores it: the ids the server rendered and produced, and the
    reasoning/content split its parser returned."""
    prompt = reasoning.render_ids(
        tok, HISTORY, kwargs or {}, add_generation_prompt=True, chat_template=template(family)
    )
    ids = tok.encode(completion, add_special_tokens=False)
    return {
        "id": "t:0",
        "messages": HISTORY,
        "prompt_token_ids": prompt,
        "completion_token_ids": [*ids, tok.convert_tokens_to_ids(family.end_of_turn)],
        "reasoning": REASONING,
        "content": CONTENT,
        "finish_reason": "stop",
        **extra,
    }


def check(tok, family: Family, rec: dict, kwargs=None):
    markers = reasoning.parser_markers(family.parser, tok)
    return reasoning.check_record(tok, rec, kwargs or {}, markers, template(family))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_correct_record_passes_under_the_real_template(name, family_tokenizer):
    family = FAMILIES[name]
    tok = family_tokenizer(family)
    markers = reasoning.parser_markers(family.parser, tok)
    assert (markers.start, markers.end) == ("<think>", "</think>")
    gen = reasoning.generation_prompt(tok, HISTORY, {}, template(family))
    assert reasoning.block_state(gen, markers) == family.block
    assert check(tok, family, record(tok, family, family.completion)) is None


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_rerender_check_is_right_only_where_the_template_keeps_the_reasoning(
    name, family_tokenizer
):
    """The check for targets without a reasoning parser re-renders the answer through the
    template: right under Qwen3's, a text mismatch on every record under DeepSeek-R1's (which
    drops a finished turn's reasoning) and Kimi-K2-Thinking's (which empties it)."""
    family = FAMILIES[name]
    tok = family_tokenizer(family)
    rec = record(tok, family, family.completion)
    problem = reasoning.rerender_check(tok, rec, {}, template(family))
    assert (problem is not None and problem["kind"] == "text") == family.drops_reasoning


# What a model or a server could produce instead of the family's completion, and the cause the
# check names: the wrapper stripped, the reasoning outside or after the block, the block doubled.
BROKEN = {
    "qwen3": [
        ("markers_missing", f"{REASONING}\n\n{CONTENT}"),
        ("outside", f"{REASONING}<think>\n</think>\n\n{CONTENT}"),
        ("fields", f"<think>\n</think>\n\n{REASONING} {CONTENT}"),
        ("doubled", f"<think><think>\n{REASONING}\n</think></think>\n\n{CONTENT}"),
    ],
    "deepseek_r1": [
        ("markers_missing", f"{REASONING}\n\n{CONTENT}"),
        ("fields", f"</think>\n\n{REASONING} {CONTENT}"),
        ("doubled", f"<think>\n{REASONING}\n</think>\n\n{CONTENT}"),  # the prompt opened it
    ],
    "deepseek_r1_2025_01": [
        ("markers_missing", f"{REASONING}\n\n{CONTENT}"),
        ("unclosed", f"{REASONING}\n</think>\n\n{CONTENT}"),  # the prompt did not open it
        ("doubled", f"<think><think>\n{REASONING}\n</think>\n\n{CONTENT}"),
    ],
    "kimi_k2_thinking": [
        ("markers_missing", f"{REASONING}{CONTENT}"),
        ("outside", f"{REASONING}<think></think>{CONTENT}"),
        ("fields", f"<think></think>{REASONING} {CONTENT}"),
        ("doubled", f"<think><think>{REASONING}</think></think>{CONTENT}"),
    ],
}


@pytest.mark.parametrize(
    ("name", "cause", "completion"),
    [(name, cause, text) for name, cases in BROKEN.items() for cause, text in cases],
)
def test_a_broken_wrapper_fails_as_text_with_its_cause(name, cause, completion, family_tokenizer):
    family = FAMILIES[name]
    tok = family_tokenizer(family)
    problem = check(tok, family, record(tok, family, completion))
    assert problem is not None
    assert (problem["part"], problem["kind"], problem["cause"]) == ("completion", "text", cause)


def test_qwen3_with_thinking_switched_off_expects_an_answer_only(family_tokenizer):
    """enable_thinking=False: Qwen3's generation prompt holds an empty, closed block."""
    family = FAMILIES["qwen3"]
    tok = family_tokenizer(family)
    off = {"enable_thinking": False}
    markers = reasoning.parser_markers(family.parser, tok)
    gen = reasoning.generation_prompt(tok, HISTORY, off, template(family))
    assert (
        gen.endswith("<think>\n\n</think>\n\n") and reasoning.block_state(gen, markers) == "closed"
    )
    answer = record(tok, family, CONTENT, off, reasoning=None)
    assert check(tok, family, answer, off) is None
    again = record(tok, family, family.completion, off, reasoning=None)
    assert check(tok, family, again, off)["cause"] == "doubled"


def test_the_templates_are_the_documented_files():
    """Each template is described (source, revision, licence) and its sha256 listed in the
    README beside it, so a changed file is noticed."""
    import hashlib

    readme = (TEMPLATES / "README.md").read_text()
    files = sorted(p.name for p in TEMPLATES.glob("*.jinja"))
    assert files == sorted(f.template for f in FAMILIES.values())
    for name in files:
        digest = hashlib.sha256((TEMPLATES / name).read_bytes()).hexdigest()
        assert f"{digest}  {name}" in readme and f"| `{name}` |" in readme
