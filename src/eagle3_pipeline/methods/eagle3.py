"""EAGLE-3: an autoregressive one-layer Llama head trained with test-time-training (TTT)
steps; vLLM drafts k tokens one after another (speculators ``models/eagle3/``; vLLM
``transformers_utils/configs/speculators/algos.py``; docs/methods.md). Its keys are
``train.eagle3.*``."""

from __future__ import annotations

from typing import Any

from .base import Check, Method, chained_tau, to_target_ids, top_margins


def eagle3_drafts(model, hidden, input_ids, steps: int, feed: str = "own"):
    """EAGLE-3's TTT recurrence over every row at once, with the model's own modules and masks
    (``Eagle3DraftModel.forward``): row r is the aux hidden state of position r with the token
    at r + 1 (speculators' ``shift_batch``), positions 1 + r; step j of a row attends to step 0
    of every row up to it and to its own earlier steps. ``feed="own"`` gives step j the target
    id of the row's step j - 1 prediction (vLLM's proposer); ``"teacher"`` the true token, as
    speculators' forward does in training and validation. Returns ``(draft ids, margins)``,
    each ``[rows, steps]`` (draft-vocabulary ids)."""
    import torch
    from speculators.models.eagle3.attention import (
        extend_dense_mask_for_draft_tokens,
        extend_mask_for_draft_tokens,
    )
    from transformers import DynamicCache

    if feed not in ("own", "teacher"):
        raise ValueError(f"feed must be 'own' or 'teacher', got {feed!r}")
    rows = hidden.shape[1]
    device = hidden.device
    position_ids = 1 + torch.arange(rows, dtype=torch.long, device=device).unsqueeze(0)
    cache = DynamicCache()
    docs = torch.zeros(rows, dtype=torch.long, device=device)
    full = model._build_attn_mask(docs, rows, device) if model.uses_full_attn else None
    sliding = (
        model._build_attn_mask(docs, rows, device, model.sliding_window)
        if model.uses_sliding_window_attn
        else None
    )
    h = hidden
    if model.input_norm is not None:
        h = model.input_norm(h)
    if model.fc_norm is not None:
        chunks = h.chunk(len(model.fc_norm), dim=-1)
        h = torch.cat([norm(c) for norm, c in zip(model.fc_norm, chunks, strict=True)], dim=-1)
    h = model.fc(h)
    original = input_ids.clone()
    ids = input_ids
    drafts, margins = [], []
    for step in range(steps):
        embeds = model.embed_tokens(ids)
        cache_position = torch.arange(step * rows, (step + 1) * rows, device=device)
        h = torch.cat([embeds, h], dim=-1)
        position_embeddings = model.rotary_emb(h, position_ids)
        for index, layer in enumerate(model.layers):
            h = layer(
                h,
                attention_mask=sliding if index in model.sliding_window_indices else full,
                position_ids=position_ids,
                past_key_values=cache,
                cache_position=cache_position,
                position_embeddings=position_embeddings,
            )
        if model.config.norm_output:
            h = model.norm(h)
            logits = model.lm_head(h)
        else:
            logits = model.lm_head(model.norm(h))
        top, margin = top_margins(logits)
        drafts.append(top)
        margins.append(margin)
        if feed == "own":
            ids = to_target_ids(model, top)
        else:
            ids = torch.cat([original[:, 1 + step :], original.new_zeros(1, 1 + step)], dim=-1)
        extend = (
            extend_mask_for_draft_tokens
            if model._attn_impl == "simple_flex_attention"
            else lambda m: extend_dense_mask_for_draft_tokens(m, rows)
        )
        full = extend(full) if full is not None else None
        sliding = extend(sliding) if sliding is not None else None
        position_ids = position_ids + 1
    return torch.stack(drafts, dim=-1)[0], torch.stack(margins, dim=-1)[0]


class Eagle3(Method):
    name = "eagle3"
    title = "EAGLE-3"
    own_keys = ("ttt_steps", "num_layers", "norm_before_fc", "norm_output")
    moved_from_train = own_keys
    aux_key = "eagle_aux_hidden_state_layer_ids"
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

    def model_classes(self) -> tuple[type, type]:
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

        return Eagle3DraftModel, Eagle3SpeculatorConfig

    def proposals(
        self, model, aux, ids, anchors, k: int, block: int | None = None, feed: str = "own"
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The EAGLE-3 drafter's ``k`` proposals (target ids) from every anchor position ``p``
        (the anchor token ``ids[p]`` with the hidden state of ``p - 1``: row ``p - 1``), and each
        proposal's top-1 minus top-2 logit margin."""
        import torch

        if any(p < 1 for p in anchors):
            raise ValueError("an EAGLE-3 anchor needs the hidden state of the position before it")
        hidden = aux[:-1].float().unsqueeze(0)
        tokens = torch.tensor(list(ids)[1:]).unsqueeze(0)
        drafts, margins = eagle3_drafts(model, hidden, tokens, k, feed)
        rows = [p - 1 for p in anchors]
        return to_target_ids(model, drafts[rows]).tolist(), margins[rows].tolist()

    def loss_label(self, n: int) -> str:
        return f"loss (sum over {n} TTT steps)"

    def shape(self, trainer: dict[str, Any]) -> str:
        return f"{trainer.get('num_layers')} Llama layer(s), {trainer.get('ttt_steps')} TTT steps"


METHOD = Eagle3()
