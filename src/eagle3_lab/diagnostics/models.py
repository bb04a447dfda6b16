"""The target and the drafter as replay uses them: prompt ids, the target's hidden states and
greedy continuation (transformers), the exported drafter as speculators' model, which columns
of the target's states are its aux layers. Heavy imports stay inside functions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline import methods

from . import proposals
from .walk import ReplayError

# ---- the target: prompt ids, hidden states, greedy continuation --------------------------------


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt token ids vLLM's chat endpoint renders for ``messages`` (the bench stage
    sends no chat_template_kwargs): the chat template with the generation prompt, exactly as
    the synth stage's token-exact check renders them."""
    from eagle3_pipeline.target.chat import render_ids

    return render_ids(tokenizer, messages, {}, add_generation_prompt=True)


def target_states(model, ids: Sequence[int], layer_ids: Sequence[int]):
    """``[len(ids), len(layer_ids), hidden]`` float32 hidden states of ``ids`` as extraction
    stores them (aux id i < N: HF ``hidden_states[i]``; id N: the last decoder layer before the
    final norm), from :func:`eagle3_pipeline.hidden_states.checks.reference_hidden_states`."""
    import torch

    from eagle3_pipeline.hidden_states.checks import reference_hidden_states

    return torch.stack(reference_hidden_states(model, list(ids), list(layer_ids)), dim=1).float()


def greedy_continuation(model, ids: Sequence[int], n: int) -> list[int]:
    """The target's next ``n`` greedy tokens after ``ids``, not stopping at EOS (what vLLM's
    verification sees after the end of an output)."""
    import torch

    out: list[int] = []
    past = None
    x = torch.tensor([list(ids)], device=model.device)
    with torch.no_grad():
        for _ in range(n):
            o = model(x, past_key_values=past, use_cache=True)
            past = o.past_key_values
            t = int(o.logits[0, -1].argmax())
            out.append(t)
            x = torch.tensor([[t]], device=model.device)
    return out


# ---- the drafter: speculators' model classes -------------------------------------------------


def load_drafter(drafter_dir: str | Path, verifier_path: str | Path | None = None):
    """The exported drafter as speculators' model (its method's ``model_classes``),
    float32, eval mode, with SDPA attention (``from_pretrained`` picks flex attention, which
    fails on the CPU). Weights come from ``model.safetensors``; what checkpoints leave out
    (embed_tokens, the verifier's lm_head and norm) from the verifier, ``verifier_path``
    (default: the one in config.json). Any other missing or unexpected weight is an error."""
    from safetensors.torch import load_file

    from eagle3_pipeline.runtime.files import read_json

    drafter_dir = Path(drafter_dir)
    method = read_json(drafter_dir / "config.json").get("speculators_model_type")
    try:
        model_cls, config_cls = proposals.get(method).model_classes()
    except (ValueError, NotImplementedError):
        raise ReplayError(f"{drafter_dir}: cannot replay a {method!r} drafter") from None
    config = config_cls.from_pretrained(str(drafter_dir))
    if verifier_path is not None:
        config.speculators_config.verifier.name_or_path = str(verifier_path)
    verifier = config.speculators_config.verifier.name_or_path
    if not verifier or not (Path(verifier) / "config.json").is_file():
        raise ReplayError(
            f"{drafter_dir}: verifier {verifier!r} is not a model directory (pass the target)"
        )
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = model_cls(config)
    weights = load_file(str(drafter_dir / "model.safetensors"))
    if "d2t" in weights:
        model.load_vocab_mappings(weights["t2d"], weights["d2t"])
    missing, unexpected = model.load_state_dict(weights, strict=False)
    model.load_verifier_weights()
    allowed = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    if unexpected or set(missing) - allowed:
        raise ReplayError(
            f"{drafter_dir}: weights missing {sorted(set(missing) - allowed)}, unexpected "
            f"{sorted(unexpected)}"
        )
    model = model.float().eval().requires_grad_(False)  # no autograd graph, no global switch
    return model, method


def proposals_for(
    model,
    method: str,
    aux,
    ids: Sequence[int],
    first_output: int,
    k: int,
    block: int | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Proposals from every output position of ``ids`` (outputs start at ``first_output``)."""
    anchors = list(range(first_output, len(ids)))
    return proposals.get(method).proposals(model, aux, ids, anchors, k, block)


def aux_columns(method_config: dict[str, Any], layer_ids: Sequence[int]) -> list[int]:
    """Which columns of target states computed at ``layer_ids`` are the drafter's aux layers."""
    aux = method_config.get(methods.aux_key(method_config.get("speculators_model_type")))
    if not aux:
        raise ReplayError("the drafter's config.json names no aux layers")
    missing = [layer for layer in aux if layer not in layer_ids]
    if missing:
        raise ReplayError(f"aux layers {missing} were not computed")
    return [list(layer_ids).index(layer) for layer in aux]
