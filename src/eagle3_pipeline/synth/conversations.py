"""On-policy multi-turn synth (``synth.context: on_policy``): every assistant turn in the
context of a request is the target's own earlier answer.

A prompt of a source that keeps conversations (``multi_turn``, ``each_turn``) holds the data
set's assistant turns as context: the target continues a conversation another model had
(off-policy). Here a conversation's user turns are answered in order, turn k+1 asked with the
target's answers to turns 1..k in place of the data set's. speculators measured what it buys
(full-sequence acceptance): 0.280 trained on off-policy contexts, 0.374 with single turns
regenerated, 0.405 with multi-turn contexts regenerated.

Conversations (:func:`conversations`). The rows ``each_turn`` makes of one conversation,
``<row id>.t<k>`` with k user turns, are the turns of conversation ``<row id>``; any other row
is the last turn of a conversation of its own. A conversation's turns are the user-turn
prefixes of its longest row (:func:`eagle3_pipeline.prompts.user_turn_prefixes`). An earlier
turn the pool lacks (sampled out, a duplicate of another conversation's, held out for the
bench) is asked too, under the id it would have (``<conversation>.t<k>``), as context only:
its answer is journaled and reused, never written as a record.

What an earlier answer puts in the context (:func:`with_answers`): its ``content`` as the
server returned it, which is what a chat client sends back, and not its reasoning. The chat
templates of thinking models drop (Qwen3, DeepSeek-R1) or empty (Kimi-K2) the reasoning of the
turns before the last user message, so sending it would change nothing they render, and without
it the record's messages stay in the prompt row schema (role and content) that the template
check and prepare read. A content that still holds its thinking block (a thinking target
without ``synth.reasoning_parser``) goes back as it is, for the template to render as it would
in serving.

Order and resumes (:func:`walk`): a turn is asked only once every turn before it has its
answer journaled, with messages built from those answers. Its journal key
(:func:`.answers.prompt_key`) holds those messages, so an earlier answer that changes (asked
again under other settings) makes the later turns' answers not count and they are asked again,
and a resumed run asks a turn with the context it had (the same answers: the same bytes). A
turn after one that was rejected, failed or answered with no content is not asked: it is
skipped, counted by reason (:data:`SKIPPED_AFTER`). A conversation lives in one part
(:func:`.answers.part_of` of its id), so one job asks its turns, one after the other, while
other conversations run beside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..prompts.rows import user_turn_prefixes

# The id each_turn gives the k-th user turn of a row: <row id>.t<k>
TURN_ID = re.compile(r"(?P<conversation>.+)\.t(?P<turn>[1-9][0-9]*)")
# Why a turn is not asked: what became of an earlier turn of its conversation
SKIPPED_AFTER = {
    "rejected": "skipped_after_rejected_turn",
    "failed": "skipped_after_failed_turn",
    "empty": "skipped_after_empty_answer",
}


class ConversationError(ValueError):
    """Rows that claim to be turns of one conversation but are not."""


@dataclass(frozen=True)
class Turn:
    id: str
    messages: list[dict]  # as the data set has them: the context holds its assistant turns
    sample: bool  # a prompt of the pool (written as a record), not only context for later turns


@dataclass(frozen=True)
class Conversation:
    id: str
    source: str | None
    turns: tuple[Turn, ...]


def user_turns(messages: list[dict]) -> int:
    return sum(m["role"] == "user" for m in messages)


def conversation_of(prompt: dict) -> tuple[str, int]:
    """``(conversation id, turn number)`` of a row of the prompt pool."""
    turn = user_turns(prompt["messages"])
    named = TURN_ID.fullmatch(prompt["id"])
    if named and int(named["turn"]) == turn:
        return named["conversation"], turn
    return prompt["id"], turn


def conversations(prompts: list[dict]) -> list[Conversation]:
    """The conversations of the pool's rows, in the order their first row comes in the pool.
    :class:`ConversationError` where rows of one conversation disagree on its earlier turns."""
    rows: dict[str, dict[int, dict]] = {}
    for p in prompts:
        cid, turn = conversation_of(p)
        held = rows.setdefault(cid, {}).get(turn)
        if held is not None:
            raise ConversationError(
                f"prompts {held['id']!r} and {p['id']!r} are both turn {turn} of conversation "
                f"{cid!r}: give the rows of a file source ids that do not end in .t<k>"
            )
        rows[cid][turn] = p
    pool_ids = {p["id"] for p in prompts}
    out = []
    for cid, by_turn in rows.items():
        longest = by_turn[max(by_turn)]
        turns = []
        for k, messages in enumerate(user_turn_prefixes(longest["messages"]), 1):
            row = by_turn.get(k)
            if row is not None and row["messages"] != messages:
                raise ConversationError(
                    f"prompts {row['id']!r} and {longest['id']!r} are turns of conversation "
                    f"{cid!r} but differ in its first {k} user turns"
                )
            tid = row["id"] if row is not None else f"{cid}.t{k}"
            if row is None and tid in pool_ids:
                raise ConversationError(
                    f"prompt {tid!r} is not turn {k} of conversation {cid!r}, whose turn "
                    "would have that id: give the rows of a file source ids that do not end "
                    "in .t<k>"
                )
            if user_turns(messages) - 1 != sum(m["role"] == "assistant" for m in messages):
                raise ConversationError(
                    f"prompt {longest['id']!r}: its user and assistant turns do not alternate"
                )
            turns.append(Turn(tid, messages, sample=row is not None))
        out.append(Conversation(cid, longest.get("source"), tuple(turns)))
    return out


def with_answers(messages: list[dict], answers: list[str]) -> list[dict]:
    """``messages`` with the target's ``answers`` in place of its assistant turns, in order."""
    if sum(m["role"] == "assistant" for m in messages) != len(answers):
        raise ValueError(f"{len(answers)} answers for the assistant turns of {messages!r:.200}")
    given = iter(answers)
    return [
        {"role": "assistant", "content": next(given)} if m["role"] == "assistant" else m
        for m in messages
    ]


@dataclass(frozen=True)
class Walk:
    """How far a conversation has come."""

    asked: tuple[dict, ...]  # each turn reached: its prompt, as it is asked (on-policy context)
    next: dict | None  # the first turn reached without an entry: the one to ask now
    skipped: dict[str, str]  # turn id -> why it is not asked (SKIPPED_AFTER)


def walk(conv: Conversation, entry_of: Callable[[dict], dict | None]) -> Walk:
    """Follow ``conv`` turn by turn while each has an answer (``entry_of(prompt)``: the journal
    entry that counts for a prompt as asked, None without one), building each turn's prompt
    from the answers before it."""
    asked, answers = [], []
    for i, turn in enumerate(conv.turns):
        prompt = {
            "id": turn.id,
            "source": conv.source,
            "messages": with_answers(turn.messages, answers),
        }
        asked.append(prompt)
        entry = entry_of(prompt)
        if entry is None:
            return Walk(tuple(asked), prompt, {})
        content = entry.get("content") or ""
        if entry["status"] != "ok" or not content.strip():
            reason = SKIPPED_AFTER["empty" if entry["status"] == "ok" else entry["status"]]
            return Walk(tuple(asked), None, {t.id: reason for t in conv.turns[i + 1 :]})
        answers.append(content)
    return Walk(tuple(asked), None, {})


def resolve(
    convs: Iterable[Conversation], entry_of: Callable[[dict], dict | None]
) -> tuple[list[dict], dict[str, str]]:
    """Every turn reached, as asked (context-only turns included), and why each turn not asked
    is skipped; a turn after one with no entry is neither (it is missing)."""
    asked: list[dict] = []
    skipped: dict[str, str] = {}
    for conv in convs:
        w = walk(conv, entry_of)
        asked += w.asked
        skipped.update(w.skipped)
    return asked, skipped
