"""What OpenMP's wait policy costs the pipeline's CPU processes, alone on the machine and beside
processes that take its cores (two busy loops, as a second job or test would): the library
default (OMP_WAIT_POLICY unset: libgomp spins a while, Intel's OpenMP 200 ms, before a thread
sleeps) against PASSIVE (threads sleep at once), which the pipeline sets for CPU training
(eagle3_pipeline/runtime/threads.py).

    PYTHONPATH=src .venv/bin/python benchmarks/cpu_openmp_wait.py --run RUN_DIR --rounds 3 \\
        [--out benchmarks/results/tests/cpu_openmp_wait.json]

RUN_DIR: a finished run of tests/configs/ci.yaml (its results/ci: target, prepared rows, hidden
states, drafter). Two workloads, each with OMP_NUM_THREADS = the machine's cores, as a
Snakemake job given every core runs:
- train: its train job (train_work/<method>/job.json) for --epochs epochs, in a fresh work dir;
  wall seconds and the training process's CPU seconds;
- serve: a vLLM server on its target with its drafter (k = 2), four greedy chat answers of 64
  tokens one after another; wall seconds of the answers and the server's CPU seconds meanwhile.
Per round, each (workload, policy, load) once, the policies alternating.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from eagle3_lab.results import write_result
from eagle3_lab.rounds import spread
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.bench.stage import speculative_config
from eagle3_pipeline.engine.spec import spec_for_target
from eagle3_pipeline.runtime.files import read_json
from eagle3_pipeline.server import VllmServer
from eagle3_pipeline.server import client as client_lib

REPO = Path(__file__).resolve().parents[1]
# OMP_WAIT_POLICY per setting: empty leaves it unset, each OpenMP library's own default
POLICIES = {"library default": "", "PASSIVE": "PASSIVE"}
LOADS = ("alone", "beside 2 busy processes")
PROMPTS = [
    "Name three rivers in Europe.",
    "Write a Python function that reverses a list.",
    "What is the capital of Japan?",
    "Explain photosynthesis in two sentences.",
]


@contextlib.contextmanager
def load(name: str):
    """Two busy loops for the block (one per core of a 2-core machine), or nothing."""
    hogs = []
    if name != "alone":
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def thread_env(policy: str) -> dict[str, str]:
    """What a process of the benchmark runs with beyond this one's environment (which holds no
    OMP_WAIT_POLICY: main removes it)."""
    env = {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    return env


def train_once(job_path: Path, epochs: int, policy: str, tmp: Path) -> dict:
    """The run's train job for ``epochs`` epochs in a fresh save path: wall and CPU seconds."""
    job = read_json(job_path)
    save = tmp / f"train-{time.monotonic_ns()}"
    job["train_config"].update(
        epochs=epochs, save_path=str(save / "checkpoints"), log_dir=str(save / "logs")
    )
    job.update(metrics_path=str(save / "metrics.jsonl"), resume_from=None)
    save.mkdir()
    (save / "job.json").write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), **thread_env(policy))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(save / "train.log", "wb") as log:
        subprocess.run(
            [sys.executable, "-m", "eagle3_pipeline.train.entry", str(save / "job.json")],
            env=env, stdout=log, stderr=subprocess.STDOUT, check=True,
        )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(cpu, 2)}


def tree_cpu_s(pid: int) -> float:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def answer(base_url: str, model: str, prompt: str) -> str:
    """One greedy chat answer of 64 tokens."""
    with client_lib.sync_client(base_url, timeout=600, max_retries=0) as client:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=64,
            temperature=0,
        )
    return reply.choices[0].message.content


def serve(run: Path, method: str, policy: str, tmp: Path) -> VllmServer:
    """The run's target with its drafter, on the CPU, under ``policy``."""
    cfg = cfglib.validate(
        {"vllm": {"device": "cpu", "max_model_len": 1024}, "prepare": {"seq_length": 512}}
    )
    target = read_json(run / "target" / "target.json")
    spec = spec_for_target(
        cfg["vllm"],
        target,
        speculative_config=speculative_config(method, run / "drafter" / method, 2, {}),
    )
    spec.env.update(thread_env(policy))
    log = tmp / f"server-{time.monotonic_ns()}.log"
    return VllmServer(spec, log, cache_root=REPO / "tests" / ".cache" / "vllm")


def serve_rounds(run: Path, method: str, policy: str, tmp: Path) -> dict[str, dict]:
    """One server under ``policy``; the answers alone, then beside the busy loops."""
    out = {}
    with serve(run, method, policy, tmp) as server:
        pid = server.proc.pid
        for name in LOADS:
            with load(name):
                cpu0, t0 = tree_cpu_s(pid), time.monotonic()
                texts = [answer(server.base_url, server.model_name, p) for p in PROMPTS]
                out[name] = {
                    "wall_s": round(time.monotonic() - t0, 2),
                    "cpu_s": round(tree_cpu_s(pid) - cpu0, 2),
                    "answers": texts,
                }
    return out


def summarize(rows: list[dict], workload: str, where: str) -> dict:
    """Each policy's spread of wall and CPU seconds for one workload and load, and PASSIVE's
    ratio to the library default per round."""

    def pick(name: str) -> list[dict]:
        key = (workload, where, name)
        return [x for x in rows if (x["workload"], x["load"], x["policy"]) == key]

    default, passive = pick("library default"), pick("PASSIVE")
    out = {
        name: {k: spread([x[k] for x in pick(name)]) for k in ("wall_s", "cpu_s")}
        for name in POLICIES
    }
    out["passive_to_default_per_round"] = {
        k: sorted(round(p[k] / d[k], 3) for d, p in zip(default, passive, strict=True))
        for k in ("wall_s", "cpu_s")
    }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished run's results/<run>")
    ap.add_argument("--method", default=None, help="the drafter (default: the run's only one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/tests/cpu_openmp_wait.json"))
    args = ap.parse_args(argv)
    os.environ.pop("OMP_WAIT_POLICY", None)  # the library default is the variable unset
    method = args.method or next(p.name for p in (args.run / "drafter").iterdir())
    job = args.run / "train_work" / method / "job.json"
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(POLICIES.items())
            if r % 2:
                order.reverse()
            for name, policy in order:
                for where in LOADS:
                    with load(where):
                        t = train_once(job, args.epochs, policy, Path(tmp))
                    rows.append(
                        {"round": r, "workload": "train", "policy": name, "load": where, **t}
                    )
                    print(f"round {r + 1} train {name} {where}: {t}", flush=True)
            for name, policy in order:
                for where, s in serve_rounds(args.run, method, policy, Path(tmp)).items():
                    rows.append(
                        {"round": r, "workload": "serve", "policy": name, "load": where, **s}
                    )
                    print(
                        f"round {r + 1} serve {name} {where}: {s['wall_s']} s, {s['cpu_s']} cpu-s",
                        flush=True,
                    )
    summary = {
        f"{workload}, {where}": summarize(rows, workload, where)
        for workload in ("train", "serve")
        for where in LOADS
    }
    serves = [x for x in rows if x["workload"] == "serve"]
    result = write_result(
        args.out,
        {
            "run": str(args.run),
            "method": method,
            "machine": f"{os.cpu_count()} cores",
            "rounds": args.rounds,
            "epochs": args.epochs,
            "omp_num_threads": os.cpu_count(),
            "rows": rows,
            "summary": summary,
            "same_answers": len({json.dumps(x["answers"]) for x in serves}) == 1,
        },
    )
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
