"""What a drafter method's training reports and how its drafter is served and checked
(pure: no file access, no speculators or vLLM import): validation metrics, the best
checkpoint, the acceptance length validation predicts, the config key vLLM reads the aux layers
from, and DFlash's served-as-trained checks. What each method trains with:
:mod:`eagle3_pipeline.methods`."""

from __future__ import annotations

from typing import Any

# Where the drafter's config.json keeps the aux layer ids vLLM captures from the target.
AUX_KEY = {"eagle3": "eagle_aux_hidden_state_layer_ids", "dflash": "aux_hidden_state_layer_ids"}


def aux_key(method: str | None) -> str:
    """The aux layer ids' key in a ``method`` drafter's config.json (EAGLE-3's if unknown)."""
    return AUX_KEY.get(method or "eagle3", AUX_KEY["eagle3"])


# ---- validation metrics and what they predict -------------------------------------------------


def positions(method: str, trainer: dict[str, Any]) -> int:
    """Draft positions validation reports: TTT steps (EAGLE-3) or block slots (DFlash)."""
    return int(trainer["ttt_steps"]) if method == "eagle3" else int(trainer["block_size"]) - 1


def metric_keys(method: str, n: int) -> dict[str, str | list[str]]:
    """Per summary field, the speculators metric key(s) it comes from (``_epoch`` is appended
    for validation records): a list is one value per draft position."""
    if method == "eagle3":
        return {
            "loss": "loss",
            "loss_per_ttt_step": [f"loss_{k}" for k in range(n)],
            "full_acc": [f"full_acc_{k}" for k in range(n)],
            "cond_acc": [f"cond_acc_{k}" for k in range(n)],
        }
    return {
        "loss": "loss",
        "accuracy": "full_acc",
        "position_acc": [f"position_{i}_acc" for i in range(1, n + 1)],
        "eal": "eal",
    }


# Which checkpoint is exported: the validation metric and whether higher is better.
BEST_BY = {"eagle3": ("loss", False), "dflash": ("eal", True)}

# How the report and the loss plot show a method's validation accuracies: (field, label).
ACCURACY_SERIES = {
    "eagle3": (("full_acc", "TTT step {} full"), ("cond_acc", "TTT step {} conditional")),
    "dflash": (("position_acc", "block position {}"),),
}


def best_epoch(val_by_epoch: dict[int, dict[str, Any]], method: str) -> int | None:
    """The epoch whose validation is best by the method's rule (:data:`BEST_BY`); the first
    one on a tie. speculators' ``checkpoint_best`` link follows the lowest loss, which picks a
    worse DFlash drafter (its eal is what acceptance follows)."""
    key, higher = BEST_BY[method]
    scored = [(e, v.get(f"{key}_epoch")) for e, v in sorted(val_by_epoch.items())]
    scored = [(e, s) for e, s in scored if s is not None]
    if not scored:
        return None
    return (max if higher else min)(scored, key=lambda es: es[1])[0]


def prediction(method: str, val: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
    """What validation predicts about serving, stored in the drafter's metrics.json for the
    bench stage: EAGLE-3's conditional accuracy per TTT step; DFlash's per-position accuracy
    and eal over its block."""
    if method == "eagle3":
        return {
            "method": method,
            "cond_acc": [a for a in val.get("cond_acc") or [] if a is not None],
        }
    return {
        "method": method,
        "block_size": int(trainer["block_size"]),
        "position_acc": val.get("position_acc") or [],
        "eal": val.get("eal"),
    }


def predicted_acceptance_length(pred: dict[str, Any], k: int) -> float | None:
    """tau = 1 + expected accepted drafts at ``k``, from validation.

    EAGLE-3: 1 + sum_i prod_{j<=i} a_j over the conditional accuracies a_j of its TTT steps
    (positions beyond the trained steps reuse the last step's). DFlash: ``eal`` when k drafts
    the whole block (k = block_size - 1, what it measures); for a shorter k, the same sum over
    the per-position accuracies, which are not conditional (an estimate)."""
    if pred.get("method", "eagle3") == "dflash":
        if k == pred["block_size"] - 1 and pred.get("eal") is not None:
            return float(pred["eal"])
        acc = pred.get("position_acc") or []
        if len(acc) < k or any(a is None for a in acc[:k]):
            return None
    else:
        acc = pred.get("cond_acc") or []
        if not acc:
            return None
    tau, run = 1.0, 1.0
    for i in range(k):
        run *= acc[min(i, len(acc) - 1)]
        tau += run
    return tau


# ---- train/serve consistency of a DFlash drafter ------------------------------------------------


def trained_causal(layer_cfg: dict[str, Any], sliding_window_non_causal: bool) -> list[bool]:
    """Per draft layer, whether speculators trained attention inside a block causally
    (models/dflash/attention.py: non-causal when the layer has no window or
    ``sliding_window_non_causal``; core.py gives a window to ``sliding_attention`` layers)."""
    n = int(layer_cfg.get("num_hidden_layers", 1))
    types = layer_cfg.get("layer_types") or ["full_attention"] * n
    return [t == "sliding_attention" and not sliding_window_non_causal for t in types]


def served_causal(config: dict[str, Any]) -> list[bool]:
    """Per draft layer, whether vLLM attends causally inside the block: ``update_dflash``
    writes ``dflash_config.causal = not sliding_window_non_causal`` (a missing flag counts as
    true: non-causal), which qwen3_dflash.py applies to every layer."""
    n = int(config.get("transformer_layer_config", {}).get("num_hidden_layers", 1))
    return [not config.get("sliding_window_non_causal", True)] * n


def dflash_checks(config: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, bool, str]]]:
    """DFlash's own facts and checks on its config.json (the checks shared with EAGLE-3 are in
    :mod:`eagle3_pipeline.consistency`): ``(facts, [(name, ok, problem)])``."""
    layer_cfg = config.get("transformer_layer_config", {})
    proposals = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    block = config.get("block_size")
    mask = config.get("mask_token_id")
    types = layer_cfg.get("layer_types") or []
    trained = trained_causal(layer_cfg, bool(config.get("sliding_window_non_causal")))
    served = served_causal(config)
    facts = {
        "block_size": block,
        "mask_token_id": mask,
        "speculative_tokens": proposals[0].get("speculative_tokens"),
        "sample_from_anchor": config.get("sample_from_anchor"),
        "sliding_window_non_causal": config.get("sliding_window_non_causal"),
        "draft_decoder": layer_cfg.get("model_type"),
        "trained_causal_per_layer": trained,
        "served_causal_per_layer": served,
    }
    vocab = int(layer_cfg.get("vocab_size") or 0)
    checks = [
        (
            "causality_served_as_trained",
            trained == served,
            f"vLLM attends inside a block {'causally' if served[0] else 'bidirectionally'} on "
            f"every draft layer (causal per layer {served}), training did {trained}: "
            "sliding_window_non_causal must be true for full-attention draft layers",
        ),
        (
            "mask_token_set",
            isinstance(mask, int) and 0 <= mask < vocab,
            f"mask_token_id {mask!r} is not a token of the target's vocabulary ({vocab})",
        ),
        (
            "anchor_is_bonus_token",
            not config.get("sample_from_anchor", False),
            "sample_from_anchor is true: vLLM 0.26 ignores it and serves the anchor as the "
            "bonus token",
        ),
        (
            "speculative_tokens_is_block_minus_one",
            facts["speculative_tokens"] == (block or 0) - 1,
            f"speculative_tokens {facts['speculative_tokens']} is not block_size {block} - 1",
        ),
        (
            "draft_decoder_is_qwen3",
            facts["draft_decoder"] == "qwen3",
            f"draft decoder {facts['draft_decoder']!r}: vLLM's DFlash model is Qwen3's",
        ),
        (
            "not_mixed_attention",
            len(set(types)) <= 1,
            f"draft layers mix attention types {types}: vLLM's V1 runner refuses them",
        ),
    ]
    return facts, checks


def shorter_block_notes(block_size: int | None, ks: list[int]) -> list[str]:
    """What differs from training when a DFlash drafter of ``block_size`` is served at a k
    below ``block_size - 1``, one line per such k. vLLM gives it k + 1 query slots (the bonus
    token and k mask tokens; ``_copy_and_expand_dflash_inputs``), where speculators trained
    ``block_size`` slots that attend to each other inside the block: its drafts at that k
    are not the ones it was trained to make (benchmarks/drafter_replay.py measures the
    difference). Not an error (a shorter k can still pay), but not served as trained."""
    if not block_size:
        return []
    return [
        f"k={k}: served with a block of {k + 1} query slots, trained with {block_size} that "
        "attend to each other; its drafts differ from the trained ones. To serve this k as "
        f"trained, train a variant with block_size {k + 1} (train.variants)"
        for k in ks
        if k < block_size - 1
    ]
