"""A conversation as the target sees it: its tokenizer, its chat template (the target's own or
target.chat_template), and how many prompt tokens a conversation is, against what the context
leaves for the answer (:class:`ContextLimit`).

A vLLM server refuses a request whose prompt and ``max_tokens`` together exceed
``vllm.max_model_len``; the prompts stage and the bench stage count with the same tokenizer and
template as the server, so such a prompt is found before any server starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .stage import chat_template_text, load_info


def load_tokenizer(info: dict):
    """The target's tokenizer (``info``: target.json's content)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        info["model_path"], trust_remote_code=info.get("trust_remote_code")
    )


def render_ids(tokenizer, messages: list[dict], kwargs: dict, **extra) -> list[int]:
    """The token ids of ``messages`` rendered by the chat template (``kwargs``: its variables;
    ``extra``: apply_chat_template's own arguments, None meaning its default)."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs, **_drop_none(extra))
    if hasattr(out, "keys"):  # BatchEncoding in transformers 5
        out = out["input_ids"]
    return list(out)


def render_text(tokenizer, messages: list[dict], kwargs: dict, **extra) -> str:
    """``messages`` rendered by the chat template, as text (arguments as :func:`render_ids`)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs, **_drop_none(extra))


def _drop_none(extra: dict) -> dict:
    # chat_template=None means "the tokenizer's own"; not every transformers accepts None
    return {k: v for k, v in extra.items() if v is not None}


@dataclass(frozen=True)
class ContextLimit:
    """At most ``max_tokens`` prompt tokens (the conversation rendered with the generation
    prompt, as the server renders it), so that the answer fits the context; ``why`` names the
    config keys that set it, ``answer_key`` the one that gives the answer its room."""

    tokenizer: Any
    chat_template: str | None
    template_kwargs: dict
    max_tokens: int
    why: str
    answer_key: str
    answer_tokens: int = 0  # the most tokens an answer takes (a later turn's context holds them)

    def tokens(self, messages: list[dict]) -> int:
        return len(
            render_ids(
                self.tokenizer,
                messages,
                self.template_kwargs,
                add_generation_prompt=True,
                chat_template=self.chat_template,
            )
        )

    def fix(self) -> str:
        """What a user can do about prompts over the limit."""
        return (
            f"raise vllm.max_model_len or lower {self.answer_key}, or leave the longest prompts "
            "out (prompts.max_chars)"
        )


def context_limit(
    target_json, max_model_len: int, answer_key: str, answer_tokens: int, template_kwargs: dict
) -> ContextLimit:
    """The limit on a prompt of the target of ``target_json`` for answers of up to
    ``answer_tokens`` (config key ``answer_key``) in ``vllm.max_model_len``."""
    info = load_info(target_json)
    limit = max_model_len - answer_tokens
    if limit < 1:
        raise ValueError(
            f"{answer_key} = {answer_tokens} leaves no room for a prompt in vllm.max_model_len "
            f"= {max_model_len}: raise vllm.max_model_len or lower {answer_key}"
        )
    return ContextLimit(
        tokenizer=load_tokenizer(info),
        chat_template=chat_template_text(info),
        template_kwargs=dict(template_kwargs or {}),
        max_tokens=limit,
        why=f"vllm.max_model_len {max_model_len} - {answer_key} {answer_tokens}",
        answer_key=answer_key,
        answer_tokens=answer_tokens,
    )
