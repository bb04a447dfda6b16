"""Extract stage: hidden states of the training rows from the target, through vLLM.

One job per part of the rows (``extract.jobs``; one model load each). A part starts a vLLM
server with the ``extract_hidden_states`` speculative method and a KV connector
(``vllm_connector``), sends every row's token ids as a 1-token completion (speculators'
client), verifies each returned sample (shape, ids, finite, next-token agreement), moves it
into its shard and journals it. Shards are sealed with a checksum list once complete; the part
manifest is written last. A re-run keeps every sample whose file still matches its checksum
and redoes the rest; a change of inputs or parameters discards the part's shards.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from . import client as client_lib
from . import shards
from .fileio import AppendLog, read_json, sha256_bytes, stable_hash, write_json
from .layers import LayerIdError, resolve_layers  # noqa: F401  (re-exported)
from .plan import DiskBudgetError, check_disk, sample_bytes  # noqa: F401  (re-exported)
from .provenance import provenance
from .runtime import Progress, for_each
from .server import VllmServer
from .serving import spec_for_target
from .target import load_info
from .verify import NextTokenProbe, VerificationError, check_sample, model_fits, reference_errors

log = logging.getLogger(__name__)

CONNECTOR = "PipelineHiddenStatesConnector"
CONNECTOR_MODULE = "eagle3_pipeline.vllm_connector"


class ExtractError(RuntimeError):
    pass


# ---- layers, sizes, fingerprints -----------------------------------------------------------


def row_key(input_ids) -> str:
    """A row's key for reuse: its token ids (what the target is asked to prefill)."""
    return sha256_bytes(np.asarray(input_ids, dtype=np.int64).tobytes())


# ---- shard bookkeeping ------------------------------------------------------------------------

# Finished samples whose key no row of this part has any more wait here for a row that has it
# (after an edit of the prompts, prepare's shuffle puts unchanged rows at other indices):
#   <root>/reuse/<capture fingerprint>/<row key>.safetensors  (+ .json: its journal entry)
REUSE = "reuse"


class ShardBook:
    """Which samples of a part are done: sealed shards (shard.json) and journals of open ones.

    A sample counts as done only if its file is intact (its recorded size and modification
    time, or else its recorded sha256) and holds the row now at its index (its recorded key,
    when ``keys`` are given). An intact file of another row moves to the reuse pool, from
    which :meth:`adopt` takes it for the row that has its key.
    """

    def __init__(
        self,
        root: Path,
        samples_per_shard: int,
        rows: range,
        keys: dict[int, str] | None = None,
        pool: Path | None = None,
    ):
        self.root, self.S, self.rows = root, samples_per_shard, rows
        self.keys, self.pool = keys, pool
        self.done: dict[int, dict] = {}
        self.corrupt: list[int] = []
        self.pooled = 0
        self._journals: dict[int, AppendLog] = {}

    def shards(self) -> list[int]:
        if not len(self.rows):
            return []
        return list(
            range(
                shards.shard_index(self.rows[0], self.S),
                shards.shard_index(self.rows[-1], self.S) + 1,
            )
        )

    def shard_samples(self, s: int) -> range:
        lo = max(s * self.S, self.rows.start)
        return range(lo, min((s + 1) * self.S, self.rows.stop))

    def scan(self, workers: int = 8) -> None:
        entries: dict[int, dict] = {}
        for s in self.shards():
            entries.update((e["index"], e) for e in shard_entries(self.root, s))
        with ThreadPoolExecutor(workers) as pool:
            ok = list(pool.map(lambda e: intact(self.root, e, self.S), entries.values()))
        for e, good in zip(entries.values(), ok, strict=True):
            i = e["index"]
            if not good:
                self.corrupt.append(i)
            elif i in self.rows and (self.keys is None or e.get("key") == self.keys.get(i)):
                self.done[i] = e
            elif self.pool is not None and e.get("key"):
                # another row's sample (rows moved, or fewer rows): kept for the row that has it
                to_pool(shards.sample_path(self.root, i, self.S), e, self.pool)
                self.pooled += 1
        for s in self.shards():  # a shard whose seal no longer describes it is reopened
            seal = shards.shard_dir(self.root, s) / "shard.json"
            if seal.exists():
                sealed = {e["index"] for e in read_json(seal)["samples"]}
                if sealed != set(self.shard_samples(s)) or not sealed <= set(self.done):
                    self._reopen(s, seal)
        self._drop_strays()

    def _reopen(self, s: int, seal: Path) -> None:
        journal = AppendLog(seal.parent / "journal.jsonl")
        journal.open()
        for i in self.shard_samples(s):
            if i in self.done:
                journal.append(self.done[i])
        journal.close()
        seal.unlink()

    def _drop_strays(self) -> None:
        """Remove files not backed by a journal entry (e.g. written just before a kill)."""
        for s in self.shards():
            d = shards.shard_dir(self.root, s)
            if not d.exists():
                continue
            for f in d.glob("hs_*.safetensors*"):
                idx = int(f.name.split("_")[1].split(".")[0])
                if idx not in self.done:
                    f.unlink()

    def adopt(self, index: int) -> bool:
        """Take row ``index``'s sample from the reuse pool (by its key); True if it was there."""
        if self.pool is None or self.keys is None:
            return False
        key = self.keys[index]
        src, side = self.pool / f"{key}.safetensors", self.pool / f"{key}.json"
        try:
            entry = read_json(side)
        except (OSError, ValueError):
            return False
        entry = {**entry, "index": index}
        dest = shards.sample_path(self.root, index, self.S)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(src, dest)  # atomic: of two parts wanting it, one gets it
        except FileNotFoundError:
            return False
        side.unlink(missing_ok=True)
        if not intact(self.root, entry, self.S):
            dest.unlink(missing_ok=True)
            return False
        self.record(entry)
        return True

    def record(self, entry: dict) -> None:
        i = entry["index"]
        s = shards.shard_index(i, self.S)
        j = self._journals.get(s)
        if j is None:
            shards.shard_dir(self.root, s).mkdir(parents=True, exist_ok=True)
            j = self._journals[s] = AppendLog(shards.shard_dir(self.root, s) / "journal.jsonl")
            j.open()
        j.append(entry)
        self.done[i] = entry
        if all(k in self.done for k in self.shard_samples(s)):
            self.seal(s)

    def seal(self, s: int) -> None:
        d = shards.shard_dir(self.root, s)
        samples = [self.done[k] for k in self.shard_samples(s)]
        write_json(d / "shard.json", {"index": s, "samples": samples})
        if s in self._journals:
            self._journals.pop(s).close()
        (d / "journal.jsonl").unlink(missing_ok=True)

    def close(self) -> None:
        for j in self._journals.values():
            j.close()
        self._journals.clear()

    def summary(self, s: int) -> dict[str, Any]:
        samples = [self.done[k] for k in self.shard_samples(s)]
        h = sha256_bytes("".join(e["sha256"] for e in samples).encode())
        return {
            "index": s,
            "samples": [samples[0]["index"], samples[-1]["index"]],
            "count": len(samples),
            "tokens": sum(e["tokens"] for e in samples),
            "bytes": sum(e["bytes"] for e in samples),
            "sha256": h,
        }


def shard_entries(root: Path, s: int) -> list[dict]:
    """The recorded samples of shard ``s``: its seal, or the journal of an open shard."""
    d = shards.shard_dir(root, s)
    if (d / "shard.json").exists():
        return read_json(d / "shard.json")["samples"]
    return AppendLog(d / "journal.jsonl").read()


def intact(root: Path, entry: dict, samples_per_shard: int) -> bool:
    """The sample file of ``entry`` is as recorded: its size, and its modification time or,
    where that differs (a copy, a rewrite), its sha256. Hashing every file of a large
    extraction takes many minutes, so an untouched file is trusted by its metadata."""
    path = shards.sample_path(root, entry["index"], samples_per_shard)
    try:
        st = path.stat()
        if st.st_size != entry["bytes"]:
            return False
        if entry.get("mtime_ns") == st.st_mtime_ns:
            return True
        return sha256_bytes(path.read_bytes()) == entry["sha256"]
    except OSError:
        return False


def to_pool(path: Path, entry: dict, pool: Path) -> None:
    """Move a finished sample into the reuse pool under its key (entry first, then file)."""
    pool.mkdir(parents=True, exist_ok=True)
    write_json(pool / f"{entry['key']}.json", {k: v for k, v in entry.items() if k != "index"})
    os.replace(path, pool / f"{entry['key']}.safetensors")


def reset_layout(root: Path, capture: str, samples_per_shard: int, num_samples: int) -> Path:
    """Make the stored samples under ``root`` fit this run; return its reuse pool.

    Runs in every part under one lock. Samples of another capture (target, layers, storage,
    server numerics) are deleted. Samples stored under another ``samples_per_shard``, or in
    shards past the end of the rows (fewer rows than before), move to the reuse pool.
    """
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".layout.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        layout_file = root / "layout.json"
        old = read_json(layout_file) if layout_file.exists() else {}
        pool = root / REUSE / capture
        if old.get("capture") != capture:
            if (root / "shards").exists() or (root / REUSE).exists():
                log.info("target, layers or storage changed: removing the stored hidden states")
            shutil.rmtree(root / "shards", ignore_errors=True)
            shutil.rmtree(root / REUSE, ignore_errors=True)
            old = {}
        old_S = old.get("samples_per_shard", samples_per_shard)
        last_shard = -(-num_samples // samples_per_shard) - 1 if old_S == samples_per_shard else -1
        for d in sorted((root / "shards").glob("shard_*")) if (root / "shards").exists() else []:
            s = int(d.name.split("_")[1])
            if s <= last_shard:
                continue
            for e in shard_entries(root, s):
                if e.get("key") and intact(root, e, old_S):
                    to_pool(shards.sample_path(root, e["index"], old_S), e, pool)
            shutil.rmtree(d)
        write_json(layout_file, {"capture": capture, "samples_per_shard": samples_per_shard})
    return pool


# ---- the client ------------------------------------------------------------------------------


class Extractor:
    """Send rows, verify and store what comes back."""

    def __init__(
        self,
        dataset,
        book: ShardBook,
        probe: NextTokenProbe,
        layer_ids: list[int],
        hidden: int,
        cfg: dict,
        staging: Path,
    ):
        self.ds, self.book, self.probe = dataset, book, probe
        self.layer_ids, self.hidden, self.cfg, self.staging = layer_ids, hidden, cfg, staging
        self.hits = self.checked = 0
        self.failures: list[dict] = []
        self.timings: dict[str, float] = {}  # validator seconds per phase (all samples)

    def store(self, index: int, staged: str) -> dict:
        """Verify a staged file and move it into its shard (runs in a worker thread).

        The checks run where the probe's lm_head lives (a GPU when the job has one)."""
        from safetensors.torch import load

        clock = time.perf_counter
        t = [clock()]
        lock = staged + ".lock"
        if os.path.exists(lock):
            # The connector holds an exclusive flock while it writes; a shared one sleeps until
            # it is done (no polling latency holding a request slot).
            with open(lock) as lf:
                fcntl.flock(lf, fcntl.LOCK_SH)
            os.unlink(lock)
        t.append(clock())
        row = self.ds[index]
        data = Path(staged).read_bytes()
        t.append(clock())
        tensors = load(data)
        t.append(clock())
        hidden = shards.dequantize(tensors, self.probe.device)
        check_sample(
            hidden, tensors["token_ids"], row["input_ids"], len(self.layer_ids), self.hidden
        )
        t.append(clock())
        hits, checked = self.probe.agreement(
            hidden[:, -1],
            row["input_ids"],
            row["loss_mask"],
            self.cfg["agreement_positions_per_sample"],
        )
        t.append(clock())
        digest = sha256_bytes(data)
        dest = shards.sample_path(self.book.root, index, self.book.S)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, dest)
        mtime_ns = dest.stat().st_mtime_ns
        t.append(clock())
        phases = ("wait_write", "read", "parse", "checks", "probe", "hash_move")
        for phase, (a, b) in zip(phases, itertools.pairwise(t), strict=True):
            self.timings[phase] = self.timings.get(phase, 0.0) + (b - a)
        return {
            "index": index,
            "key": row_key(row["input_ids"]),
            "tokens": len(row["input_ids"]),
            "bytes": len(data),
            "sha256": digest,
            "mtime_ns": mtime_ns,
            "agree": [hits, checked],
        }

    async def run(
        self, base_url: str, model: str, todo: list[int], progress: Progress, check_alive
    ) -> None:
        import torch
        from speculators.data_generation.vllm_client import generate_hidden_states_async

        failures_in_a_row = 0

        async def one(client, index: int) -> None:
            nonlocal failures_in_a_row
            ids = self.ds[index]["input_ids"]
            try:
                staged, _ = await generate_hidden_states_async(
                    client,
                    model,
                    {"input_ids": ids},
                    timeout=self.cfg["request_timeout_s"],
                    max_retries=self.cfg["retries"],
                )
                entry = await loop.run_in_executor(pool, self.store, index, staged)
            except VerificationError as e:
                raise ExtractError(
                    f"sample {index}: {e}. The extracted hidden states are "
                    "wrong; nothing of this sample was kept."
                ) from e
            except Exception as e:
                check_alive()
                failures_in_a_row += 1
                self.failures.append({"index": index, "error": f"{type(e).__name__}: {e}"})
                log.warning("sample %d failed: %s", index, e)
                if failures_in_a_row >= max(8, self.cfg["concurrency"]):
                    raise ExtractError(
                        f"{failures_in_a_row} samples in a row failed (last: {e})"
                    ) from e
                return
            failures_in_a_row = 0
            self.book.record(entry)
            self.hits += entry["agree"][0]
            self.checked += entry["agree"][1]
            progress.update(1, extra=entry["tokens"])

        loop = asyncio.get_running_loop()
        # A few validator threads with one torch thread each: more would oversubscribe the
        # cores the server needs (on the CPU) without validating faster.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        pool = ThreadPoolExecutor(
            max(1, min(self.cfg["concurrency"], (os.cpu_count() or 2) // 2)),
            thread_name_prefix="validate",
        )
        try:
            # speculators' request function retries (extract.retries) with its own per-attempt
            # timeout: the client itself does not retry on top of it
            client = client_lib.async_client(
                base_url, timeout=self.cfg["request_timeout_s"], max_retries=0
            )
            async with client:
                await for_each(todo, lambda i: one(client, i), self.cfg["concurrency"])
        finally:
            pool.shutdown(wait=True)
            torch.set_num_threads(threads)


# ---- the stage -------------------------------------------------------------------------------


# Bump when a change alters what a stored sample holds for the same row (the capture, its
# storage format): every stored sample is then extracted again.
CAPTURE_FORMAT = 1


def capture_fingerprint(target: dict, layer_ids: list[int], cfg: dict, vllm_cfg: dict) -> str:
    """What a stored sample depends on besides its row's token ids."""
    return stable_hash(
        {
            "format": CAPTURE_FORMAT,
            "target": target["identity"],
            "layer_ids": layer_ids,
            "storage": cfg["storage"],
            "device": vllm_cfg["device"],
            "dtype": vllm_cfg["dtype"],
        }
    )


def _capture_modules() -> None:
    """Never called. The server runs the connector that writes the samples (by module path,
    CONNECTOR_MODULE); importing it here puts it into this stage's code hash
    (eagle3_pipeline.workflow.code_hash)."""
    from . import vllm_connector  # noqa: F401


def server_spec(vllm_cfg: dict, target: dict, layer_ids: list[int], staging: Path, cfg: dict):
    return spec_for_target(
        vllm_cfg,
        target,
        extra_args=cfg["server_args"],
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
        },
        kv_transfer_config={
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {
                "shared_storage_path": str(staging),
                "storage": cfg["storage"],
            },
        },
    )


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
        cfg["disk_margin"],
        allow=allow_low_disk,
    )
    staging = root / ".staging" / f"part_{part}"
    ex = None
    t0 = time.monotonic()
    try:
        if todo:
            staging.mkdir(parents=True, exist_ok=True)
            probe = NextTokenProbe(target["model_path"], arch, cfg["verify_device"])
            ex = Extractor(ds, book, probe, layer_ids, arch["hidden_size"], cfg, staging)
            spec = server_spec(vllm_cfg, target, layer_ids, staging, cfg)
            progress = Progress(
                len(rows), f"extract part {part}", unit="samples", done=len(book.done)
            )
            with VllmServer(spec, log_path) as server:
                asyncio.run(
                    ex.run(server.base_url, server.model_name, todo, progress, server.check_alive)
                )
    finally:
        book.close()
    elapsed = time.monotonic() - t0
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
        "min_next_token_agreement": cfg["min_next_token_agreement"],
        "synth_temperature": synth_temperature,
        "reference": reference,
        "redone_after_checksum_failure": len(book.corrupt),
    }
    enforce(verification, cfg)
    tokens_this_run = sum(seq_lens[i] for i in todo)
    manifest = {
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
            "elapsed_s": round(elapsed, 2),
            "validator_s_per_phase": {k: round(v, 2) for k, v in ex.timings.items()} if ex else {},
            "tokens_per_s": round(tokens_this_run / elapsed, 1) if todo else None,
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
    checked = list(rows)[: cfg["reference_rows"]]
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
    if (
        ref.get("max_rel_error") is not None
        and ref["max_rel_error"] > cfg["max_reference_rel_error"]
    ):
        raise ExtractError(
            f"hidden states differ from a transformers forward by "
            f"{ref['max_rel_error']:.3g} (per layer: "
            f"{ref['max_rel_error_per_layer']}) > extract.max_reference_rel_error"
        )


def gather(parts: list, manifest_out, cfg: dict) -> dict:
    """Merge part manifests; check they agree and cover every sample exactly once."""
    # Each manifest stays paired with its own file: sorted by part number, not by path text
    # (as text, part_10.json sorts before part_2.json).
    paired = sorted(((read_json(p), p) for p in parts), key=lambda mp: mp[0]["part"])
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
