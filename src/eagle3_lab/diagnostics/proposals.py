"""Each drafter method's model as speculators trained it, run on a target's hidden states: its
proposals from every position of a sequence (the drafter replay of :mod:`.replay`).

These hooks are what the replay needs of a method beyond
:class:`eagle3_pipeline.methods.base.Method` (speculators' model classes, its forward pass as
vLLM drafts with it, the query blocks vLLM builds); they live here, outside the pipeline,
because no stage uses them.
"""

from __future__ import annotations

from typing import Any


def to_target_ids(model, draft_ids):
    """Draft-vocabulary ids -> target ids (speculators' d2t offsets: target = i + d2t[i])."""
    d2t = getattr(model, "d2t", None)
    return draft_ids if d2t is None else draft_ids + d2t[draft_ids]


def top_margins(logits):
    """(top-1 target ids, top-1 minus top-2 logit) per row: how close a proposal was to a
    tie, for judging a disagreement with vLLM."""
    top = logits.topk(2, dim=-1)
    return top.indices[..., 0], top.values[..., 0] - top.values[..., 1]


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


class Replay:
    """What the replay runs of one method: speculators' model and its proposals."""

    def model_classes(self) -> tuple[type, type]:
        """speculators' (draft model class, config class) of this method (imported here)."""
        raise NotImplementedError

    def proposals(
        self, model, aux, ids, anchors, k: int, block: int | None = None
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The drafter's ``k`` proposals (target ids) from every anchor position of ``ids``
        (``aux``: the aux hidden states of ``ids``) and each proposal's top-1 minus top-2
        logit margin; ``block``: the query block of a block drafter."""
        raise NotImplementedError

    def served_block(self, k: int) -> int | None:
        """The query block vLLM builds at ``k`` (None: not a block drafter)."""
        return None

    def proposal_sets(
        self, model, config: dict[str, Any], aux, ids, first_output: int, ks: list[int]
    ) -> dict[int | None, list[list[int]]]:
        """Proposals from every output position per query block: one set (``None``) at the
        largest k (the first k' drafts of an autoregressive drafter are its k'-draft ones)."""
        anchors = list(range(first_output, len(ids)))
        return {None: self.proposals(model, aux, ids, anchors, max(ks))[0]}

    def replay_blocks(self, k: int, by_block: dict[int | None, Any]) -> list[int | None]:
        """The query blocks replayed at ``k`` (of :meth:`proposal_sets`)."""
        return [None]


class Eagle3Replay(Replay):
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


class DFlashReplay(Replay):
    def model_classes(self) -> tuple[type, type]:
        from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

        return DFlashDraftModel, DFlashSpeculatorConfig

    def proposals(
        self, model, aux, ids, anchors, k: int, block: int | None = None, chunk: int = 64
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The DFlash drafter's ``k`` proposals (target ids) from every anchor position, and each
        proposal's top-1 minus top-2 logit margin.

        ``aux``: ``[len(ids), layers * hidden]`` aux hidden states (the drafter's layers, in order),
        ``ids``: the token ids, ``anchors``: absolute positions (the anchor token is ``ids[p]``, the
        context the positions before it). One ``_backbone_forward`` of speculators' model per
        ``chunk`` anchors (anchors are independent: each query block sees only its own block and
        the positions before its anchor), with a loss mask that selects exactly these anchors.
        ``block``: the query block (anchor + mask tokens); default the trained block size; vLLM
        builds k + 1."""
        import torch

        trained = int(model.block_size)
        block = trained if block is None else int(block)
        if not 1 <= k <= block - 1:
            raise ValueError(f"k = {k} does not fit a block of {block}")
        n = len(ids)
        width = aux.shape[-1]
        hidden = torch.zeros(1, n + block, width, dtype=torch.float32)
        hidden[0, :n] = aux.float()
        tokens = torch.zeros(1, n + block, dtype=torch.long)
        tokens[0, :n] = torch.tensor(list(ids))
        verifier_last = torch.zeros(1, n + block, model.hidden_size, dtype=torch.float32)
        docs = torch.zeros(1, n + block, dtype=torch.long)
        proposals: list[list[int]] = []
        margins: list[list[float]] = []
        model.block_size = block
        try:
            for start in range(0, len(anchors), chunk):
                part = list(anchors[start : start + chunk])
                loss_mask = torch.zeros(1, n + block, dtype=torch.long)
                loss_mask[0, part] = 1
                _, logits, _, _, _ = model._backbone_forward(
                    hidden, tokens, loss_mask, verifier_last, docs, max_anchors=len(part)
                )
                top, margin = top_margins(logits[0].view(len(part), block, -1)[:, 1 : k + 1])
                proposals += to_target_ids(model, top).tolist()
                margins += margin.tolist()
        finally:
            model.block_size = trained
        return proposals, margins

    def served_block(self, k: int) -> int | None:
        return k + 1

    def proposal_sets(
        self, model, config: dict[str, Any], aux, ids, first_output: int, ks: list[int]
    ) -> dict[int | None, list[list[int]]]:
        """With its trained block (all ``block - 1`` slots) and, for each k below that, with
        the ``k + 1`` queries vLLM builds."""
        anchors = list(range(first_output, len(ids)))
        block = int(config["block_size"])
        out = {block: self.proposals(model, aux, ids, anchors, block - 1, block)[0]}
        for k in ks:
            if k + 1 not in out:
                out[k + 1] = self.proposals(model, aux, ids, anchors, k, k + 1)[0]
        return out

    def replay_blocks(self, k: int, by_block: dict[int | None, Any]) -> list[int | None]:
        """As served (k + 1 queries) and as trained (the largest block)."""
        return sorted({k + 1, max(b for b in by_block if b is not None)})


REPLAYS: dict[str, Replay] = {"eagle3": Eagle3Replay(), "dflash": DFlashReplay()}


def get(method: str) -> Replay:
    """The replay hooks of drafter method ``method``."""
    if method not in REPLAYS:
        raise ValueError(
            f"no replay for drafter method {method!r} (replayed: {', '.join(REPLAYS)})"
        )
    return REPLAYS[method]
