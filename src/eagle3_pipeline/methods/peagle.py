"""P-EAGLE (parallel EAGLE): EAGLE-3's head trained to draft all k tokens in one forward pass,
from the last accepted token and mask tokens, with Conditional-On-Distribution sampling of
the training positions (speculators ``models/peagle/``). vLLM serves it as an EAGLE-3 drafter
with parallel drafting (``transformers_utils/configs/speculators/base.py`` maps
``speculators_model_type: peagle`` to ``method: eagle3, parallel_drafting: true``;
``algos.py``'s ``update_peagle`` makes its ``mask_token_id`` the ``pard_token`` and reads
``norm_before_fc``, not ``norm_output``). Its keys are ``train.peagle.*``."""

from __future__ import annotations

from typing import Any, ClassVar

from .base import Check, Method, chained_position_tau


class PEagle(Method):
    name = "peagle"
    title = "P-EAGLE"
    own_keys = (
        "num_layers",
        "num_depths",
        "down_sample_ratio",
        "down_sample_ratio_min",
        "max_anchors",
        "mask_token_id",
        "norm_before_fc",
    )
    # the GPU value is speculators' default; on the CPU fewer depths keep a step small
    auto: ClassVar[dict[str, tuple[Any, Any]]] = {"num_depths": (4, 8)}
    aux_key = "eagle_aux_hidden_state_layer_ids"
    aux_count_key = "num_aux_hidden_states"
    best_by = ("loss", False)
    accuracy_series = (("position_acc", "depth {}"),)
    position_label = "depth"
    depth_key, depth_bound = "num_depths", "num_depths"

    def max_speculative_tokens(self, cfg: dict[str, Any]) -> int | None:
        """The depths it was trained for: a deeper slot was never trained."""
        return int(self.resolve_auto(cfg)["num_depths"])

    def trainer_fields(self, cfg: dict[str, Any]) -> dict[str, Any]:
        c = self.resolve_auto(cfg)
        n = int(c["num_layers"])
        fields = {
            "speculator_type": self.name,
            "draft_arch": "llama",
            "num_layers": n,
            "norm_before_fc": bool(c["norm_before_fc"]),
            # vLLM's P-EAGLE model has no output norm (update_peagle does not read the flag)
            "norm_output": False,
            "full_attention_indices": list(range(n)) if c.get("sliding_window") is None else [],
            "num_depths": int(c["num_depths"]),
            "down_sample_ratio": float(c["down_sample_ratio"]),
            "down_sample_ratio_min": float(c["down_sample_ratio_min"]),
        }
        if c.get("max_anchors") is not None:
            fields["max_anchors"] = int(c["max_anchors"])
        if c.get("mask_token_id") is not None:
            fields["mask_token_id"] = int(c["mask_token_id"])
        return fields

    def positions(self, trainer: dict[str, Any]) -> int:
        return int(trainer["num_depths"])

    def metric_keys(self, n: int) -> dict[str, str | list[str]]:
        # models/peagle/metrics.py: depth d's accuracy is position_{d}_acc, d from 0
        return {
            "loss": "loss",
            "accuracy": "full_acc",
            "position_acc": [f"position_{d}_acc" for d in range(n)],
        }

    def prediction(self, val: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
        """The accuracy per depth."""
        return {"method": self.name, "position_acc": val.get("position_acc") or []}

    def predicted_acceptance_length(self, pred: dict[str, Any], k: int) -> float | None:
        """Chained over the per-depth accuracies, which are not conditional on the earlier
        depths being right (an estimate)."""
        return chained_position_tau(pred, k)

    def drafter_checks(self, config: dict[str, Any]) -> tuple[dict[str, Any], list[Check]]:
        layer_cfg = config.get("transformer_layer_config", {})
        proposals = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
        mask = config.get("mask_token_id")
        vocab = int(layer_cfg.get("vocab_size") or 0)
        facts = {"mask_token_id": mask, "num_depths": proposals[0].get("speculative_tokens")}
        checks = [
            (
                "mask_token_set",
                isinstance(mask, int) and 0 <= mask < vocab,
                f"mask_token_id {mask!r} is not a token of the target's vocabulary ({vocab}): "
                "vLLM drafts the parallel slots with it",
            ),
            (
                "no_output_norm",
                not config.get("norm_output", False),
                "norm_output is true: vLLM's P-EAGLE model applies no output norm",
            ),
        ]
        return facts, checks

    def drafter_max_tokens(self, facts: dict[str, Any]) -> int | None:
        return facts.get("num_depths")

    def speculative_config(self) -> dict[str, Any]:
        return {"method": "eagle3", "parallel_drafting": True}

    def shape(self, trainer: dict[str, Any]) -> str:
        return f"{trainer.get('num_layers')} Llama layer(s), {trainer.get('num_depths')} depths"


METHOD = PEagle()
