#!/usr/bin/env python
"""What each change to a finished default run re-runs, and what the re-run costs.

    PYTHONPATH=src:tests .venv/bin/python benchmarks/rerun_costs.py --work /tmp/rerun-costs \\
        --out benchmarks/results/reruns/rerun_costs.json [--base <finished run dir>] [--rows ...]

Runs the default config (config/config.yaml) once from scratch in ``<work>/base`` (or takes a
finished run given by --base), then for every row of the README's "What re-runs when" table:
copies the finished run, applies the change, records the jobs `snakemake -n` plans, runs
`snakemake --cores all` for real and records its wall time, the jobs that ran, how many vLLM
servers started (counted in the jobs' logs) and what each stage says it computed (`this_run`
in its output). Rows marked with ``on`` start from another row's finished copy (editing a
training prompt file needs a run that has one). Writes one JSON file (--out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from eagle3_lab.results import write_result

try:  # the changes and the plan reader are the tests' own (tests/test_workflow.py, smkcli.py)
    from test_workflow import OPERATIONAL_CHANGES, no_code_change

    from smkcli import copy_repo, parse_jobs
except ImportError as e:
    raise SystemExit(f"{e}: run this with PYTHONPATH=src:tests (it uses the tests' helpers)") from e

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
DATA = REPO / "benchmarks" / "data"
TRAIN_FILE = {"name": "mine", "source": "file", "path": "data/rerun_train.jsonl"}
BENCH_FILE = {"name": "mybench", "source": "file", "path": "data/rerun_bench.jsonl"}


def edit_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def real_code_change(path: Path) -> None:
    path.write_text(path.read_text() + "\n_EDITED_FOR_RERUN_COSTS = 1\n")


# name -> what the row changes. "config": merged over the default config; "files": edit
# (path relative to the run's working directory, old text, new text); "code": edits to a copy
# of the workflow; "touch" / "args": what the run gets; "on": the row whose result it starts from.
ROWS: dict[str, dict] = {
    "nothing changed": {},
    "add a benchmark prompt set (a file)": {
        "config": {
            "prompts": {"bench": DEFAULT["prompts"]["bench"] + [BENCH_FILE]},
            "bench": {"prompt_sets": DEFAULT["bench"]["prompt_sets"] + ["mybench"]},
        },
    },
    "edit the benchmark prompt file": {
        "on": "add a benchmark prompt set (a file)",
        "files": [("data/rerun_bench.jsonl", "first five prime", "first six prime")],
    },
    "remove a benchmark prompt set": {"config": {"bench": {"prompt_sets": ["mtbench"]}}},
    "edit a benchmark set (mtbench n 8 -> 6)": {
        "config": {
            "prompts": {
                "bench": [
                    {**DEFAULT["prompts"]["bench"][0], "n": 6},
                    *DEFAULT["prompts"]["bench"][1:],
                ]
            }
        },
    },
    "bench.max_tokens 96 -> 64": {"config": {"bench": {"max_tokens": 64}}},
    "add a training prompt file (8 prompts)": {
        "config": {"prompts": {"train": DEFAULT["prompts"]["train"] + [TRAIN_FILE]}},
    },
    "edit the training prompt file (2 of 8 prompts)": {
        "on": "add a training prompt file (8 prompts)",
        "files": [
            ("data/rerun_train.jsonl", "three tips", "four tips"),
            ("data/rerun_train.jsonl", "leap years", "leap seconds"),
        ],
    },
    "every operational key": {"config": OPERATIONAL_CHANGES},
    "vocab.draft_vocab_size 8192 -> 4096": {"config": {"vocab": {"draft_vocab_size": 4096}}},
    "train.lr 0.001 -> 0.002": {"config": {"train": {"lr": 0.002}}},
    "comment/docstring edit in every library module": {"code": "comments"},
    "code edit in an infrastructure module (server.py)": {"code": "server.py"},
    "code edit in a logic module (vocab.py)": {"code": "vocab.py"},
    "touch of an upstream output (prepare/dataset)": {"touch": "prepare/dataset"},
    "-R extract, nothing changed": {"args": ["-R", "extract"]},
}


def snakemake(repo: Path, work: Path, configs: list[Path], *args: str) -> tuple[str, float]:
    cmd = [SNAKEMAKE, "--snakefile", str(repo / "Snakefile"), "--directory", str(work)]
    cmd += ["--configfile", *map(str, configs), *args]
    env = dict(os.environ, PYTHONPATH=str(repo / "src"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}")
    return proc.stdout + proc.stderr, wall


def job_names(output: str) -> list[str]:
    names = []
    for j in parse_jobs(output):
        if j.rule != "all":
            wc = ",".join(f"{k}={v}" for k, v in j.wildcards.items())
            names.append(j.rule + (f"[{wc}]" if wc else ""))
    return sorted(names)


def log_states(run: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in (run / "logs").glob("*.log")}


def servers_started(run: Path, before: dict[Path, tuple[int, int]]) -> int:
    """Servers started by the jobs that ran, from their logs (Snakemake starts a job's log
    afresh, so a log that changed is read whole)."""
    n = 0
    for path, state in log_states(run).items():
        if before.get(path) != state:
            n += path.read_text(errors="replace").count("starting vLLM server")
    return n


def stage_records(run: Path, ran: list[str]) -> dict:
    """What each stage that ran says it computed (its output's this_run)."""
    read = lambda p: json.loads((run / p).read_text())  # noqa: E731
    out = {}
    if "synth" in ran:
        r = read("synth/stats.json")["this_run"]
        out["synth"] = {k: r[k] for k in ("server_started", "reused", "answered")}
    parts = [p for p in ran if p.startswith("extract[")]
    if parts:
        rs = [read(f"hidden_states/parts/part_{p[len('extract[part=') : -1]}.json") for p in parts]
        rs = [r["this_run"] for r in rs]
        out["extract"] = {
            "server_started": any(r["server_started"] for r in rs),
            "samples_extracted": sum(r["samples"] for r in rs),
            "samples_reused": sum(r["reused"] for r in rs),
        }
    for job in ran:  # train[method=...], bench[method=...]: one job per drafter method
        rule, _, wildcards = job.partition("[method=")
        method = wildcards.rstrip("]")
        if rule == "train":
            out[job] = read(f"drafter/{method}/metrics.json")["this_run"]
        if rule == "bench" or job == "bench_baseline":
            r = read(f"bench/{method}/metrics.json" if method else "bench/baseline.json")
            out[job] = {
                k: r["this_run"][k] for k in ("servers_started", "measured_sets", "cached_sets")
            }
    return out


def prepare_copy(src: Path, dest: Path) -> None:
    # The materialized target model is only read (target.json names it where it is).
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("model"))


def run_row(name: str, row: dict, base: Path, done: dict[str, Path], tmp: Path) -> dict:
    start = done[row["on"]] if "on" in row else base
    work = tmp / f"row{len(done)}"
    prepare_copy(start, work)
    repo = REPO
    configs = [REPO / "config" / "config.yaml"]
    # a row on another row's result keeps that row's config
    chain = [ROWS[row["on"]]] if "on" in row else []
    merged = {}
    for r in [*chain, row]:
        for section, values in r.get("config", {}).items():
            merged.setdefault(section, {}).update(values)
    if merged:
        configs.append(work / "change.yaml")
        configs[-1].write_text(yaml.safe_dump(merged))
    for rel, old, new in row.get("files", []):
        edit_line(work / rel, old, new)
    if "code" in row:
        repo = tmp / f"repo{len(done)}"
        repo.mkdir()
        copy_repo(repo)
        lib = repo / "src" / "eagle3_pipeline"
        if row["code"] == "comments":
            for f in lib.rglob("*.py"):
                f.write_text(no_code_change(f.read_text()))
        else:
            real_code_change(lib / row["code"])
    run = work / "results" / DEFAULT["run"]
    if "touch" in row:
        target = run / row["touch"]
        for p in (target, target / ".snakemake_timestamp"):
            if p.exists():
                p.touch()
    args = row.get("args", [])
    plan_out, plan_s = snakemake(repo, work, configs, "-n", *args)
    before = log_states(run)
    out, wall = snakemake(repo, work, configs, "--cores", "all", *args)
    ran = job_names(out)
    result = {
        "row": name,
        "change": row,
        "planned": job_names(plan_out),
        "ran": ran,
        "wall_s": round(wall, 1),
        "dry_run_s": round(plan_s, 1),
        "servers_started": servers_started(run, before),
        "stages": stage_records(run, ran),
    }
    after, _ = snakemake(repo, work, configs, "-n")
    result["nothing_left_after"] = "Nothing to be done" in after
    done[name] = work
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="scratch directory (several GB)")
    ap.add_argument("--base", type=Path, help="a finished default run's working directory")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/reruns/rerun_costs.json")
    ap.add_argument("--rows", nargs="*", help="only these rows (default: all)")
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "config": "config/config.yaml",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", *sys.argv]),
        "code": subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
        ).stdout.strip(),
    }
    base = args.base
    if base is None:
        base = args.work / "base"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir()
        shutil.copytree(DATA, base / "data")
        out, wall = snakemake(REPO, base, [REPO / "config" / "config.yaml"], "--cores", "all")
        full = {"wall_s": round(wall, 1), "ran": job_names(out), "code": results["code"]}
        write_result(base / "full_run.json", full)
        print(f"full run: {wall:.0f} s", flush=True)
    elif not (base / "data").exists():
        shutil.copytree(DATA, base / "data")
    if (base / "full_run.json").exists():  # measured when this script made the base run
        results["full_run"] = json.loads((base / "full_run.json").read_text())
    rows = args.rows or list(ROWS)
    results["rows"] = []
    done: dict[str, Path] = {}
    for name in ROWS:
        if name not in rows and not any(ROWS[r].get("on") == name for r in rows):
            continue
        row = run_row(name, ROWS[name], base, done, args.work)
        results["rows"].append(row)
        print(
            f"{name}: {row['wall_s']:.0f} s, ran {row['ran'] or 'nothing'}, "
            f"{row['servers_started']} server(s)",
            flush=True,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result(args.out, results)
        if not any(ROWS[r].get("on") == name for r in ROWS):
            with contextlib.suppress(OSError):
                shutil.rmtree(done[name])


if __name__ == "__main__":
    main()
