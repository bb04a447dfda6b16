"""Drafters trained elsewhere (the H200), benchmarked on the CPU and replayed on the same outputs.

    .venv/bin/python lab/drafter_replay_cpu.py \\
        --configfile config/gpu-quality.yaml config/gpu-methods.yaml \\
            lab/configs/gpu_methods_blocks.yaml \\
        --home benchmarks/results/gpu_runs/gpu-methods-blocks \\
        --drafter dflash=/work/h200-drafters/results/gpu-methods-blocks/drafter/dflash \\
        --drafter dflash_b8=/work/h200-drafters/results/gpu-methods-blocks/drafter/dflash_b8 \\
        --k dflash=3,7,15 dflash_b8=3,7 --concurrency 8 \\
        --out benchmarks/results/methods/gpu-methods-blocks_cpu_replay.json

What came home from a GPU run is its drafters (config.json, model.safetensors, metrics.json)
and its stats, not its prompt files, baseline outputs or prepared rows. This rebuilds what the
replay needs in a scratch run directory (``--work``) and runs it:

1. the prompt sets, made as the run's ``prompts_train`` and ``prompts_bench`` rules made them
   (the same library calls on the same config sections), checked against what came home
   (``--home``): the training pool's sha256 is the one the run's synth stage read, each set's
   stats and config hash equal the run's;
2. the bench stage's own code (``bench.run_baseline``, ``bench.run``: server, requests,
   Prometheus counters, cache) on the CPU default's vLLM settings with the float32 packaged
   target (``--target``; the drafters' config.json name the GPU host's verifier, so a local
   copy of each names the local target), T = 0, the run's ``bench.max_tokens``, at
   ``--concurrency``, each drafter at every k of ``--k``;
3. ``eagle3_lab.diagnostics.replay.replay_run`` on the baseline's outputs at the same
   concurrency:
   per drafter, k and set the served tau, the replay (on the baseline's text and on the text
   the served run decoded itself, from the bench cache), the replay with the trained block
   for DFlash at k < block_size - 1, the uniform-anchor figure and validation's prediction,
   next to the GPU's served figures (``--home``'s ``h200_drafter_speed.json``).

``--limit N`` benchmarks and replays the first N prompts of each set; a re-run reuses the bench
cache under ``--work``. ``lab/drafter_proposals_cpu.py --run <work>/results/<run>``
then compares vLLM's proposals with the replay's step by step, where the counters disagree.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from drafter_replay import fmt, parse_ks  # the script beside this one

REPO = Path(__file__).resolve().parents[1]

from eagle3_lab.diagnostics.replay import replay_run
from eagle3_lab.results import write_result
from eagle3_pipeline import bench, prompts, target
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.bench import DRAFTER
from eagle3_pipeline.bench import cache as bench_cache
from eagle3_pipeline.runtime import setup_logging
from eagle3_pipeline.runtime.files import (
    iter_jsonl,
    read_json,
    sha256_file,
    write_json,
    write_jsonl,
)
from eagle3_pipeline.runtime.provenance import package_versions

# stats keys that say where and when, not what
VOLATILE = ("seconds", "created", "path", "host", "python", "code", "packages")


def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def make_prompts(cfg: dict, run: Path, home: Path | None) -> dict:
    """The run's prompt sets, as its rules make them (``workflow_scripts/prompts.py``), and
    how they compare with the stats that came home."""
    out = run / "prompts"
    out.mkdir(parents=True, exist_ok=True)
    section = cfglib.job_section(cfg, cfglib.result_config(cfg, "prompts_train"), "prompts")
    prompts.build_train(
        section,
        train_out=out / "train.jsonl.zst",
        stats_out=out / "train.stats.json",
        heldout_out=out / "bench_heldout.jsonl" if section.get("heldout") else None,
        heldout_stats_out=out / "bench_heldout.stats.json" if section.get("heldout") else None,
    )
    for name in cfg["bench"]["prompt_sets"]:
        params = cfglib.result_config(cfg, "prompts_bench", bench_set=name)
        section = cfglib.job_section(cfg, params, "prompts")
        [spec] = section["bench"]
        prompts.build_bench(
            section, spec, out / f"bench_{name}.jsonl", out / f"bench_{name}.stats.json"
        )
    check: dict = {"sets": {}}
    if home is None:
        return check
    synth = home / "synth" / "stats.json"
    if synth.exists():
        read = read_json(synth)["provenance"]["inputs"]["prompts"]["sha256"]
        check["train_pool_sha256"] = {
            "here": sha256_file(out / "train.jsonl.zst"),
            "read_by_the_runs_synth": read,
        }
        check["train_pool_identical"] = read == check["train_pool_sha256"]["here"]
    for stats in sorted((home / "prompts").glob("*.stats.json")):
        mine = out / stats.name
        theirs = read_json(stats)
        entry = {"exists": mine.exists()}
        if mine.exists():
            ours = read_json(mine)
            entry["config_hash_equal"] = (
                ours["provenance"]["config_hash"] == theirs["provenance"]["config_hash"]
            )
            entry["stats_equal"] = strip(ours) == strip(theirs)
            entry["rows"] = ours["output"]["rows"]
        check["sets"][stats.name.removesuffix(".stats.json")] = entry
    check["ok"] = check.get("train_pool_identical", True) and all(
        e.get("stats_equal") and e.get("config_hash_equal") for e in check["sets"].values()
    )
    return check


def local_drafter(src: Path, dst: Path, verifier: str) -> Path:
    """A copy of an exported drafter whose config.json names the local target as verifier
    (the weights linked, metrics.json copied)."""
    dst.mkdir(parents=True, exist_ok=True)
    cfg = read_json(src / "config.json")
    cfg["speculators_config"]["verifier"]["name_or_path"] = verifier
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    weights = dst / "model.safetensors"
    if weights.is_symlink() or weights.exists():
        weights.unlink()
    weights.symlink_to(src.resolve() / "model.safetensors")
    shutil.copyfile(src / "metrics.json", dst / "metrics.json")
    return dst


def served_outputs(cache: Path, drafters, tgt, bench_cfgs, vllm_cfg, prompt_files, conc):
    """Per (drafter, k, set) the outputs its served run decoded (the bench cache keeps them)."""
    out = {}
    for name, d in drafters.items():
        key = bench_cache.drafter_key(str(d.resolve()), tgt, bench_cfgs[name], vllm_cfg)
        for set_name, runs in bench_cache.load_runs(cache, prompt_files, key).items():
            for r in runs or []:
                if r["temperature"] == 0 and r["concurrency"] == conc:
                    out[(name, r["k"], set_name)] = r["rounds"][0][DRAFTER]["outputs"]
    return out


def h200_rows(home: Path | None) -> dict:
    path = home / "h200_drafter_speed.json" if home else None
    if not path or not path.exists():
        return {}
    return {
        (r["method"], r["k"], r["prompt_set"], r["concurrency"]): r
        for r in read_json(path)["rows"]
        if r["temperature"] == 0
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", nargs="+", required=True, help="the run's config files")
    ap.add_argument("--home", help="what came home from the run (stats, manifest, GPU figures)")
    ap.add_argument("--drafter", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--k", nargs="+", required=True, metavar="NAME=K,K")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--sets", nargs="*", help="prompt sets (default: the run's bench sets)")
    ap.add_argument("--limit", type=int, help="the first N prompts of each set")
    ap.add_argument("--target", help="a float32 target.json (default: the packaged model's)")
    ap.add_argument("--work", help="scratch run directory (default /tmp/drafter-replay/<run>)")
    ap.add_argument("--out")
    args = ap.parse_args()
    setup_logging(None)
    t0 = time.monotonic()
    timing = {}

    cfg = cfglib.load_files(args.configfile)
    home = Path(args.home) if args.home else None
    work = Path(args.work or f"/tmp/drafter-replay/{cfg['run']}")
    run = work / "results" / cfg["run"]
    (run / "logs").mkdir(parents=True, exist_ok=True)

    check = make_prompts(cfg, run, home)
    if home is not None and not check["ok"]:
        raise SystemExit(f"the prompt sets differ from the run's: {json.dumps(check, indent=2)}")
    sets = args.sets or cfglib.bench_sets(cfg)
    prompt_files = {}
    for name in sets:
        path = run / "prompts" / f"bench_{name}.jsonl"
        if args.limit:
            rows = list(iter_jsonl(path))[: args.limit]
            path = run / "prompts" / f"bench_{name}.first{args.limit}.jsonl"
            write_jsonl(path, rows)
        prompt_files[name] = str(path)
    # replay_run reads run/prompts/bench_<set>.jsonl: the files benchmarked
    bench_dir = run / "bench"
    bench_dir.mkdir(exist_ok=True)
    timing["prompts_s"] = round(time.monotonic() - t0, 1)

    tj = Path(args.target or REPO / "tests" / ".cache" / "target-float32" / "target.json")
    if not tj.exists():
        target.materialize({"source": "packaged", "dtype": "float32", "path": None}, tj)
    tgt = target.load_info(tj)
    (run / "target").mkdir(exist_ok=True)
    write_json(run / "target" / "target.json", tgt)
    ks = {name: sorted(v) for name, v in parse_ks(args.k, None).items()}
    drafters = {}
    for item in args.drafter:
        name, path = item.split("=", 1)
        drafters[name] = local_drafter(Path(path), run / "drafter" / name, tgt["model_path"])

    vllm_cfg = cfglib.validate({})["vllm"]  # the CPU default's vLLM settings
    bench_cfg = {
        **cfg["bench"],
        "temperatures": [0.0],
        "concurrency": [args.concurrency],
        "pairing": "separate",  # one baseline for every drafter (bench_baseline)
    }
    cache = work / "bench_cache"
    t = time.monotonic()
    baseline_json = bench_dir / "baseline.json"
    bench.run_baseline(
        tj,
        prompt_files,
        baseline_json,
        bench_cfg,
        vllm_cfg,
        cache,
        run / "logs" / "bench_baseline.log",
    )
    timing["baseline_s"] = round(time.monotonic() - t, 1)
    bench_cfgs = {}
    manifest = home / "hidden_states" / "manifest.json"
    for name, d in drafters.items():
        t = time.monotonic()
        bench_cfgs[name] = {**bench_cfg, "num_speculative_tokens": ks[name]}
        bench.run(
            tj,
            d,
            manifest,
            d / "metrics.json",
            prompt_files,
            bench_dir / name / "metrics.json",
            bench_cfgs[name],
            vllm_cfg,
            cache,
            baseline_json=baseline_json,
            log_path=run / "logs" / f"bench_{name}.log",
            name=name,
        )
        timing[f"bench_{name}_s"] = round(time.monotonic() - t, 1)
    if args.limit:  # the replay reads the sets under their own names
        for name, path in prompt_files.items():
            shutil.copyfile(path, run / "prompts" / f"bench_{name}.jsonl")

    t = time.monotonic()
    texts = served_outputs(
        cache, drafters, tgt, bench_cfgs, vllm_cfg, prompt_files, args.concurrency
    )
    result = replay_run(
        run,
        methods=list(drafters),
        ks=ks,
        sets=sets,
        concurrency=args.concurrency,
        served_outputs=texts,
    )
    timing["replay_s"] = round(time.monotonic() - t, 1)

    gpu = h200_rows(home)
    table = []
    by_key = {}
    for r in result["results"]:
        by_key.setdefault((r["method"], r["k"], r["prompt_set"]), []).append(r)
    for (m, k, s), rs in sorted(by_key.items()):
        served = next(r for r in rs if r["as_served"])
        trained = next((r for r in rs if not r["as_served"]), None)
        metrics = read_json(bench_dir / m / "metrics.json")
        brow = next(
            r
            for r in metrics["runs"]
            if r["k"] == k and r["prompt_set"] == s and r["concurrency"] == args.concurrency
        )
        g1 = gpu.get((m, k, s, 1)) or {}
        g8 = gpu.get((m, k, s, 8)) or {}
        table.append(
            {
                "drafter": m,
                "block_size": int(read_json(drafters[m] / "config.json")["block_size"]),
                "k": k,
                "prompt_set": s,
                "requests": brow["requests"],
                "served": brow["acceptance_length"],
                "served_drafts": brow["drafts"],
                "served_accepted": brow["accepted"],
                "replay": served["replay"]["acceptance_length"],
                "replay_drafts": served["replay"]["drafts"],
                "replay_accepted": served["replay"]["accepted"],
                "replay_served_text": (served.get("replay_served_text") or {}).get(
                    "acceptance_length"
                ),
                "replay_served_text_drafts": (served.get("replay_served_text") or {}).get("drafts"),
                "replay_served_text_accepted": (served.get("replay_served_text") or {}).get(
                    "accepted"
                ),
                "served_outputs_differing_from_baseline": brow["outputs_vs_baseline"]["differing"],
                "replay_trained_block": trained["replay"]["acceptance_length"] if trained else None,
                "uniform": served["uniform"]["acceptance_length"],
                "uniform_trained_block": (
                    trained["uniform"]["acceptance_length"] if trained else None
                ),
                "predicted": served["predicted_acceptance_length"],
                "h200_served_c1": g1.get("acceptance_length"),
                "h200_served_c8": g8.get("acceptance_length"),
            }
        )
    cols = [
        ("drafter", "drafter"),
        ("k", "k"),
        ("prompt_set", "set"),
        ("served", "served"),
        ("replay", "replay"),
        ("replay_served_text", "replay (served text)"),
        ("replay_trained_block", "replay, trained block"),
        ("uniform", "uniform"),
        ("uniform_trained_block", "uniform, trained block"),
        ("predicted", "predicted"),
        ("h200_served_c1", "H200 c=1"),
    ]
    print("| " + " | ".join(c[1] for c in cols) + " | drafts/accepted served vs replay |")
    print("|" + "---|" * (len(cols) + 1))
    for row in table:
        counts = (
            f"{row['served_drafts']}/{row['served_accepted']} vs "
            f"{row['replay_drafts']}/{row['replay_accepted']} "
            f"(served text {row['replay_served_text_drafts']}/{row['replay_served_text_accepted']})"
        )
        print("| " + " | ".join(fmt(row[c[0]]) for c in cols) + f" | {counts} |")
    agree = ", ".join(
        f"{name} {fmt(a['rate'])} of {a['checked']}"
        for name, a in result["target_agreement"].items()
    )
    print(f"\ntransformers float32 target's greedy token = the baseline's output: {agree}")
    timing["total_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(timing))
    if args.out:
        baseline = read_json(baseline_json)
        write_result(
            args.out,
            {
                "command": " ".join(["python", *sys.argv]),
                "run": cfg["run"],
                "concurrency": args.concurrency,
                "limit": args.limit,
                "prompts_check": check,
                "bench": bench_cfg,
                "vllm": vllm_cfg,
                "target": {k: tgt[k] for k in ("identity", "source", "name", "gguf_sha256")}
                | {"dtype": tgt["architecture"]["torch_dtype"]},
                "baseline_output_tokens": {
                    s: {
                        "cpu": next(
                            r["output_tokens"]
                            for r in e["runs"]
                            if r["concurrency"] == args.concurrency
                        ),
                        "h200": {
                            str(r["concurrency"]): r["output_tokens"]
                            for r in (
                                read_json(home / "h200_drafter_speed.json")["baseline"].get(s) or []
                            )
                        }
                        if home and (home / "h200_drafter_speed.json").exists()
                        else None,
                    }
                    for s, e in baseline["sets"].items()
                },
                "table": table,
                "replay": result,
                "timing": timing,
                "versions": package_versions(),
            },
        )


if __name__ == "__main__":
    main()
