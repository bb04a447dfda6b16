"""EAGLE-3: an autoregressive one-layer Llama head trained with test-time-training (TTT)
steps; vLLM drafts k tokens one after another (speculators ``models/eagle3/``; vLLM
``transformers_utils/configs/speculators/algos.py``; docs/methods.md). Its keys are
``train.eagle3.*``."""

from __future__ import annotations

from typing import Any

from .base import Check, Method, chained_tau


class Eagle3(Method):
    name = "eagle3"
    title = "EAGLE-3"
    own_keys = ("ttt_steps", "num_layers", "norm_before_fc", "norm_output")
    aux_key = "eagle_aux_hidden_state_layer_ids"
    aux_count_key = "num_aux_hidden_states"
    best_by = ("loss", False)  # what speculators' checkpoint_best link follows
    accuracy_series = (("full_acc", "TTT step {} full"), ("cond_acc", "TTT step {} conditional"))
    position_label = "TTT step"
    configured_flags = ("norm_before_fc", "norm_output")

    def trainer_fields(self, cfg: dict[str, Any]) -> dict[str, Any]:
        n = int(cfg["num_layers"])
        return {
            "speculator_type": self.name,
            "draft_arch": "llama",
            "num_layers": n,
            "norm_before_fc": bool(cfg["norm_before_fc"]),
            "norm_output": bool(cfg["norm_output"]),
            # speculators' default is a 2048 window on every draft layer; null means full
            # attention on every layer (the unused sliding_window keeps speculators' default)
            "full_attention_indices": list(range(n)) if cfg.get("sliding_window") is None else [],
            "ttt_steps": int(cfg["ttt_steps"]),
        }

    def positions(self, trainer: dict[str, Any]) -> int:
        return int(trainer["ttt_steps"])

    def metric_keys(self, n: int) -> dict[str, str | list[str]]:
        return {
            "loss": "loss",
            "loss_per_ttt_step": [f"loss_{k}" for k in range(n)],
            "full_acc": [f"full_acc_{k}" for k in range(n)],
            "cond_acc": [f"cond_acc_{k}" for k in range(n)],
        }

    def prediction(self, val: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
        """The conditional accuracy per TTT step."""
        return {
            "method": self.name,
            "cond_acc": [a for a in val.get("cond_acc") or [] if a is not None],
        }

    def predicted_acceptance_length(self, pred: dict[str, Any], k: int) -> float | None:
        """Chained over the conditional accuracies of the TTT steps (positions beyond the
        trained steps reuse the last step's)."""
        acc = pred.get("cond_acc") or []
        return chained_tau(acc, k) if acc else None

    def configured_checks(self, facts: dict[str, Any], configured: dict[str, Any]) -> list[Check]:
        return [
            (
                "norm_flags_as_configured",
                facts["norm_before_fc"] == bool(configured["norm_before_fc"])
                and facts["norm_output"] == bool(configured["norm_output"]),
                f"drafter norm_before_fc/norm_output {facts['norm_before_fc']}/"
                f"{facts['norm_output']} differ from the config's",
            )
        ]

    def loss_label(self, n: int) -> str:
        return f"loss (sum over {n} TTT steps)"

    def shape(self, trainer: dict[str, Any]) -> str:
        return f"{trainer.get('num_layers')} Llama layer(s), {trainer.get('ttt_steps')} TTT steps"


METHOD = Eagle3()
