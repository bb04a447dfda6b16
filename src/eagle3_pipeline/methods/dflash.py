"""DFlash: a block drafter. Qwen3 decoder layers draft a whole block of ``block_size - 1``
tokens in one non-causal forward pass from the anchor token and mask tokens, conditioned on
the target's aux hidden states (speculators ``models/dflash/``; vLLM
``transformers_utils/configs/speculators/algos.py``, ``model_executor/models/qwen3_dflash.py``;
docs/methods.md). Its keys are ``train.dflash.*``.

It needs a ``mask_token_id``, is served with ``k <= block_size - 1``, and its attention inside
a block must be served as trained: vLLM applies ``causal = not sliding_window_non_causal`` to
every draft layer, while speculators trains full-attention layers bidirectionally whatever
that flag says, so with full attention (``train.sliding_window: null``) the flag must be true.
Validation reports per-position accuracies and ``eal`` (expected accepted length over the
block); the best checkpoint is the one with the highest ``eal`` (lowest validation loss and
acceptance do not move together under CE + D-PACE).
"""

from __future__ import annotations

from typing import Any, ClassVar

from .base import Check, Method, chained_position_tau

# speculators' DFlash recipe (cross-entropy with D-PACE position weights): fixed here so that
# the job file and the training fingerprint say what DFlash trains with (train.dflash.extra_args
# may still override them).
LOSS = {"loss_fn": "ce", "per_position_loss_weight": "dpace"}


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


class DFlash(Method):
    name = "dflash"
    title = "DFlash"
    own_keys = (
        "num_layers",
        "block_size",
        "max_anchors",
        "mask_token_id",
        "layer_ids",
        "epochs",
        "lr",
        "extra_args",
    )
    overrides = ("epochs", "lr")
    # the GPU values are speculators' defaults; the CPU ones keep a step small enough for a
    # 2-core machine (queries per step = anchors x block)
    auto: ClassVar[dict[str, tuple[Any, Any]]] = {"block_size": (8, 16), "max_anchors": (128, 512)}
    aux_key = "aux_hidden_state_layer_ids"
    best_by = ("eal", True)
    accuracy_series = (("position_acc", "block position {}"),)
    position_label = "block position"
    depth_key, depth_bound = "block_size", "block_size - 1"

    def max_speculative_tokens(self, cfg: dict[str, Any]) -> int | None:
        """block_size - 1: the anchor slot is the bonus token (vLLM does not check it)."""
        return int(self.resolve_auto(cfg)["block_size"]) - 1

    def trainer_fields(self, cfg: dict[str, Any]) -> dict[str, Any]:
        c = self.resolve_auto(cfg)
        n = int(c["num_layers"])
        full_attention = cfg.get("sliding_window") is None
        fields = {
            "speculator_type": self.name,
            "draft_arch": "qwen3",
            "num_layers": n,
            "full_attention_indices": list(range(n)) if full_attention else [],
            # speculators trains full-attention layers non-causally; vLLM serves every layer
            # causally unless this flag is set (module docstring)
            "sliding_window_non_causal": full_attention,
            "block_size": int(c["block_size"]),
            "max_anchors": int(c["max_anchors"]),
            **LOSS,
        }
        if c.get("mask_token_id") is not None:
            fields["mask_token_id"] = int(c["mask_token_id"])
        return fields

    def positions(self, trainer: dict[str, Any]) -> int:
        return int(trainer["block_size"]) - 1

    def metric_keys(self, n: int) -> dict[str, str | list[str]]:
        return {
            "loss": "loss",
            "accuracy": "full_acc",
            "position_acc": [f"position_{i}_acc" for i in range(1, n + 1)],
            "eal": "eal",
        }

    def prediction(self, val: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
        """The per-position accuracy and eal over its block."""
        return {
            "method": self.name,
            "block_size": int(trainer["block_size"]),
            "position_acc": val.get("position_acc") or [],
            "eal": val.get("eal"),
        }

    def predicted_acceptance_length(self, pred: dict[str, Any], k: int) -> float | None:
        """``eal`` when k drafts the whole block (k = block_size - 1, what it measures); for a
        shorter k, the chained per-position accuracies, which are not conditional (an
        estimate)."""
        if k == pred["block_size"] - 1 and pred.get("eal") is not None:
            return float(pred["eal"])
        return chained_position_tau(pred, k)

    def drafter_checks(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[Check]]:
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
                f"vLLM attends inside a block {'causally' if served[0] else 'bidirectionally'} "
                f"on every draft layer (causal per layer {served}), training did {trained}: "
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

    def drafter_max_tokens(self, facts: dict[str, Any]) -> int | None:
        block = facts.get("block_size")
        return block - 1 if block else None

    def serve_notes(self, facts: dict[str, Any], ks: list[int]) -> list[str]:
        """Served at a k below ``block_size - 1``, vLLM gives it k + 1 query slots (the bonus
        token and k mask tokens; ``_copy_and_expand_dflash_inputs``), where speculators
        trained ``block_size`` slots that attend to each other inside the block: its drafts at
        that k are not the ones it was trained to make (lab/drafter_replay.py measures the
        difference). Not an error (a shorter k can still pay), but not served as trained."""
        block = facts.get("block_size")
        if not block:
            return []
        return [
            f"k={k}: served with a block of {k + 1} query slots, trained with {block} that "
            "attend to each other; its drafts differ from the trained ones. To serve this k as "
            f"trained, train a variant with block_size {k + 1} (train.variants)"
            for k in ks
            if k < block - 1
        ]

    def shape(self, trainer: dict[str, Any]) -> str:
        return f"{trainer['num_layers']} Qwen3 layers, block {trainer['block_size']}"


METHOD = DFlash()
