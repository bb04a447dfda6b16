"""The conversations a ``self_written`` source has the target write, and how far each came.

Conversation ``i`` of ``writes`` (id ``str(i)``) is seeded with a system prompt chosen by a
hash of the seed and its id (:func:`system_prompt`; none without ``system_prompts`` and
``topics``, and the template's default then applies). Its steps alternate::

    w1: the target writes user turn 1 after [system]
    a1: the target answers [system, u1]                 (turns > 1 only)
    w2: the target writes user turn 2 after [system, u1, a1]
    ...
    wT: the last user turn (synth answers it)

Each step is one request, journaled under its id (``<conversation>.w<k>``, ``.a<k>``) and its
messages (:func:`..synth.answers.prompt_key`), so a resumed run asks each step once and with the
context it had. A conversation stops at a written turn that is not kept (:mod:`.filters`) or an
answer without content: the turns before it stay. Its rows are its kept turns, each with the
turns before it as context and without the system prompt that seeded it: ``<conversation>`` for
single-turn sources, ``<conversation>.t<k>`` otherwise (the ids ``each_turn`` gives, so
``synth.context: on_policy`` reads them as one conversation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..runtime.files import sha256_bytes
from .filters import problem

# The system prompt a conversation gets from `topics` when no system prompt names one.
TOPIC_PROMPT = "You are a helpful assistant. The user asks you about {topic}."
TOPIC = "{topic}"


def _pick(seed: int, cid: str, what: str, n: int) -> int:
    return int(sha256_bytes(f"{seed}/{cid}/{what}".encode())[:8], 16) % n


def system_prompt(spec: dict, seed: int, cid: str) -> str | None:
    """The system prompt that seeds conversation ``cid``: one of ``system_prompts`` (one of
    ``topics`` in place of its ``{topic}``), or :data:`TOPIC_PROMPT` with a topic."""
    prompts, topics = spec.get("system_prompts") or [], spec.get("topics") or []
    if not prompts and not topics:
        return None
    text = prompts[_pick(seed, cid, "system", len(prompts))] if prompts else TOPIC_PROMPT
    if topics and TOPIC in text:
        text = text.replace(TOPIC, topics[_pick(seed, cid, "topic", len(topics))])
    return text


@dataclass(frozen=True)
class Conversation:
    id: str
    system: str | None
    turns: int

    def head(self) -> list[dict]:
        return [] if self.system is None else [{"role": "system", "content": self.system}]


def conversations(spec: dict, seed: int) -> list[Conversation]:
    return [
        Conversation(str(i), system_prompt(spec, seed, str(i)), spec["turns"])
        for i in range(spec["writes"])
    ]


@dataclass(frozen=True)
class Walk:
    """How far a conversation came: its kept user turns and the answers between them, the
    next step to ask (None when it is done), and why it stopped early (None if it did not)."""

    turns: list[str]
    answers: list[str]
    next: dict | None
    stopped: str | None
    written: list[tuple[str, str | None]]  # each written turn and why it is not kept


def write_step(conv: Conversation, k: int, turns: list[str], answers: list[str]) -> dict:
    messages = conv.head()
    for u, a in zip(turns, answers, strict=True):
        messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    return {"id": f"{conv.id}.w{k}", "step": "write", "messages": messages}


def answer_step(conv: Conversation, k: int, turns: list[str], answers: list[str]) -> dict:
    messages = write_step(conv, k, turns[:-1], answers)["messages"]
    return {
        "id": f"{conv.id}.a{k}",
        "step": "answer",
        "messages": [*messages, {"role": "user", "content": turns[-1]}],
    }


def walk(conv: Conversation, entry_of: Callable[[dict], dict | None], markers: tuple = ()) -> Walk:
    """Follow ``conv`` step by step while each has its entry (``entry_of(step)``: the journal
    entry that counts for it, None without one)."""
    turns: list[str] = []
    answers: list[str] = []
    written: list[tuple[str, str | None]] = []
    for k in range(1, conv.turns + 1):
        step = write_step(conv, k, turns, answers)
        entry = entry_of(step)
        if entry is None:
            return Walk(turns, answers, step, None, written)
        if entry["status"] != "ok":
            return Walk(turns, answers, None, f"write_{entry['status']}", written)
        text = entry["content"]
        why = problem(text, entry.get("finish_reason"), markers)
        written.append((text, why))
        if why:
            return Walk(turns, answers, None, why, written)
        turns.append(text.strip())
        if k == conv.turns:
            break
        step = answer_step(conv, k, turns, answers)
        entry = entry_of(step)
        if entry is None:
            return Walk(turns, answers, step, None, written)
        if entry["status"] != "ok" or not (entry.get("content") or "").strip():
            reason = "answer_empty" if entry["status"] == "ok" else f"answer_{entry['status']}"
            return Walk(turns, answers, None, reason, written)
        answers.append(entry["content"])
    return Walk(turns, answers, None, None, written)


def rows(conv: Conversation, w: Walk) -> list[dict]:
    """The pool rows of a walked conversation: one per kept user turn with an answer to every
    turn before it."""
    out = []
    for k in range(1, len(w.turns) + 1):
        if k - 1 > len(w.answers):
            break
        messages = []
        for u, a in zip(w.turns[: k - 1], w.answers, strict=False):
            messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": w.turns[k - 1]})
        rid = conv.id if conv.turns == 1 else f"{conv.id}.t{k}"
        out.append({"id": rid, "messages": messages})
    return out
