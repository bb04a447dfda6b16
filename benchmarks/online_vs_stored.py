#!/usr/bin/env python
"""extract.mode online against stored on the CPU: τ, the disk's high-water mark of hidden
states, and the wall time of extraction plus training, with the same seed.

    PYTHONPATH=src .venv/bin/python benchmarks/online_vs_stored.py --work /tmp/online-vs-stored \\
        --out benchmarks/results/online/online_vs_stored.json \\
        [--configfile benchmarks/configs/online_vs_stored.yaml]

Runs the workflow (config/config.yaml, then the --configfile given) in ``<work>`` twice, one
after the other in the same run directory: first with ``extract.mode: stored`` from scratch,
then with ``extract.mode: online``, which re-runs training, bench and report only (synth,
prepare and vocab are the same rows for both). While each runs, a thread sums the bytes of
every hidden-state file under the run directory (the extract stage's shards and staging, the
train jobs' staging and hybrid cache) every 0.2 s: the high-water mark. The wall times are
Snakemake's own per-job benchmark files (extract parts + gather + train against train); τ is
the bench stage's acceptance length per prompt set; the drafters' weights are compared by
their sha256. Writes one JSON file (--out).

With ``--rounds N`` it then times training alone, stored against online, in N alternating
rounds (the order reversed every round; ``eagle3_lab.rounds``): each training from a fresh
training directory (the method's ``train_work/`` and ``drafter/`` removed first, so nothing is
resumed or re-exported) with ``train.epochs`` ``--epochs``, up to ``train``; the figures are the
train job's seconds (an online job's include its servers' start), the trainer's tokens/s per
epoch, the seconds of each training and validation epoch and of an online job's server start
(from the job's log: the epochs alone, without the job's fixed costs) and the disk's high-water
mark (the first method of train.methods only); with ``--keep-drafters DIR`` each mode's drafter
of the last round is copied to ``DIR/<mode>`` (to measure the two drafters' acceptance side by
side, e.g. with lab/drafter_tau.py) and every training's log to ``DIR/logs/<mode>_<n>.log``.
On a GPU (the data made once, no whole runs; the run's synth journal, if carried in, reused):

    PYTHONPATH=src python3 benchmarks/online_vs_stored.py --work . --reuse-work \
        --base config/gpu-quality.yaml --configfile lab/configs/gpu_quality_levers.yaml \
        --smk-args "--resources gpus=1" --skip-full --rounds 3 --epochs 1 --out rounds.json
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import itertools
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from eagle3_lab import rounds as rounds_lib
from eagle3_lab.results import write_result
from eagle3_lab.train_log import phase_seconds

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]  # (a host may have no snakemake script)


class DiskPeak:
    """The most bytes of one mode's hidden-state sample files seen at once, polled every
    ``interval`` s: stored, every file under the run's ``hidden_states/`` (shards, the extract
    jobs' staging); online, every file under each train job's ``train_work/<method>/online/``
    (its servers' staging, hybrid's cache); not the training checkpoints. Also the machine's
    load while it polls (other work on the machine slows the run)."""

    def __init__(self, run: Path, mode: str, interval: float = 0.2):
        self.run, self.mode, self.interval = run, mode, interval
        self.peak = self.samples = 0
        self.loads: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def roots(self) -> list[Path]:
        # Each mode's own files: the online run follows the stored one in the same directory,
        # whose extract stage's shards stay there (no job of the online run touches them)
        if self.mode == "stored":
            return [self.run / "hidden_states"]
        return list(self.run.glob("train_work/*/online"))

    def now(self) -> int:
        total = 0
        for root in self.roots():
            for dirpath, _, files in os.walk(root):
                for f in files:
                    if ".safetensors" in f:
                        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                            total += os.stat(os.path.join(dirpath, f)).st_size
        return total

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self.samples += 1
            if self.samples % 25 == 1:
                self.loads.append(os.getloadavg()[0])
            self._stop.wait(self.interval)

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# Snakemake options before --cores (e.g. --resources gpus=1, which takes every word up to the
# next option), from --smk-args
SMK_ARGS: list[str] = []


def snakemake(work: Path, configs: list[str], *extra: str, targets: tuple = ()) -> float:
    cmd = [
        *SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(work),
        *map(str, targets),  # (before options that take several words)
        *SMK_ARGS,
        "--cores",
        "all",
        "--configfile",
        *configs,
        *extra,
    ]
    path = [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    t0 = time.monotonic()
    with open(work / "snakemake.log", "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - t0


def job_seconds(run: Path, prefix: str) -> float:
    """Wall seconds of the jobs whose Snakemake benchmark file starts with ``prefix``."""
    total = 0.0
    for f in sorted((run / "benchmarks").glob(f"{prefix}*.tsv")):
        with open(f) as fh:
            total += float(next(csv.DictReader(fh, delimiter="\t"))["s"])
    return total


def outcome(run: Path, method: str) -> dict:
    bench = json.loads((run / "bench" / method / "metrics.json").read_text())
    train = json.loads((run / "drafter" / method / "metrics.json").read_text())
    weights = (run / "drafter" / method / "model.safetensors").read_bytes()
    return {
        "acceptance_length": {
            r["prompt_set"]: r["acceptance_length"] for r in bench["runs"] if r["temperature"] == 0
        },
        "val_loss_per_epoch": [e["val"]["loss"] for e in train["epochs"]],
        "drafter_weights_sha256": hashlib.sha256(weights).hexdigest(),
        "hidden_states": train.get("hidden_states"),
    }


def train_alone(
    work: Path,
    configs: list[str],
    run: Path,
    method: str,
    mode: str,
    epochs: int,
    keep: Path | None,
):
    """One training from scratch in ``mode``, up to train: its figures for the rounds (and its
    drafter copied to ``keep/<mode>``, replacing an earlier round's)."""

    trainings = 0

    def once() -> dict:
        nonlocal trainings
        for d in (run / "train_work" / method, run / "drafter" / method):
            shutil.rmtree(d, ignore_errors=True)
        extra = ["--config", f"extract={{mode: {mode}}}", f"train={{epochs: {epochs}}}"]
        metrics_file = run / "drafter" / method / "metrics.json"
        with DiskPeak(run, mode) as disk:  # this method's training only
            snakemake(work, configs, *extra, targets=[metrics_file.relative_to(work)])
        metrics = json.loads(metrics_file.read_text())
        log = run / "logs" / f"train_{method}.log"
        if keep:
            shutil.rmtree(keep / mode, ignore_errors=True)
            shutil.copytree(run / "drafter" / method, keep / mode)
            # every round's log: the next training overwrites it, and a slow round is
            # explained only by its own log
            (keep / "logs").mkdir(parents=True, exist_ok=True)
            shutil.copy(log, keep / "logs" / f"{mode}_{trainings}.log")
        trainings += 1
        attempts = metrics.get("attempts") or [{}]
        return {
            "train_s": job_seconds(run, f"train_{method}"),
            # the part of the job that grows with the data, and an online job's server start
            **phase_seconds(log.read_text(errors="replace")),
            "device": attempts[-1].get("device"),
            "disk_high_water_bytes": disk.peak,
            "loader_wait_fraction": metrics["throughput"].get("loader_wait_fraction"),
            # (None where too few steps were logged: a small run)
            "tokens_per_s_per_epoch": [e["tokens_per_s"] for e in metrics["epochs"]],
            "val_loss_per_epoch": [e["val"]["loss"] for e in metrics["epochs"]],
        }

    return once


def training_rounds(work, configs, run, method, rounds: int, epochs: int, keep=None) -> dict:
    """Training alone, stored against online, in alternating rounds."""
    variants = {
        m: train_alone(work, configs, run, method, m, epochs, keep) for m in ("stored", "online")
    }
    result = rounds_lib.alternate(variants, rounds)
    out = {"epochs": epochs, "rounds": result["rounds"], "surroundings_before": result["before"]}
    for key in ("train_s", "disk_high_water_bytes"):
        out[key] = {m: rounds_lib.spread(rounds_lib.figure(result, m, key)) for m in variants}
    # the epochs alone (every epoch of every round), without the job's fixed costs
    out["epoch_s"] = {
        m: rounds_lib.spread(list(itertools.chain(*rounds_lib.figure(result, m, "epoch_s"))))
        for m in variants
    }
    ratios = rounds_lib.paired_ratios(result, "online", "stored", "train_s")
    out["train_s_ratio_online_to_stored"] = {"per_round": ratios, **rounds_lib.spread(ratios)}
    return out


def main() -> None:
    global SMK_ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base", default=str(REPO / "config/config.yaml"), help="first config file")
    ap.add_argument(
        "--configfile",
        nargs="*",
        default=[str(REPO / "benchmarks/configs/online_vs_stored.yaml")],
        help="config files over --base",
    )
    ap.add_argument("--smk-args", default="", help="Snakemake options, e.g. --resources gpus=1")
    ap.add_argument("--reuse-work", action="store_true", help="keep what --work holds")
    ap.add_argument("--skip-full", action="store_true", help="no whole runs: data, then --rounds")
    ap.add_argument("--rounds", type=int, default=0, help="rounds of training alone (>= 3)")
    ap.add_argument("--epochs", type=int, default=1, help="train.epochs of those trainings")
    ap.add_argument(
        "--keep-drafters", type=Path, help="copy each mode's last-round drafter to DIR/<mode>"
    )
    args = ap.parse_args()
    if args.rounds and args.rounds < 3:
        ap.error("--rounds: at least 3 (a spread needs them)")
    if args.skip_full and not args.rounds:
        ap.error("--skip-full leaves only --rounds to run")
    SMK_ARGS = shlex.split(args.smk_args)
    work = args.work.resolve()
    if work.exists() and not args.reuse_work:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    configs = [str(Path(c).resolve()) for c in (args.base, *args.configfile)]
    merged: dict = {}
    for c in configs:
        merged.update(yaml.safe_load(Path(c).read_text()) or {})
    run = work / "results" / merged["run"]
    method = (merged.get("train") or {}).get("methods", ["eagle3"])[0]

    result: dict = {
        "what": "extract.mode online vs stored, same rows and seed",
        "command": " ".join(["benchmarks/online_vs_stored.py", *sys.argv[1:]]),
        "configs": [os.path.relpath(c, REPO) for c in configs],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    if args.skip_full:
        snakemake(work, configs, "--until", "extract_gather", "vocab")
    else:
        whole_runs(result, work, configs, run, method)
    if args.rounds:
        result["training_rounds"] = training_rounds(
            work, configs, run, method, args.rounds, args.epochs, args.keep_drafters
        )
        print(json.dumps(result["training_rounds"]["train_s_ratio_online_to_stored"]))
    write_result(args.out, result)


def whole_runs(result: dict, work: Path, configs: list[str], run: Path, method: str) -> None:
    """Both modes through the whole workflow, stored first (the data made by it)."""
    for mode in ("stored", "online"):
        with DiskPeak(run, mode) as disk:
            dag_s = snakemake(work, configs, "--config", f"extract={{mode: {mode}}}")
        extract_s = job_seconds(run, "extract_part") + job_seconds(run, "extract_gather")
        result[mode] = {
            "dag_wall_s": round(dag_s, 1),
            "extract_s": round(extract_s, 1) if mode == "stored" else 0.0,
            "train_s": round(job_seconds(run, f"train_{method}"), 1),
            "bench_s": round(job_seconds(run, f"bench_{method}"), 1),
            "disk_high_water_bytes": disk.peak,
            "disk_polls": disk.samples,
            "loadavg_1m_mean": round(sum(disk.loads) / max(1, len(disk.loads)), 2),
            **outcome(run, method),
        }
        result[mode]["extract_plus_train_s"] = round(
            result[mode]["extract_s"] + result[mode]["train_s"], 1
        )
        print(json.dumps({mode: result[mode]}, indent=1), flush=True)
    s, o = result["stored"], result["online"]
    result["comparison"] = {
        "wall_time_ratio_online_to_stored": round(
            o["extract_plus_train_s"] / s["extract_plus_train_s"], 3
        ),
        "disk_high_water_ratio_online_to_stored": round(
            o["disk_high_water_bytes"] / max(1, s["disk_high_water_bytes"]), 4
        ),
        "same_drafter_weights": s["drafter_weights_sha256"] == o["drafter_weights_sha256"],
        "acceptance_length_difference": {
            k: round(o["acceptance_length"][k] - v, 6) for k, v in s["acceptance_length"].items()
        },
    }
    print(json.dumps(result["comparison"], indent=1))


if __name__ == "__main__":
    main()
