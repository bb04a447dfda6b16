"""The extract stage: one part of the rows (:func:`run_part`), its checks against the
thresholds, and the merge of the parts' manifests (:func:`gather`)."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from ..hidden_states import shards
from ..hidden_states.checks import NextTokenProbe, model_fits, reference_errors
from ..hidden_states.disk import sample_bytes
from ..runtime import Progress, StageClock
from ..runtime.disk import DISK_MARGIN, check_disk
from ..runtime.files import read_json, stable_hash, write_json
from ..runtime.provenance import provenance
from ..runtime.results import EXTRACT_PART, format_tag, read_result
from ..server import VllmServer
from ..target.stage import load_info
from .book import REUSE, ShardBook, reset_layout, shard_entries
from .capture import ExtractError, capture_fingerprint, resolve_layers, row_key, server_spec
from .client import Extractor

log = logging.getLogger(__name__)

# The reference forward (extract.reference_forward): the first rows of a part compared with a
# transformers forward of the target, and the largest relative error per layer that passes
# (bf16 storage rounds to about 0.004; a sample of another model or layer is off by far more).
REFERENCE_ROWS = 2


def run_part(
    part: int,
    jobs: int,
    target_json,
    dataset_dir,
    root,
    part_out,
    cfg: dict,
    vllm_cfg: dict,
    log_path=None,
    synth_temperature: float = 0.0,
    allow_low_disk: bool = False,
) -> dict:
    from datasets import load_from_disk

    target = load_info(target_json)
    arch = target["architecture"]
    aux, captured, final = resolve_layers(cfg, arch)
    layer_ids = [*captured, final]
    root, dataset_dir = Path(root).resolve(), Path(dataset_dir)
    ds = load_from_disk(str(dataset_dir)).with_format(None)
    S = cfg["samples_per_shard"]
    rows = shards.part_range(len(ds), S, jobs, part)
    log.info(
        "extract part %d/%d: samples %d..%d of %d, layers %s, storage %s",
        part,
        jobs,
        rows.start,
        rows.stop - 1,
        len(ds),
        layer_ids,
        cfg["storage"],
    )

    capture = capture_fingerprint(target, layer_ids, cfg, vllm_cfg)
    pool = reset_layout(root, capture, S, len(ds))
    keys = {i: row_key(ds[i]["input_ids"]) for i in rows}
    book = ShardBook(root, S, rows, keys, pool)
    book.scan()
    if book.corrupt:
        log.warning(
            "%d stored sample(s) failed their checksum and will be redone: %s",
            len(book.corrupt),
            book.corrupt[:10],
        )
    adopted = [i for i in rows if i not in book.done and book.adopt(i)]
    todo = [i for i in rows if i not in book.done]
    log.info(
        "extract: %d samples stored (%d of them moved from other rows), %d to go",
        len(book.done),
        len(adopted),
        len(todo),
    )
    seq_lens = ds["seq_len"]
    disk = check_disk(
        root,
        sum(
            sample_bytes(seq_lens[i], len(layer_ids), arch["hidden_size"], cfg["storage"])
            for i in todo
        ),
        DISK_MARGIN,
        allow=allow_low_disk,
    )
    staging = root / ".staging" / f"part_{part}"
    ex = None
    clock = StageClock()
    try:
        if todo:
            staging.mkdir(parents=True, exist_ok=True)
            probe = NextTokenProbe(target["model_path"], arch, cfg["verify_device"])
            ex = Extractor(ds, book, probe, layer_ids, arch["hidden_size"], cfg, staging)
            spec = server_spec(vllm_cfg, target, layer_ids, staging, cfg)
            with VllmServer(spec, log_path) as server:
                clock.ready()
                progress = Progress(
                    len(rows), f"extract part {part}", unit="samples", done=len(book.done)
                )
                asyncio.run(
                    ex.run(server.base_url, server.model_name, todo, progress, server.check_alive)
                )
    finally:
        book.close()
    times = clock.split()
    shutil.rmtree(staging, ignore_errors=True)

    missing = [i for i in rows if i not in book.done]
    if missing:
        raise ExtractError(
            f"{len(missing)} sample(s) of part {part} failed "
            f"({ex.failures[:3] if ex else []}); the {len(book.done)} stored ones are kept, "
            "re-run to retry the rest"
        )
    stored_hits = sum(book.done[i]["agree"][0] for i in rows)
    stored_checked = sum(book.done[i]["agree"][1] for i in rows)
    agreement = stored_hits / stored_checked if stored_checked else None
    reference = maybe_reference(target, cfg, book, rows, layer_ids, ds, root / "parts", capture)
    verification = {
        "samples_checked": len(rows),
        "next_token_agreement": agreement,
        "next_token_positions": stored_checked,
        # every sample is probed, at up to this many evenly spaced completion positions
        "samples_probed": sum(1 for i in rows if book.done[i]["agree"][1]),
        "next_token_positions_per_sample": cfg["agreement_positions_per_sample"],
        "min_next_token_agreement": cfg["min_next_token_agreement"],
        "synth_temperature": synth_temperature,
        "reference": reference,
        "redone_after_checksum_failure": len(book.corrupt),
    }
    enforce(verification, cfg)
    tokens_this_run = sum(seq_lens[i] for i in todo)
    manifest = {
        "format": format_tag(EXTRACT_PART),
        "part": part,
        "jobs": jobs,
        "samples": [rows.start, rows.stop],
        "num_samples": len(rows),
        "tokens": sum(book.done[i]["tokens"] for i in rows),
        "bytes": sum(book.done[i]["bytes"] for i in rows),
        "layer_ids": layer_ids,
        "aux_layer_ids": aux,
        "final_layer_id": final,
        "hidden_size": arch["hidden_size"],
        "storage": cfg["storage"],
        "samples_per_shard": S,
        "root": str(root),
        "shards": [book.summary(s) for s in book.shards()],
        "verification": verification,
        "disk": disk,
        "this_run": {
            "server_started": bool(todo),
            "samples": len(todo),
            "reused": len(rows) - len(todo),
            "moved_from_other_rows": len(adopted),
            "tokens": tokens_this_run,
            **times,
            "validator_s_per_phase": {k: round(v, 2) for k, v in ex.timings.items()} if ex else {},
            "probe_batches": ex.probe_batches if ex else 0,
            # from the server's first answer on: its start is server_start_s
            "tokens_per_s": round(tokens_this_run / max(times["elapsed_s"], 1e-9), 1)
            if todo
            else None,
        },
        "provenance": provenance(cfg, inputs={"dataset": dataset_dir, "target": target_json}),
    }
    write_json(part_out, manifest)
    return manifest


def maybe_reference(
    target: dict,
    cfg: dict,
    book: ShardBook,
    rows: range,
    layer_ids: list[int],
    ds,
    cache_dir: Path,
    capture: str,
) -> dict | None:
    """Relative error of the first stored samples against a transformers forward; the result
    is kept under a key of those samples' content, so unchanged samples are not checked
    again (the forward loads the whole model)."""
    mode = cfg["reference_forward"]
    if mode == "never" or (mode == "auto" and not model_fits(target["model_path"])):
        return {
            "skipped": f"reference_forward={mode}"
            + ("" if mode == "never" else " and the model does not fit in memory")
        }
    checked = list(rows)[:REFERENCE_ROWS]
    key = stable_hash(
        {
            "capture": capture,
            "samples": [[book.done[i].get("key"), book.done[i]["sha256"]] for i in checked],
        }
    )
    cached = cache_dir / f".reference-{key}.json"
    if cached.exists():
        return read_json(cached)
    from safetensors.torch import load_file

    samples = []
    for i in checked:
        t = load_file(shards.sample_path(book.root, i, book.S))
        samples.append((ds[i]["input_ids"], shards.dequantize(t)))
    log.info("reference forward with transformers on %d row(s)", len(samples))
    result = reference_errors(
        target["model_path"], samples, layer_ids, target.get("trust_remote_code", False)
    )
    write_json(cached, result)
    return result


def enforce(v: dict, cfg: dict) -> None:
    agreement = v["next_token_agreement"]
    if (
        agreement is not None
        and v["synth_temperature"] == 0
        and agreement < cfg["min_next_token_agreement"]
    ):
        raise ExtractError(
            f"next-token agreement {agreement:.3f} < extract.min_next_token_agreement "
            f"{cfg['min_next_token_agreement']}: lm_head(norm(h_final)) does not predict the "
            "greedy synth tokens, so the hidden states are shifted, zeroed or from the wrong "
            "layers. Do not train on them."
        )
    ref = v["reference"] or {}
    limit = cfg["max_reference_rel_error"]
    if ref.get("max_rel_error") is not None and ref["max_rel_error"] > limit:
        raise ExtractError(
            f"hidden states differ from a transformers forward by "
            f"{ref['max_rel_error']:.3g} (per layer: {ref['max_rel_error_per_layer']}) > "
            f"extract.max_reference_rel_error {limit}: not the target's own (another model, a "
            "wrong dtype or layers), or a forward that went wrong"
        )


def gather(parts: list, manifest_out, cfg: dict) -> dict:
    """Merge part manifests; check they agree and cover every sample exactly once."""
    # Each manifest stays paired with its own file: sorted by part number, not by path text
    # (as text, part_10.json sorts before part_2.json).
    paired = sorted(
        ((read_result(p, EXTRACT_PART), p) for p in parts), key=lambda mp: mp[0]["part"]
    )
    ms = [m for m, _ in paired]
    first = ms[0]
    for key in ("layer_ids", "storage", "hidden_size", "samples_per_shard", "root"):
        values = {str(m[key]) for m in ms}
        if len(values) != 1:
            raise ExtractError(f"extract parts disagree on {key}: {values}")
    expected = 0
    for m in ms:
        if m["samples"][0] != expected:
            raise ExtractError(
                f"part {m['part']} starts at sample {m['samples'][0]}, expected {expected}"
            )
        expected = m["samples"][1]
    positions = sum(m["verification"]["next_token_positions"] for m in ms)
    hits = sum(
        (m["verification"]["next_token_agreement"] or 0) * m["verification"]["next_token_positions"]
        for m in ms
    )
    refs = [
        m["verification"]["reference"]
        for m in ms
        if m["verification"]["reference"] and "max_rel_error" in m["verification"]["reference"]
    ]
    manifest = {
        "format": shards.MANIFEST_FORMAT,
        "root": first["root"],
        "num_samples": expected,
        "samples_per_shard": first["samples_per_shard"],
        "layer_ids": first["layer_ids"],
        "aux_layer_ids": first["aux_layer_ids"],
        "final_layer_id": first["final_layer_id"],
        "hidden_size": first["hidden_size"],
        "storage": first["storage"],
        "tokens": sum(m["tokens"] for m in ms),
        "bytes": sum(m["bytes"] for m in ms),
        "bytes_per_token": sum(m["bytes"] for m in ms) / max(1, sum(m["tokens"] for m in ms)),
        "shards": [s for m in ms for s in m["shards"]],
        "samples_sha256": shards.samples_digest(
            [
                e["sha256"]
                for m in ms
                for s in m["shards"]
                for e in sorted(
                    shard_entries(Path(m["root"]), s["index"]), key=lambda e: e["index"]
                )
            ]
        ),
        "parts": [
            {"part": m["part"], "samples": m["samples"], "this_run": m["this_run"]} for m in ms
        ],
        "verification": {
            "samples_checked": sum(m["verification"]["samples_checked"] for m in ms),
            "next_token_agreement": hits / positions if positions else None,
            "next_token_positions": positions,
            "reference_max_rel_error": max((r["max_rel_error"] for r in refs), default=None),
            "reference_per_layer": refs[0]["max_rel_error_per_layer"] if refs else None,
        },
        "provenance": provenance(cfg, inputs={f"part_{m['part']}": p for m, p in paired}),
    }
    write_json(manifest_out, manifest)
    # Samples left in the reuse pool belong to rows no part has any more: free their disk.
    shutil.rmtree(Path(first["root"]) / REUSE, ignore_errors=True)
    return manifest
