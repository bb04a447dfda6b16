"""What the bench stage measures, as a config says it: the prompt sets, the k values of a
drafter, the chat template variables of its requests."""

from __future__ import annotations

from ..prompts.selection import HELDOUT_SET


def bench_sets(cfg: dict) -> list[str]:
    """The benchmark prompt sets the bench stage measures: ``bench.prompt_sets``, then the
    held-out set when ``prompts.heldout`` > 0."""
    sets = list(cfg["bench"]["prompt_sets"])
    if cfg["prompts"]["heldout"] and HELDOUT_SET not in sets:
        sets.append(HELDOUT_SET)
    return sets


def speculative_tokens(cfg: dict, method: str) -> list[int]:
    """The k values (bench.num_speculative_tokens) the drafter of ``method`` is served with."""
    ks = cfg["bench"]["num_speculative_tokens"]
    return list(ks[method] if isinstance(ks, dict) else ks)


def bench_chat_template_kwargs(cfg: dict) -> dict:
    """The chat template variables of benchmark requests: bench.chat_template_kwargs, or
    synth.chat_template_kwargs where it is null (a thinking target measured as it is served)."""
    own = cfg["bench"].get("chat_template_kwargs")
    return dict(cfg["synth"]["chat_template_kwargs"] if own is None else own)
