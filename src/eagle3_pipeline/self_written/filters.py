"""Which user turns the target wrote are kept: a turn that is not a request a user would send is
removed, and counted by reason (:data:`REASONS`, in the order they are tried). Length is
the pool's rule (``prompts.max_chars``), as for every source.

A small model's written turns are mostly requests ("Can you provide a Python function that
..."); the rest runs on to the token limit, switches script mid-word, repeats itself, or
answers instead of asking. The rules are fixed: thresholds nobody tunes, each with the failure
it catches.
"""

from __future__ import annotations

import re
import unicodedata

from ..prompts.dedup import words

REASONS = (
    "unfinished",  # cut at the token limit: the writer never ended the turn
    "empty",
    "too_short",  # fewer than MIN_WORDS words and MIN_CHARS characters: "Hi", "Thanks"
    "template_leak",  # a role header or the template's markup inside the turn
    "reasoning",  # a thinking block's marker: the turn carries reasoning
    "answer_not_request",  # the writer answered (or refused) instead of asking
    "repetitive",  # loops: few distinct word trigrams
    "not_text",  # mostly symbols, digits or a script switch mid-word
)
MIN_WORDS = 3
MIN_CHARS = 12
MIN_DISTINCT_TRIGRAMS = 0.5  # of a turn's word trigrams (from 12 words on)
MIN_LETTER_FRACTION = 0.5  # letters among the non-space characters
# How assistants open an answer or a refusal; a user's request does not start so.
ANSWER_OPENINGS = re.compile(
    r"^\s*(sure|certainly|of course|absolutely|i'?m sorry|i am sorry|sorry,|as an ai|"
    r"i cannot|i can'?t help|i'?m unable|i am unable|here(?:'s| is| are) (?:a|an|the|some|your)|"
    r"great question|hello! how can i (?:help|assist))\b",
    re.IGNORECASE,
)
# Markup a written turn must not hold: chat-template role headers and special-token spellings.
TEMPLATE_MARKUP = re.compile(
    r"<\|[a-z_]+\|>|<\|im_(?:start|end)|\[/?INST\]|<start_of_turn>|<end_of_turn>|"
    r"^(?:user|assistant|system)\s*:?\s*$",
    re.IGNORECASE | re.MULTILINE,
)
EAST_ASIAN = {"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "HALFWIDTH", "FULLWIDTH"}
THINKING_MARKERS = ("<think>", "</think>", "◁think▷", "◁/think▷")


def problem(text: str, finish_reason: str | None, markers=()) -> str | None:
    """Why a written user turn is not kept (one of :data:`REASONS`), or None.
    ``markers``: the thinking markers of the target's reasoning parser, if it has one."""
    if finish_reason == "length":
        return "unfinished"
    stripped = text.strip()
    if not stripped:
        return "empty"
    w = words(stripped)
    if len(w) < MIN_WORDS and len(stripped) < MIN_CHARS:  # (characters: CJK has no spaces)
        return "too_short"
    if TEMPLATE_MARKUP.search(stripped):
        return "template_leak"
    if any(m and m in stripped for m in (*THINKING_MARKERS, *markers)):
        return "reasoning"
    if ANSWER_OPENINGS.match(stripped):
        return "answer_not_request"
    if len(w) >= 12:
        trigrams = list(zip(w, w[1:], w[2:], strict=False))
        if len(set(trigrams)) < MIN_DISTINCT_TRIGRAMS * len(trigrams):
            return "repetitive"
    visible = [c for c in stripped if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    if letters < MIN_LETTER_FRACTION * len(visible) or mixed_scripts(stripped):
        return "not_text"
    return None


def script_of(c: str) -> str:
    """A letter's script, from its Unicode name (LATIN, CYRILLIC, ARABIC, ...); the scripts
    Japanese and Korean mix within a word count as one."""
    script = unicodedata.name(c, "UNKNOWN").split()[0]
    return "CJK" if script in EAST_ASIAN else script


def mixed_scripts(text: str) -> bool:
    """Words that switch script inside themselves (``cultureيرة``): the decoding of a small
    model that has lost the thread, not a language."""
    for token in text.split():
        letters = [c for c in token if c.isalpha()]
        if len(letters) >= 2 and len({script_of(c) for c in letters}) > 1:
            return True
    return False
