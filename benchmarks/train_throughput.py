#!/usr/bin/env python3
"""Training throughput at a real drafter shape: the pipeline's train path vs stock speculators.

Builds an 8B-class verifier *config* (Llama, hidden 4096, 32 layers, vocab 128256) with only the
weights the drafter reads (embed_tokens, lm_head, final norm; random), random hidden states in
the pipeline's shards layout (a small pool of unique files, hard-linked to as many samples as the
run needs), a prepare-format dataset whose rows match the pool's token ids, and a 32K draft vocab.
Then, on the same data and with the same hyperparameters, it trains

  ours   eagle3_pipeline.train.run(): config mapping, fingerprint, torchrun + train.entry,
         the sharded hidden-states backend, export, metrics.json
  stock  `speculators train` flags resolved by speculators' own TrainConfig.resolve() and run by
         speculators.train.cli.main(), reading the stock `file` backend from a flat directory of
         hard links to the same files

Both training processes go through eagle3_pipeline.train.entry, so both get the same passive
probes (per-batch DataLoader wait, peak GPU memory, metric records) and the same device bridge
(on GPUs only the H200 fused-loss autotune fix, without which stock speculators crashes at step 0
there; docs/dependencies.md). Reported per run: steady-state tokens/s and s/step (first --warmup
steps excluded), DataLoader wait per step vs step time, trainer-profiled step phases, peak GPU
memory; and ours/stock.

    python3 benchmarks/train_throughput.py --out results.json          # GPU, 8B-class shape
    python3 benchmarks/train_throughput.py --tiny --out tiny.json      # CPU smoke test

Needs torch, transformers, numpy, safetensors, matplotlib and the wheels listed in
lab/gpu/fetch_gpu_wheels.sh (speculators, hs-connectors, datasets, ...). Steady-state
throughput is computed from the timestamps of logged steps (every --log-freq steps; the trainer
synchronizes the GPU on those), so it is wall-clock throughput over the window.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from eagle3_lab.results import write_result

SHAPES = {
    # Llama-3.1-8B-like verifier; 32K draft vocab; speculators' default training shape
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        draft_vocab=32000,
        seq_len=2048,
        total_seq_len=8192,
        pool=32,
        warmup=20,
        steps=100,
        log_freq=10,
    ),
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=4096,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        draft_vocab=512,
        seq_len=128,
        total_seq_len=512,
        pool=8,
        warmup=4,
        steps=16,
        log_freq=2,
    ),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def preflight() -> dict:
    """Import what the runs need; fail fast with the missing package's name."""
    import importlib.metadata as md

    versions = {}
    for mod, dist in (
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("datasets", "datasets"),
        ("safetensors", "safetensors"),
        ("numpy", "numpy"),
        ("matplotlib", "matplotlib"),
        ("pyarrow", "pyarrow"),
        ("speculators", "speculators"),
        ("hs_connectors", "hs-connectors"),
        ("pydantic", "pydantic"),
        ("openai", "openai"),
        ("loguru", "loguru"),
        ("zstandard", "zstandard"),
        ("triton", "triton"),
    ):
        try:
            __import__(mod)
            versions[mod] = md.version(dist)
        except Exception as e:
            if mod == "triton":
                versions[mod] = None
                continue
            raise SystemExit(
                f"preflight: cannot import {mod}: {e!r} (see lab/gpu/fetch_gpu_wheels.sh)"
            ) from e
    if int(versions["pyarrow"].split(".")[0]) < 24:
        raise SystemExit(
            f"preflight: datasets 5.1 needs pyarrow >= 24, found "
            f"{versions['pyarrow']}: lab/gpu/fetch_gpu_wheels.sh --with-pyarrow"
        )
    import speculators.train.cli  # noqa: F401  (the whole trainer import chain)
    import torch

    versions["cuda"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        versions["device"] = torch.cuda.get_device_name()
        versions["gpus_visible"] = torch.cuda.device_count()
    return versions


# ---- data ----------------------------------------------------------------------------------


def build_verifier(d: Path, s: dict) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    if (d / "model.safetensors").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"],
        head_dim=s["head_dim"],
        vocab_size=s["vocab_size"],
        max_position_embeddings=s["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"]},
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        architectures=["LlamaForCausalLM"],
    )
    cfg.save_pretrained(d)
    g = torch.Generator().manual_seed(0)
    v, h = s["vocab_size"], s["hidden_size"]
    save_file(
        {
            "model.embed_tokens.weight": (torch.randn(v, h, generator=g) * 0.02).bfloat16(),
            "lm_head.weight": (torch.randn(v, h, generator=g) * 0.02).bfloat16(),
            "model.norm.weight": torch.ones(h).bfloat16(),
        },
        str(d / "model.safetensors"),
    )
    return d


def build_data(root: Path, verifier: Path, s: dict, num_samples: int, storage: str) -> dict:
    """Pool of random samples, hard-linked into the shards layout and a flat stock dir."""
    import numpy as np
    import torch
    from datasets import Dataset, Features, Sequence, Value
    from safetensors.torch import save_file

    from eagle3_pipeline.hidden_states import shards
    from eagle3_pipeline.target import identity as target_identity

    hs_root, flat = root / "hidden_states", root / "flat_hidden_states"
    marker = root / "data.json"
    if marker.exists():
        return json.loads(marker.read_text())
    shutil.rmtree(root, ignore_errors=True)
    (root / "pool").mkdir(parents=True)
    flat.mkdir(parents=True)
    n_layers, hidden, vocab, seq = (
        s["num_hidden_layers"],
        s["hidden_size"],
        s["vocab_size"],
        s["seq_len"],
    )
    aux = sorted({2, n_layers // 2, n_layers - 3})
    g = torch.Generator().manual_seed(1)
    pool_ids = []
    t0 = time.time()
    for p in range(s["pool"]):
        ids = torch.randint(0, vocab, (seq,), generator=g)
        hs = torch.randn(seq, len(aux) + 1, hidden, generator=g)
        tensors = {"token_ids": ids}
        if storage == "fp8":
            from hs_connectors.fp8_utils import quantize_tensor_to_fp8

            q, scales = quantize_tensor_to_fp8(hs)
            tensors.update(hidden_states=q, hidden_states_scales=scales)
        else:
            tensors["hidden_states"] = hs.bfloat16()
        save_file(tensors, str(root / "pool" / f"pool_{p}.safetensors"))
        pool_ids.append(ids.tolist())
    pool_bytes = sum(f.stat().st_size for f in (root / "pool").iterdir())
    log(
        f"pool: {s['pool']} x {seq} tokens, {pool_bytes / 2**30:.2f} GiB in "
        f"{time.time() - t0:.0f} s"
    )
    sps = 64
    for i in range(num_samples):
        src = root / "pool" / f"pool_{i % s['pool']}.safetensors"
        dst = shards.sample_path(hs_root, i, sps)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.link(src, dst)
        if storage == "bf16":  # the stock file backend reads bf16 files only
            os.link(src, flat / f"hs_{i}.safetensors")
    manifest = {
        "format": shards.MANIFEST_FORMAT,
        "root": str(hs_root),
        "num_samples": num_samples,
        "samples_per_shard": sps,
        "layer_ids": [*aux, n_layers],
        "aux_layer_ids": aux,
        "final_layer_id": n_layers,
        "hidden_size": hidden,
        "storage": storage,
        "target": {"model_path": str(verifier)},
        "shards": [],
        # a content id of the samples (train's fingerprint keys on it): random rows of seed 1
        "samples_sha256": f"random-seed1-pool{s['pool']}-{num_samples}x{seq}-{storage}",
        "verification": {"note": "random hidden states (benchmark)"},
        "provenance": {},
    }
    (hs_root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    rows = [pool_ids[i % s["pool"]] for i in range(num_samples)]
    features = Features(
        {
            "input_ids": Sequence(Value("int64")),
            "loss_mask": Sequence(Value("int64")),
            "seq_len": Value("int64"),
            "sample_id": Value("string"),
        }
    )
    ds = Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[1] * seq] * num_samples,
            "seq_len": [seq] * num_samples,
            "sample_id": [str(i) for i in range(num_samples)],
        },
        features=features,
    )
    ds.set_format(type="torch")
    ds.save_to_disk(str(root / "dataset"))
    # draft vocab: the K most "frequent" ids of the random rows, speculators' offset format
    k = s["draft_vocab"]
    counts = np.bincount(np.asarray(pool_ids).ravel(), minlength=vocab)
    chosen = np.sort(np.argsort(-counts, kind="stable")[:k])
    d2t = (chosen - np.arange(k)).astype(np.int64)
    t2d = np.zeros(vocab, dtype=bool)
    t2d[chosen] = True
    np.save(root / "d2t.npy", d2t)
    np.save(root / "t2d.npy", t2d)
    (root / "target.json").write_text(
        json.dumps(
            {
                "model_path": str(verifier),
                "identity": target_identity({"source": "local"}, Path(verifier)),
                "architecture": {
                    "num_layers": n_layers,
                    "hidden_size": hidden,
                    "vocab_size": vocab,
                },
            }
        )
    )
    out = {
        "dataset": str(root / "dataset"),
        "manifest": str(hs_root / "manifest.json"),
        "flat": str(flat),
        "d2t": str(root / "d2t.npy"),
        "t2d": str(root / "t2d.npy"),
        "target_json": str(root / "target.json"),
        "aux": aux,
        "tokens_per_sample_file_bytes": pool_bytes // s["pool"],
    }
    marker.write_text(json.dumps(out))
    return out


# ---- the two runs --------------------------------------------------------------------------


def hyper(s: dict, args, gpu: bool) -> dict:
    """One hyperparameter set for both runs (speculators' defaults on GPUs)."""
    return {
        "epochs": 1,
        "lr": 1e-3,
        "optimizer": "muon" if gpu else "adamw",
        "scheduler": "linear",
        "warmup_ratio": 0.01,
        "ttt_steps": 3,
        "num_layers": 1,
        "total_seq_len": s["total_seq_len"],
        "attn_impl": "simple_flex_attention" if gpu else "sdpa",
        "sliding_window": 2048,
        "norm_before_fc": True,
        "norm_output": True,
        "hidden_states_dtype": "bfloat16" if gpu else "float32",
        "loss_implementation": args.loss or ("fused" if gpu else "eager"),
        "num_workers": args.workers if args.workers is not None else (12 if gpu else 0),
        "seed": 0,
        "log_freq": args.log_freq,
    }


def run_ours(work: Path, data: dict, h: dict, val_fraction: float, gpus: int) -> dict:
    from eagle3_pipeline import train
    from eagle3_pipeline.train import metrics

    cfg = {
        **h,
        "gpus": gpus,
        "fsdp": False,
        "val_fraction": val_fraction,
        "extra_args": {"mask_token_id": 0, "checkpoint_freq": 1.0},
    }
    out = work / "ours"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.time()
    train.run(
        target_json=data["target_json"],
        dataset_dir=data["dataset"],
        manifest_path=data["manifest"],
        d2t=data["d2t"],
        t2d=data["t2d"],
        drafter_dir=str(out / "drafter"),
        metrics_out=str(out / "drafter/metrics.json"),
        plot_out=str(out / "drafter/loss.png"),
        cfg=cfg,
        work_dir=str(out / "work"),
        log_path=str(out / "train.log"),
    )
    return {
        "records": metrics.read_records(out / "work" / metrics.RECORDS),
        "wall_s": time.time() - t0,
        "log": str(out / "train.log"),
    }


def stock_flags(work: Path, data: dict, h: dict, verifier: str, val_fraction: float) -> list:
    # checkpoint_freq stays at speculators' default (1 per epoch), as in ours above
    return [
        "--verifier-name-or-path",
        verifier,
        "--data-path",
        data["dataset"],
        "--hidden-states-backend",
        "file",
        "--hidden-states-path",
        data["flat"],
        "--on-missing",
        "raise",
        "--d2t-path",
        data["d2t"],
        "--t2d-path",
        data["t2d"],
        "--draft-vocab-size",
        str(len(__import__("numpy").load(data["d2t"]))),
        "--target-layer-ids",
        *map(str, data["aux"]),
        "--mask-token-id",
        "0",
        "--num-layers",
        str(h["num_layers"]),
        "--sliding-window",
        str(h["sliding_window"]),
        "--draft-attn-impl",
        h["attn_impl"],
        "--loss-implementation",
        h["loss_implementation"],
        "--ttt-steps",
        str(h["ttt_steps"]),
        "--optimizer",
        h["optimizer"],
        "--lr",
        str(h["lr"]),
        "--scheduler-type",
        h["scheduler"],
        "--scheduler-warmup-ratio",
        str(h["warmup_ratio"]),
        "--epochs",
        str(h["epochs"]),
        "--total-seq-len",
        str(h["total_seq_len"]),
        "--train-data-ratio",
        str(1 - val_fraction),
        "--hidden-states-dtype",
        h["hidden_states_dtype"],
        "--num-workers",
        str(h["num_workers"]),
        "--log-freq",
        str(h["log_freq"]),
        "--seed",
        str(h["seed"]),
        "--save-path",
        str(work / "checkpoints"),
        "--log-dir",
        str(work / "logs"),
    ]


def run_stock(
    work: Path, data: dict, h: dict, verifier: str, val_fraction: float, gpus: int
) -> dict:
    from eagle3_pipeline.train import launcher, metrics

    out = work / "stock"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    records = out / "metrics.jsonl"
    entry = [
        "-m",
        "eagle3_pipeline.train.entry",
        "--stock",
        str(records),
        "--",
        *stock_flags(out, data, h, verifier, val_fraction),
    ]
    cmd = (
        [sys.executable, *entry]
        if gpus == 0
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={gpus}",
            *entry,
        ]
    )
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    t0 = time.time()
    with open(out / "train.log", "wb") as fh:
        rc = subprocess.call(cmd, env=launcher.child_env(gpus), stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = (out / "train.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"stock run failed (rc {rc}); log tail:\n{tail}")
    return {
        "records": metrics.read_records(records),
        "wall_s": time.time() - t0,
        "log": str(out / "train.log"),
    }


# ---- analysis ------------------------------------------------------------------------------


def analyze(run: dict, warmup: int, world_size: int) -> dict:
    recs = run["records"]
    train_recs = sorted((r for r in recs if r["kind"] == "train"), key=lambda r: r["global_step"])
    steady = [r for r in train_recs if r["global_step"] >= warmup]
    if len(steady) < 2:
        raise SystemExit(
            f"too few logged steps after warmup ({len(steady)}); raise the "
            "sample count or lower --warmup/--log-freq"
        )
    tok_per_step = statistics.mean(
        r["profile"]["tokens_per_s"] * r["profile"]["step_ms"] / 1000 for r in steady
    )
    first, last = steady[0], steady[-1]
    n_steps = last["global_step"] - first["global_step"]
    span = last["t"] - first["t"]
    loader = [r for r in recs if r["kind"] == "loader" and r["i"] >= warmup]
    waits = sorted(r["wait_s"] for r in loader)
    end = next((r for r in recs if r["kind"] == "end"), {})
    profile = {
        k: statistics.median(r["profile"][k] for r in steady)
        for k in ("step_ms", "fetch_ms", "fwd_ms", "bwd_ms", "opt_ms", "queue_ms")
    }
    step_s = span / n_steps
    return {
        "tokens_per_s": tok_per_step * n_steps / span * world_size,
        "tokens_per_s_per_gpu": tok_per_step * n_steps / span,
        "s_per_step": step_s,
        "tokens_per_step": tok_per_step,
        "steady_steps": n_steps,
        "loader_wait_ms_mean": 1000 * statistics.mean(waits) if waits else None,
        "loader_wait_ms_p95": 1000 * waits[int(0.95 * (len(waits) - 1))] if waits else None,
        "loader_wait_ms_max": 1000 * waits[-1] if waits else None,
        "loader_wait_fraction": (statistics.mean(waits) / step_s) if waits else None,
        "profile_median_ms": profile,
        "peak_gpu_allocated_gib": end.get("peak_allocated_gib"),
        "peak_gpu_reserved_gib": end.get("peak_reserved_gib"),
        "bridges": next((r.get("bridges") for r in recs if r["kind"] == "start"), None),
        "wall_s": run["wall_s"],
        "first_step_s": (train_recs[0]["t"] - next(r["t"] for r in recs if r["kind"] == "start"))
        if train_recs
        else None,
        "log": run["log"],
    }


def table(results: dict) -> str:
    rows = [
        ("tokens/s (steady, all GPUs)", "tokens_per_s", "{:,.0f}"),
        ("s/step", "s_per_step", "{:.3f}"),
        ("tokens/step", "tokens_per_step", "{:,.0f}"),
        ("loader wait/step mean (ms)", "loader_wait_ms_mean", "{:.2f}"),
        ("loader wait/step p95 (ms)", "loader_wait_ms_p95", "{:.2f}"),
        ("loader wait / step time", "loader_wait_fraction", "{:.2%}"),
        ("peak GPU allocated (GiB)", "peak_gpu_allocated_gib", "{:.1f}"),
        ("peak GPU reserved (GiB)", "peak_gpu_reserved_gib", "{:.1f}"),
        ("first step after start (s)", "first_step_s", "{:.0f}"),
        ("run wall time (s)", "wall_s", "{:.0f}"),
    ]
    names = [n for n in ("ours", "stock") if n in results]
    lines = [f"{'':32s}" + "".join(f"{n:>16s}" for n in names)]
    for label, key, fmt in rows:
        cells = []
        for n in names:
            v = results[n].get(key)
            cells.append(f"{fmt.format(v) if v is not None else 'n/a':>16s}")
        lines.append(f"{label:32s}" + "".join(cells))
    for phase in ("step_ms", "fetch_ms", "fwd_ms", "bwd_ms", "opt_ms"):
        cells = [f"{results[n]['profile_median_ms'][phase]:16.1f}" for n in names]
        lines.append(f"{'profiled ' + phase + ' (median)':32s}" + "".join(cells))
    if "ratio_ours_over_stock" in results:
        lines.append(
            f"ours / stock tokens/s: {results['ratio_ours_over_stock']:.3f} (goal >= 0.95)"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shape (CPU smoke test)")
    ap.add_argument("--out", type=Path, help="write the results JSON here")
    ap.add_argument("--work", type=Path, default=Path("/tmp/eagle3-train-bench"))
    ap.add_argument("--gpus", type=int, default=None, help="default: 1 if CUDA else 0")
    ap.add_argument("--steps", type=int, help="steady-state steps to time")
    ap.add_argument("--warmup", type=int, help="first steps left out (compile, worker start)")
    ap.add_argument("--pool", type=int, help="unique hidden-state files (rest are hard links)")
    ap.add_argument("--log-freq", type=int, help="trainer logs (and syncs) every N steps")
    ap.add_argument("--workers", type=int, default=None, help="DataLoader workers")
    ap.add_argument("--loss", choices=["fused", "eager"], default=None)
    ap.add_argument(
        "--storage",
        choices=["bf16", "fp8"],
        default="bf16",
        help="fp8 runs ours only (the stock file backend reads bf16)",
    )
    ap.add_argument("--only", choices=["ours", "stock"], default=None)
    args = ap.parse_args()

    versions = preflight()
    import torch

    gpus = args.gpus if args.gpus is not None else (1 if torch.cuda.is_available() else 0)
    s = dict(SHAPES["tiny" if args.tiny else "8b"])
    for key in ("steps", "warmup", "pool", "log_freq"):
        if getattr(args, key):
            s[key] = getattr(args, key)
    args.log_freq = s["log_freq"]
    log(f"versions: {versions}; gpus={gpus}; shape={'tiny' if args.tiny else '8b'}")
    per_step = s["total_seq_len"] // s["seq_len"]
    train_samples = per_step * gpus if gpus else per_step
    train_samples *= s["warmup"] + s["steps"] + 2
    val_samples = 2 * per_step
    n = train_samples + val_samples
    val_fraction = val_samples / n
    args.work.mkdir(parents=True, exist_ok=True)
    verifier = build_verifier(args.work / "verifier", s)
    data = build_data(args.work / f"data_{n}_{args.storage}", verifier, s, n, args.storage)
    h = hyper(s, args, gpu=gpus > 0)
    log(f"{n} samples x {s['seq_len']} tokens ({val_samples} validation), hyperparameters {h}")

    results: dict = {
        "versions": versions,
        "shape": s,
        "hyperparameters": h,
        "gpus": gpus,
        "samples": n,
        "storage": args.storage,
    }
    world = max(1, gpus)
    if args.only in (None, "ours"):
        log("run 1/2: ours (eagle3_pipeline.train.run)")
        results["ours"] = analyze(
            run_ours(args.work, data, h, val_fraction, gpus), s["warmup"], world
        )
        log(f"ours: {results['ours']['tokens_per_s']:,.0f} tokens/s")
    if args.only in (None, "stock") and args.storage == "bf16":
        log("run 2/2: stock speculators train")
        results["stock"] = analyze(
            run_stock(args.work, data, h, str(verifier), val_fraction, gpus), s["warmup"], world
        )
        log(f"stock: {results['stock']['tokens_per_s']:,.0f} tokens/s")
    if "ours" in results and "stock" in results:
        results["ratio_ours_over_stock"] = (
            results["ours"]["tokens_per_s"] / results["stock"]["tokens_per_s"]
        )
    text = table(results)
    print(text, flush=True)
    results["table"] = text
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result(args.out, results)
        log(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
