"""Drafter replay: the acceptance a drafter reaches when it is served exactly as it was trained.

The benchmark's acceptance length is what vLLM's drafter reaches on the target's own greedy
outputs; validation predicts another number. When the two disagree, either the prompts differ
(distribution) or vLLM computes something else than speculators trained (a train/serve
mismatch). The replay separates them: it takes the baseline's greedy outputs (T=0), computes
the target's hidden states for prompt + output with transformers (as extraction stores them),
runs the trained drafter on them with speculators' own model code, and simulates greedy
speculative decoding over those outputs:

* :func:`walk` (pure) is greedy speculative decoding at T=0 on one sequence: the first output
  token comes from prefill; from there on the drafter proposes k tokens from the current anchor
  (the last token produced), the longest prefix equal to the greedy output is accepted and the
  anchor moves by accepted + 1. Counted as vLLM's Prometheus counters count (one draft per
  verification step; a request stops when its outputs are complete, and the accepted length
  of its last step may reach past the end: the target verifies the drafts beyond EOS or
  ``max_tokens`` before the output is cut, see :func:`walk`).
* :func:`uniform` is what validation measures: the accepted run of a draft started at *every*
  position, averaged. speculators' DFlash ``eal`` and EAGLE-3's
  ``1 + sum_i prod_j cond_acc_j`` are this quantity on validation rows. The walk does not start
  drafts everywhere: after a long accepted run it skips the positions it accepted, so positions
  where drafts fail weigh more in the walk than in the uniform average, and the served
  acceptance length sits below the uniform one on the same text whenever easy and hard spans
  alternate. Replay numbers, side by side: uniform vs prediction = the prompts' distribution;
  walk vs uniform = how speculative decoding visits anchors; served vs walk = train/serve
  mismatch (and numerics).
* :func:`dflash_proposals` calls ``DFlashDraftModel._backbone_forward`` (the training forward)
  with an anchor at every output position: query block = anchor token + mask tokens at
  positions anchor..anchor+B-1, context = the fc-projected aux hidden states of the positions
  before the anchor. ``block`` is the trained block size (what training saw) or ``k + 1``
  (what vLLM builds: the bonus token and k mask tokens, ``copy_and_expand_dflash_inputs``).
* :func:`eagle3_proposals` runs the TTT recurrence of ``Eagle3DraftModel.forward`` with the
  model's own modules and masks, feeding each step the previous step's prediction (mapped to
  the target vocabulary), as vLLM's proposer does; ``feed="teacher"`` reproduces speculators'
  forward exactly (teacher forcing: the ground-truth token), which gives the same acceptance.
* :func:`replay_run` does it for a finished run directory (``benchmarks/drafter_replay.py``).

Heavy imports (torch, transformers, speculators) stay inside functions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ReplayError(RuntimeError):
    pass


# ---- the walk (pure) ---------------------------------------------------------------------------


def walk(
    proposals: Sequence[Sequence[int]],
    outputs: Sequence[int],
    k: int,
    continuation: Sequence[int] = (),
) -> dict[str, Any]:
    """Greedy speculative decoding at T=0 over one request's ``outputs`` with ``k`` drafts.

    ``proposals[i]`` are the drafter's proposals (target token ids, at least ``k``) from the
    anchor ``outputs[i]``: they guess ``outputs[i + 1 : i + 1 + k]``. ``outputs[0]`` comes from
    prefill; a step verifies k drafts from the current anchor, accepts the longest prefix equal
    to the output, emits it plus one token, and is counted as one draft (vLLM's scheduler counts
    every verification step whose request is still running; the drafter's proposal after the
    last token is never verified). The accepted length is counted before the output is cut at
    EOS or ``max_tokens`` (vLLM counts the rejection sampler's output, then truncates), so a
    last step can accept drafts beyond ``outputs``: ``continuation`` is what the target's greedy
    decoding produces after ``outputs`` (k tokens suffice). Without it, drafts that would be
    judged against tokens past the end count as rejected and ``beyond_end`` says how many steps
    that concerned.

    Returns the counts of vLLM's spec-decode counters (``drafts``, ``draft_tokens``,
    ``accepted``, ``accepted_per_pos``), ``steps`` [(anchor, accepted)] and ``beyond_end``.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    truth = list(outputs) + list(continuation)
    m = len(outputs)
    drafts = accepted = beyond_end = 0
    per_pos = [0] * k
    steps: list[tuple[int, int]] = []
    i = 0
    while i + 1 < m:  # outputs[: i + 1] are produced; the request is still running
        d = list(proposals[i])[:k]
        if len(d) < k:
            raise ValueError(f"anchor {i}: {len(d)} proposals, k = {k}")
        a = 0
        while a < k and i + 1 + a < len(truth) and d[a] == truth[i + 1 + a]:
            a += 1
        if a < k and i + 1 + a >= len(truth):
            beyond_end += 1  # every known draft matched; the rest cannot be judged
        drafts += 1
        accepted += a
        for j in range(a):
            per_pos[j] += 1
        steps.append((i, a))
        i += a + 1
    return {
        "drafts": drafts,
        "draft_tokens": drafts * k,
        "accepted": accepted,
        "accepted_per_pos": per_pos,
        "steps": steps,
        "beyond_end": beyond_end,
    }


def uniform(proposals: Sequence[Sequence[int]], outputs: Sequence[int], k: int) -> dict[str, Any]:
    """What validation measures, on these outputs: a draft of ``k`` from *every* anchor whose k
    targets are all known (``i + k < len(outputs)``, as validation leaves out blocks past the
    end of a row), its accepted run counted. ``accepted_per_pos[j]``: anchors whose first j + 1
    drafts are right; ``correct_per_pos[j]``: anchors whose draft j is right whatever came
    before (DFlash's ``position_acc``)."""
    anchors = accepted = 0
    per_pos = [0] * k
    correct = [0] * k
    for i in range(len(outputs) - k):
        d = list(proposals[i])[:k]
        run = True
        for j in range(k):
            hit = d[j] == outputs[i + 1 + j]
            correct[j] += hit
            run = run and hit
            if run:
                per_pos[j] += 1
                accepted += 1
        anchors += 1
    return {
        "anchors": anchors,
        "accepted": accepted,
        "accepted_per_pos": per_pos,
        "correct_per_pos": correct,
    }


def combine(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts of several sequences (:func:`walk` or :func:`uniform` results) summed, as the
    Prometheus counters sum over a prompt set, with the acceptance length and per-position
    rates they give: tau = 1 + accepted / drafts (or anchors), per position = accepted at that
    position / drafts."""
    if not parts:
        return {"acceptance_length": None, "per_position": []}
    n_key = "drafts" if "drafts" in parts[0] else "anchors"
    n = sum(p[n_key] for p in parts)
    out: dict[str, Any] = {n_key: n, "accepted": sum(p["accepted"] for p in parts)}
    for key in ("draft_tokens", "beyond_end"):
        if key in parts[0]:
            out[key] = sum(p[key] for p in parts)
    k = len(parts[0]["accepted_per_pos"])
    per_pos = [sum(p["accepted_per_pos"][j] for p in parts) for j in range(k)]
    out["acceptance_length"] = 1 + out["accepted"] / n if n else None
    out["per_position"] = [c / n for c in per_pos] if n else [None] * k
    if "correct_per_pos" in parts[0]:
        correct = [sum(p["correct_per_pos"][j] for p in parts) for j in range(k)]
        out["position_accuracy"] = [c / n for c in correct] if n else [None] * k
    return out


def compare_proposals(
    served: Sequence[tuple[int, Sequence[int]]],
    replayed: Sequence[Sequence[int]],
    outputs: Sequence[int],
    k: int,
) -> dict[str, Any]:
    """vLLM's proposals of one request, step by step, against the replay's at the same anchor.

    ``served``: per proposal of vLLM's drafter, (the anchor token it drafted from, its k
    drafts), in order (the proposal after the last token, never verified, may be included).
    The anchors are reconstructed from the served drafts and ``outputs`` as the walk moves (so
    a disagreement does not shift the comparison): the first at ``outputs[0]``, each next one
    accepted + 1 further. A served anchor token that is not the output token there means the
    two decoded different sequences (``anchor_mismatch``). Returns the proposals compared, how
    many agree in full and per position, and the first disagreements."""
    i = 0
    steps = same = anchor_mismatch = 0
    same_per_pos = [0] * k
    examples: list[dict[str, Any]] = []
    for anchor_token, drafts in served:
        if i >= len(outputs):  # vLLM also proposes after the last token; nothing left after
            break
        d = list(drafts)[:k]
        r = list(replayed[i])[:k]
        if anchor_token != outputs[i]:
            anchor_mismatch += 1
        steps += 1
        same += d == r
        for j in range(k):
            same_per_pos[j] += d[j] == r[j]
        if d != r and len(examples) < 5:
            examples.append({"anchor": i, "served": d, "replay": r})
        a = 0
        while a < k and i + 1 + a < len(outputs) and d[a] == outputs[i + 1 + a]:
            a += 1
        i += a + 1
    return {
        "steps": steps,
        "identical": same,
        "identical_per_pos": same_per_pos,
        "anchor_mismatch": anchor_mismatch,
        "examples": examples,
    }


# ---- the target: prompt ids, hidden states, greedy continuation --------------------------------


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt token ids vLLM's chat endpoint renders for ``messages`` (the bench stage
    sends no chat_template_kwargs): the chat template with the generation prompt, exactly as
    the synth stage's token-exact check renders them."""
    from .synth import render_ids

    return render_ids(tokenizer, messages, {}, add_generation_prompt=True)


def target_states(model, ids: Sequence[int], layer_ids: Sequence[int]):
    """``[len(ids), len(layer_ids), hidden]`` float32 hidden states of ``ids`` as extraction
    stores them (aux id i < N: HF ``hidden_states[i]``; id N: the last decoder layer before the
    final norm), from :func:`eagle3_pipeline.verify.reference_hidden_states`."""
    import torch

    from .verify import reference_hidden_states

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
    """The exported drafter as speculators' model (``Eagle3DraftModel``/``DFlashDraftModel``),
    float32, eval mode, with SDPA attention (``from_pretrained`` picks flex attention, which
    fails on the CPU). Weights come from ``model.safetensors``; what checkpoints leave out
    (embed_tokens, the verifier's lm_head and norm) from the verifier, ``verifier_path``
    (default: the one in config.json). Any other missing or unexpected weight is an error."""
    from safetensors.torch import load_file
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    from .fileio import read_json

    drafter_dir = Path(drafter_dir)
    method = read_json(drafter_dir / "config.json").get("speculators_model_type")
    classes = {
        "eagle3": (Eagle3DraftModel, Eagle3SpeculatorConfig),
        "dflash": (DFlashDraftModel, DFlashSpeculatorConfig),
    }
    if method not in classes:
        raise ReplayError(f"{drafter_dir}: cannot replay a {method!r} drafter")
    model_cls, config_cls = classes[method]
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


def to_target_ids(model, draft_ids):
    """Draft-vocabulary ids -> target ids (speculators' d2t offsets: target = i + d2t[i])."""
    d2t = getattr(model, "d2t", None)
    return draft_ids if d2t is None else draft_ids + d2t[draft_ids]


def _margins(logits):
    """(top-1 target ids, top-1 minus top-2 logit) per row: how close a proposal was to a
    tie, for judging a disagreement with vLLM."""
    top = logits.topk(2, dim=-1)
    return top.indices[..., 0], top.values[..., 0] - top.values[..., 1]


def dflash_proposals(
    model,
    aux,
    ids: Sequence[int],
    anchors: Sequence[int],
    k: int,
    block: int | None = None,
    chunk: int = 64,
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
            top, margin = _margins(logits[0].view(len(part), block, -1)[:, 1 : k + 1])
            proposals += to_target_ids(model, top).tolist()
            margins += margin.tolist()
    finally:
        model.block_size = trained
    return proposals, margins


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
        top, margin = _margins(logits)
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


def eagle3_proposals(
    model, aux, ids: Sequence[int], anchors: Sequence[int], k: int, feed: str = "own"
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
    if method == "dflash":
        return dflash_proposals(model, aux, ids, anchors, k, block)
    return eagle3_proposals(model, aux, ids, anchors, k)


def aux_columns(method_config: dict[str, Any], layer_ids: Sequence[int]) -> list[int]:
    """Which columns of target states computed at ``layer_ids`` are the drafter's aux layers."""
    from .method_results import aux_key

    aux = method_config.get(aux_key(method_config.get("speculators_model_type")))
    if not aux:
        raise ReplayError("the drafter's config.json names no aux layers")
    missing = [layer for layer in aux if layer not in layer_ids]
    if missing:
        raise ReplayError(f"aux layers {missing} were not computed")
    return [list(layer_ids).index(layer) for layer in aux]


# ---- a finished run --------------------------------------------------------------------------


def baseline_sequences(
    run: Path, sets: Sequence[str] | None, limit: int | None = None, concurrency: int = 1
) -> dict[str, list[dict[str, Any]]]:
    """Per prompt set, its prompts with the baseline's T=0 outputs at ``concurrency``:
    ``[{"id", "messages", "outputs"}]``; the set's prompt file must be the one the baseline
    measured (its sha256)."""
    from .fileio import iter_jsonl, read_json, sha256_file

    baseline = read_json(run / "bench" / "baseline.json")
    names = list(sets) if sets else list(baseline["sets"])
    out: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        entry = baseline["sets"].get(name)
        path = run / "prompts" / f"bench_{name}.jsonl"
        if entry is None:
            raise ReplayError(f"bench/baseline.json has no prompt set {name!r}")
        if not path.exists() or sha256_file(path) != entry["prompts_sha256"]:
            raise ReplayError(f"{path} is not the prompt file the baseline measured")
        greedy = [
            r for r in entry["runs"] if r["temperature"] == 0 and r["concurrency"] == concurrency
        ]
        if not greedy:
            raise ReplayError(
                f"the baseline of {name!r} has no run at T=0, concurrency {concurrency}"
            )
        prompts = list(iter_jsonl(path))
        rows = [
            {"id": p.get("id"), "messages": p["messages"], "outputs": list(o)}
            for p, o in zip(prompts, greedy[0]["outputs"], strict=True)
        ]
        out[name] = rows[:limit] if limit else rows
    return out


DATASET_SPLITS = ("validation", "training")


def dataset_sequences(
    trainer: dict[str, Any], split: str, limit: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Rows of the prepared data set a drafter trained on, as replay sequences: ``validation``
    (the rows its validation measured: speculators splits at ``int(rows * train_data_ratio)``)
    or ``training``. A row's prompt is everything before its loss mask, its output the masked
    tokens (the target's greedy answer); rows whose mask is not one span to the end (several
    assistant turns) are skipped. Returns the sequences and how many rows were skipped."""
    from datasets import load_from_disk

    if split not in DATASET_SPLITS:
        raise ReplayError(f"split must be one of {DATASET_SPLITS}, got {split!r}")
    data = load_from_disk(str(trainer["data_path"])).with_format(None)
    cut = int(len(data) * float(trainer["train_data_ratio"]))
    indices = range(cut, len(data)) if split == "validation" else range(cut)
    out: list[dict[str, Any]] = []
    skipped = 0
    for i in indices:
        row = data[i]
        ids, mask = list(row["input_ids"]), list(row["loss_mask"])
        first = next((j for j, m in enumerate(mask) if m), None)
        if first is None or not all(mask[first:]) or first == 0:
            skipped += 1
            continue
        out.append(
            {"id": row.get("sample_id", i), "prompt_ids": ids[:first], "outputs": ids[first:]}
        )
        if limit and len(out) >= limit:
            break
    return out, skipped


def served_rows(run: Path, method: str, concurrency: int = 1) -> list[dict[str, Any]]:
    """The bench stage's T=0 runs of a method at ``concurrency``
    (``bench/<method>/metrics.json``)."""
    from .fileio import read_json

    path = run / "bench" / method / "metrics.json"
    if not path.exists():
        return []
    return [
        r
        for r in read_json(path)["runs"]
        if r["temperature"] == 0 and r["concurrency"] == concurrency
    ]


def text_walk(
    model, drafter, method: str, aux_cols: list[int], layer_ids, p_ids, outputs, k: int
) -> dict[str, Any]:
    """The walk over one request's ``outputs`` (another text than the baseline's: what a
    served run decoded), with the proposals vLLM's drafter makes at k (DFlash: the k + 1
    queries vLLM builds), the target's states computed on that text."""
    if len(outputs) < 2:
        return walk([], outputs, k)
    ids = list(p_ids) + list(outputs)
    aux = target_states(model, ids, layer_ids)[:, aux_cols].flatten(1)
    block = k + 1 if method == "dflash" else None
    props = proposals_for(drafter, method, aux, ids, len(p_ids), k, block)[0]
    w = walk(props, outputs, k)
    if w["beyond_end"]:
        w = walk(props, outputs, k, greedy_continuation(model, ids, k))
    return w


def method_proposals(
    drafter, method: str, config: dict[str, Any], aux, ids, first_output: int, ks: list[int]
) -> dict[int | None, list[list[int]]]:
    """A drafter's proposals from every output position, per query block: EAGLE-3 one set
    (``None``: no block) at the largest k (the first k' of a k-step recurrence are the
    k'-step ones); DFlash with its trained block (all ``block - 1`` slots) and, for each k below
    that, with the ``k + 1`` queries vLLM builds."""
    anchors = list(range(first_output, len(ids)))
    if method != "dflash":
        return {None: eagle3_proposals(drafter, aux, ids, anchors, max(ks))[0]}
    block = int(config["block_size"])
    out = {block: dflash_proposals(drafter, aux, ids, anchors, block - 1, block)[0]}
    for k in ks:
        if k + 1 not in out:
            out[k + 1] = dflash_proposals(drafter, aux, ids, anchors, k, k + 1)[0]
    return out


def replay_run(
    run: str | Path,
    methods: Sequence[str] | None = None,
    ks: dict[str, list[int]] | None = None,
    sets: Sequence[str] | None = None,
    limit: int | None = None,
    target_path: str | Path | None = None,
    rows: Sequence[str] = (),
    concurrency: int = 1,
    served_outputs: dict[tuple[str, int, str], list[list[int]]] | None = None,
) -> dict[str, Any]:
    """Replay the baseline's greedy outputs of a finished run through its drafters.

    Per method, k, query block (DFlash) and prompt set: the walk's acceptance (tau, per
    position, counts), the uniform-anchor acceptance (what validation measures), the served
    figures of ``bench/<method>/metrics.json`` at the same set and k (T=0, concurrency 1) and
    validation's prediction. A DFlash drafter served at a k below ``block_size - 1`` is
    replayed twice: with the k + 1 queries vLLM builds (``as_served``) and with the block it was
    trained on. ``ks``: per method (default: the k's its bench measured, else its trained draft
    length). ``target_path``: the target model directory (default: ``target/target.json``'s).
    ``rows``: also replay the prepared data set's ``validation`` and/or ``training`` rows (as
    sets ``<split>_rows``, nothing served there): on the validation rows the uniform figure is
    what validation measured, so prediction, uniform and walk can be compared on one text.
    ``concurrency``: the baseline and bench runs compared (default 1). ``served_outputs``:
    per (method, k, prompt set) the outputs the served run decoded, request by request (the
    bench cache keeps them): each is also walked on its own text (``replay_served_text``), so
    that a served output that departs from the baseline's (numerics of batched or verified
    decoding) does not blur the comparison with the counters.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .fileio import read_json
    from .method_results import aux_key, predicted_acceptance_length
    from .verify import NextTokenProbe

    run = Path(run)
    target = read_json(run / "target" / "target.json")
    target_dir = Path(target_path or target["model_path"])
    drafters = {
        p.name: p
        for p in sorted((run / "drafter").iterdir())
        if (p / "model.safetensors").exists() and (not methods or p.name in methods)
    }
    missing = sorted(set(methods or []) - set(drafters))
    if missing or not drafters:
        raise ReplayError(f"{run}/drafter has no exported drafter for {missing or 'any method'}")
    configs = {m: read_json(d / "config.json") for m, d in drafters.items()}
    kinds = {m: c.get("speculators_model_type") for m, c in configs.items()}
    layer_ids = sorted({i for m, c in configs.items() for i in c[aux_key(kinds[m])]})
    layer_ids.append(int(target["architecture"]["num_layers"]))
    served = {m: served_rows(run, m, concurrency) for m in drafters}
    ks = {m: sorted((ks or {}).get(m) or []) for m in drafters}
    for m in drafters:
        if not ks[m]:
            measured = sorted({r["k"] for r in served[m]})
            trained = configs[m]["speculators_config"]["proposal_methods"][0]
            ks[m] = measured or [int(trained["speculative_tokens"])]
    seqs = baseline_sequences(run, sets, limit, concurrency)
    skipped: dict[str, int] = {}
    trainer = read_json(drafters[next(iter(drafters))] / "metrics.json")["config"]["trainer"]
    for split in rows:
        seqs[f"{split}_rows"], skipped[f"{split}_rows"] = dataset_sequences(trainer, split, limit)

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    probe = NextTokenProbe(target_dir, target["architecture"], device="cpu")
    loaded = {m: load_drafter(d, target_dir)[0] for m, d in drafters.items()}
    max_k = max(max(v) for v in ks.values())

    parts: dict[tuple, dict[str, list]] = {}
    agreement = {name: [0, 0] for name in seqs}
    for name, rows in seqs.items():
        for index, row in enumerate(rows):
            p_ids = row.get("prompt_ids") or prompt_ids(tokenizer, row["messages"])
            outputs = row["outputs"]
            if not outputs:
                continue
            ids = p_ids + outputs
            states = target_states(model, ids, layer_ids)
            hits, checked = probe.agreement(
                states[:, -1], ids, [0] * len(p_ids) + [1] * len(outputs), len(ids)
            )
            agreement[name][0] += hits
            agreement[name][1] += checked
            continuation: list[int] | None = None
            for m, drafter in loaded.items():
                aux = states[:, aux_columns(configs[m], layer_ids)].flatten(1)
                by_block = method_proposals(
                    drafter, kinds[m], configs[m], aux, ids, len(p_ids), ks[m]
                )
                for k in ks[m]:
                    blocks = [None] if kinds[m] != "dflash" else sorted({k + 1, max(by_block)})
                    for block in blocks:
                        props = by_block[block]
                        w = walk(props, outputs, k)
                        if w["beyond_end"]:
                            if continuation is None:
                                continuation = greedy_continuation(model, ids, max_k)
                            w = walk(props, outputs, k, continuation)
                        slot = parts.setdefault((m, k, block, name), {"walk": [], "uniform": []})
                        slot["walk"].append(w)
                        slot["uniform"].append(uniform(props, outputs, k))
                        texts = (served_outputs or {}).get((m, k, name))
                        if texts is None or block not in (None, k + 1):
                            continue
                        text = list(texts[index])
                        if text != outputs:
                            cols = aux_columns(configs[m], layer_ids)
                            w = text_walk(model, drafter, kinds[m], cols, layer_ids, p_ids, text, k)
                        slot.setdefault("served_text", []).append(w)
                        slot["served_text_differs"] = slot.get("served_text_differs", 0) + (
                            text != outputs
                        )
            log.info("replayed %s/%s (%d output tokens)", name, row["id"], len(outputs))

    results = []
    for (m, k, block, name), slot in parts.items():
        replayed = combine(slot["walk"])
        row = next((r for r in served[m] if r["prompt_set"] == name and r["k"] == k), None)
        prediction = read_json(drafters[m] / "metrics.json").get("prediction") or {}
        result = {
            "method": m,
            "k": k,
            "block": block,
            "as_served": block is None or block == k + 1,
            "prompt_set": name,
            "sequences": len(slot["walk"]),
            "replay": replayed,
            "uniform": combine(slot["uniform"]),
            "served": None,
            "predicted_acceptance_length": predicted_acceptance_length(prediction, k),
        }
        if "served_text" in slot:
            on_text = combine(slot["served_text"])
            result["replay_served_text"] = on_text
            result["served_text_differs"] = slot["served_text_differs"]
        if row is not None:
            result["served"] = {
                key: row.get(key) for key in ("acceptance_length", "per_position", "drafts")
            }
            result["served"]["accepted"] = row.get("accepted")
            result["served_over_replay"] = ratio(
                row["acceptance_length"], replayed["acceptance_length"]
            )
            if "served_text" in slot:
                result["served_over_replay_served_text"] = ratio(
                    row["acceptance_length"], on_text["acceptance_length"]
                )
        results.append(result)
    return {
        "run": str(run),
        "target": str(target_dir),
        "concurrency": concurrency,
        "methods": {m: {"ks": ks[m], "drafter": str(d)} for m, d in drafters.items()},
        "skipped_rows": skipped,
        "target_agreement": {
            name: {"hits": h, "checked": c, "rate": h / c if c else None}
            for name, (h, c) in agreement.items()
        },
        "results": results,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ---- what vLLM proposes: the drafter served in-process, its proposals recorded -----------------


def _install_recorder(worker) -> str:
    """On vLLM's worker: wrap the drafter's ``propose`` to record, per call, the anchor tokens
    (``next_token_ids``) and the proposed ids."""
    drafter = worker.model_runner.drafter
    drafter._replay_calls = []
    original = drafter.propose

    def propose(*args, **kwargs):
        drafts = original(*args, **kwargs)
        anchors = kwargs.get("next_token_ids")
        drafter._replay_calls.append(
            {
                "anchors": None if anchors is None else anchors.tolist(),
                "drafts": drafts.tolist(),
            }
        )
        return drafts

    drafter.propose = propose
    return type(drafter).__name__


def _take_recorded(worker) -> list[dict[str, Any]]:
    drafter = worker.model_runner.drafter
    calls, drafter._replay_calls = drafter._replay_calls, []
    return calls


def _spec_counters(llm) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num"):
            out[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", 0)
    return out


def _serve_main(job: dict[str, Any]) -> None:
    """In a process of its own: the target with the drafter on vLLM's offline engine (one
    request at a time, T=0), every proposal recorded (:func:`served_proposals`)."""
    from vllm import LLM, SamplingParams

    from .fileio import write_json

    llm = LLM(
        model=job["target"],
        dtype=job.get("dtype", "float32"),
        enforce_eager=True,
        max_model_len=job.get("max_model_len", 2048),
        max_num_seqs=1,
        seed=0,
        disable_log_stats=False,
        speculative_config={
            "model": job["drafter"],
            "method": job["method"],
            "num_speculative_tokens": job["k"],
        },
    )
    proposer = llm.collective_rpc(_install_recorder)[0]
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    requests = []
    for messages in job["prompts"]:
        before = _spec_counters(llm)
        [out] = llm.chat(messages, params, use_tqdm=False)
        after = _spec_counters(llm)
        calls = llm.collective_rpc(_take_recorded)[0]
        requests.append(
            {
                "prompt_token_ids": list(out.prompt_token_ids),
                "outputs": list(out.outputs[0].token_ids),
                "finish_reason": out.outputs[0].finish_reason,
                # one request at a time: each call drafted for it alone
                "proposals": [(c["anchors"][0], c["drafts"][0]) for c in calls if c["drafts"]],
                "counters": {
                    name: (
                        [a - b for a, b in zip(after[name], before.get(name) or [], strict=False)]
                        if isinstance(after[name], list)
                        else after[name] - before.get(name, 0)
                    )
                    for name in after
                },
            }
        )
    write_json(job["out"], {"proposer": proposer, "job": job, "requests": requests})


def served_proposals(
    target: str | Path,
    drafter: str | Path,
    method: str,
    k: int,
    prompts: list[list[dict]],
    max_tokens: int,
    out: str | Path,
    log_path: str | Path | None = None,
    cache_root: str | Path | None = None,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """What vLLM's drafter proposes at each decoding step, on the CPU: vLLM's offline engine in
    a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so that the drafter's
    ``propose`` can be wrapped on the model runner), the target with the drafter at ``k``, each
    of ``prompts`` (chat messages) decoded alone at T=0 for up to ``max_tokens``. Per request:
    the prompt and output ids, per proposal (anchor token, drafts), and the deltas of the
    spec-decode counters. Written to ``out`` and returned."""
    import json
    import os
    import subprocess
    import sys

    from .fileio import read_json
    from .server import vllm_environment

    job = {
        "target": str(target),
        "drafter": str(drafter),
        "method": method,
        "k": int(k),
        "prompts": prompts,
        "max_tokens": int(max_tokens),
        "out": str(out),
    }
    # the bench servers' environment, with the engine in this process (its drafter wrappable)
    env = vllm_environment(
        "cpu",
        os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        cache_root,
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    cmd = [sys.executable, "-m", "eagle3_pipeline.replay", "serve", json.dumps(job)]
    logf = open(log_path or os.devnull, "ab")  # noqa: SIM115 - closed below
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
        )
    finally:
        logf.close()
    if proc.returncode != 0:
        tail = Path(log_path).read_text()[-3000:] if log_path else ""
        raise ReplayError(f"vLLM with the {method} drafter failed (rc {proc.returncode})\n{tail}")
    return read_json(out)


if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: python -m eagle3_pipeline.replay serve JOB_JSON")
    _serve_main(json.loads(sys.argv[2]))
