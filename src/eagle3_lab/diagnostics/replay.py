"""Replay of a finished run: the baseline's greedy outputs (and optionally the prepared rows)
walked through its drafters, next to what the bench stage served and what validation
predicted (:func:`replay_run`; lab/drafter_replay.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline.methods import aux_key, predicted_acceptance_length

from . import proposals
from .models import (
    aux_columns,
    greedy_continuation,
    load_drafter,
    prompt_ids,
    proposals_for,
    target_states,
)
from .walk import ReplayError, combine, uniform, walk

log = logging.getLogger(__name__)


def baseline_sequences(
    run: Path, sets: Sequence[str] | None, limit: int | None = None, concurrency: int = 1
) -> dict[str, list[dict[str, Any]]]:
    """Per prompt set, its prompts with the baseline's T=0 outputs at ``concurrency``:
    ``[{"id", "messages", "outputs"}]``; the set's prompt file must be the one the baseline
    measured (its sha256)."""
    from eagle3_pipeline.runtime.files import iter_jsonl, read_json, sha256_file

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
    from eagle3_pipeline.runtime.files import read_json

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
    block = proposals.get(method).served_block(k)
    props = proposals_for(drafter, method, aux, ids, len(p_ids), k, block)[0]
    w = walk(props, outputs, k)
    if w["beyond_end"]:
        w = walk(props, outputs, k, greedy_continuation(model, ids, k))
    return w


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

    from eagle3_pipeline.hidden_states.checks import NextTokenProbe
    from eagle3_pipeline.runtime.files import read_json

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
                own = proposals.get(kinds[m])
                by_block = own.proposal_sets(drafter, configs[m], aux, ids, len(p_ids), ks[m])
                for k in ks[m]:
                    blocks = own.replay_blocks(k, by_block)
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
