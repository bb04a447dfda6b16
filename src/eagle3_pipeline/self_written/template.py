"""Where a user turn begins and ends in the target's own chat template.

The target writes a user turn when it is given its template up to the user's header (Magpie,
Xu et al. 2024): ``<|im_start|>user\\n`` for ChatML. Rather than a table of headers per model
family, the header is read off the template itself (:func:`user_turn`): the conversation so far
is rendered with one more user message whose content is a sentinel no text contains, and cut at
the sentinel. What the template puts after the sentinel closes a user turn; its first token,
where it is a special token (``<|im_end|>``, ``<|eot_id|>``), ends the request, else its text
does (``[/INST]``).

For a thinking target nothing of the reasoning reaches the prefix: it is cut before the
assistant's generation prompt (where a template opens its thinking block), and the earlier
answers of a conversation are given as their content only (:mod:`.stage`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..target.chat import render_text

# Private-use characters around a name: no chat template or prompt text contains them.
SENTINEL = "\ue000pipeline-user-turn\ue001"


class TemplateError(ValueError):
    """A chat template from which no user turn can be cut."""


@dataclass(frozen=True)
class UserTurn:
    """The text before a new user turn's content and how the turn ends."""

    prefix: str
    prefix_ids: list[int]
    stop_token_ids: list[int]
    stop: list[str]


def _special_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    ids |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return ids


def user_turn(tokenizer, messages: list[dict], kwargs: dict, chat_template=None) -> UserTurn:
    """The target's template for a user turn after ``messages`` (none: the first turn; the
    template's own default system prompt, if it has one, is then part of the prefix)."""
    turn = [*messages, {"role": "user", "content": SENTINEL}]
    text = render_text(
        tokenizer, turn, kwargs, add_generation_prompt=True, chat_template=chat_template
    )
    if text.count(SENTINEL) != 1:
        raise TemplateError(
            "the chat template does not render a user message's content as it is (a user "
            "turn cannot be cut from it): the target cannot write prompts"
        )
    prefix, closing = text.split(SENTINEL)
    ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    if not ids:
        raise TemplateError("the chat template renders nothing before a user message")
    first = tokenizer(closing, add_special_tokens=False)["input_ids"][:1]
    if first and first[0] in _special_ids(tokenizer):
        return UserTurn(prefix, list(ids), [first[0]], [])
    stop = closing.strip().split("\n")[0].strip()
    return UserTurn(prefix, list(ids), [], [stop] if stop else [])
