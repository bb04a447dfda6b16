"""Drafters side by side on one GPU: every server starts at once, measurements take turns.

    PYTHONPATH=src python3 lab/drafter_speed.py --configfile config/gpu-quality.yaml \\
        config/gpu-methods.yaml lab/configs/gpu_methods_2500.yaml \\
        --wait 1500 --store-cache --out /tmp/w/bench/h200_drafter_speed.json

For a run whose drafters are trained, or still training (``--wait``): one server for the
baseline and one per method and k (``bench.num_speculative_tokens``) start side by side, each
as soon as its drafter exists, each with its own compile cache. Once every server is up, each
is measured in turn with the bench stage's own code (``eagle3_pipeline.bench``: its server
arguments, warm-up, prompt sets, temperatures, concurrencies and ``bench.rounds``) while the
others sit idle, and stopped: the bench stage's ``bench.pairing: separate``, each drafter
against the one baseline. Servers that sit idle beside a measurement still hold GPU memory:
speed figures from this script are not measured alone. On an H200 a server start
(torch.compile and CUDA graph capture) takes 1.5-2.5 minutes and a 135M target's measurement
about one: the bench jobs, which start their servers one after the other, spend most of their
time starting; here the starts overlap each other and the training.

Each drafter is checked against the run's extraction and target first (the bench stage's
consistency check). With ``--store-cache`` the measurements go into the run's bench cache under
the fingerprints the bench jobs compute, so that Snakemake then writes the bench metrics and the
report without starting a server (a method goes in only when all its k were measured; the run
must use ``bench.pairing: separate``, whose jobs read rounds of one server).
Prints one row per method, k, prompt set and concurrency; ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.bench import (
    BASELINE,
    DRAFTER,
    BenchError,
    bench_rounds,
    drafter_rows,
    measure_rounds,
    speculative_config,
    start_server,
)
from eagle3_pipeline.bench import cache as bench_cache
from eagle3_pipeline.methods import consistency, predicted_acceptance_length
from eagle3_pipeline.runtime import setup_logging
from eagle3_pipeline.runtime.files import iter_jsonl, read_json
from eagle3_pipeline.runtime.provenance import package_versions
from eagle3_pipeline.server import ServerError
from eagle3_pipeline.target import load_info

log = logging.getLogger("drafter_speed")


@dataclass
class Server:
    """One server of the comparison: the baseline (method None) or a drafter at one k."""

    method: str | None
    k: int | None
    bench_cfg: dict
    drafter_dir: Path | None = None
    server: object = None
    error: str | None = None
    timings: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "baseline" if self.method is None else f"{self.method}-k{self.k}"


def plan(cfg: dict, methods: list[str]) -> list[Server]:
    """The servers to compare: the baseline, then each method at each of its k."""
    run = Path(cfglib.run_dir(cfg))
    section = lambda rule, method=None: cfglib.job_section(  # noqa: E731
        cfg, cfglib.result_config(cfg, rule, method=method), "bench"
    )
    out = [Server(None, None, section("bench_baseline"))]
    for m in methods:
        for k in cfglib.speculative_tokens(cfg, m):
            out.append(Server(m, k, section("bench", m), drafter_dir=run / "drafter" / m))
    return out


def wait_for(path: Path, deadline: float, stop: threading.Event) -> bool:
    while not path.exists():
        if time.monotonic() > deadline or stop.wait(5):
            return False
    return True


class Starter:
    """Starts every server in its own thread (a drafter's once its metrics.json exists), at
    least ``stagger_s`` apart (vLLM profiles GPU memory at start: simultaneous profiles of
    several engines on one GPU are best avoided).

    Each thread lives until :meth:`release`: a server's guard dies with the *thread* that
    started it (the kernel's parent-death signal follows the thread, not the process), so a
    thread that ended after the start would take its server down with it."""

    def __init__(self, servers, cfg, target, manifest, run: Path, deadline: float, stagger_s):
        self.servers, self.cfg, self.target, self.manifest = servers, cfg, target, manifest
        self.run, self.deadline, self.stagger_s = run, deadline, stagger_s
        self._gate = threading.Lock()
        self._last = 0.0
        self._check_lock = threading.Lock()
        self._checks: dict[Path, dict] = {}
        self._done = threading.Event()
        self._ready = [threading.Event() for _ in servers]
        self._threads = [
            threading.Thread(target=self._one, args=(i, s), daemon=True)
            for i, s in enumerate(servers)
        ]

    def __enter__(self) -> Starter:
        for t in self._threads:
            t.start()
        return self

    def wait_all(self) -> None:
        """Until every server is up or has failed."""
        for ev in self._ready:
            ev.wait()

    def release(self) -> None:
        """Stop whatever still runs and let the threads end."""
        for s in self.servers:
            if s.server is not None:
                s.server.stop()
                s.server = None
        self._done.set()
        for t in self._threads:
            t.join()

    def __exit__(self, *exc) -> None:
        self.release()

    def _one(self, i: int, s: Server) -> None:
        try:
            self._start(s)
        except Exception as e:  # a thread's exception would vanish: the server is reported failed
            s.error = f"{type(e).__name__}: {e}"
            log.exception("%s: not started", s.name)
        finally:
            self._ready[i].set()
        self._done.wait()

    def _check(self, drafter_dir: Path) -> dict:
        """The consistency check, once per drafter and one thread at a time: the servers of
        one method at several k ask at the same moment, and transformers 5 resolves its lazy
        imports unsafely across threads ("cannot import name 'AutoConfig' from
        'transformers'" lost DFlash's k=15 server on the H200)."""
        with self._check_lock:
            if drafter_dir not in self._checks:
                self._checks[drafter_dir] = consistency.check(
                    drafter_dir, self.manifest, self.target
                )
            return self._checks[drafter_dir]

    def _start(self, s: Server) -> None:
        t0 = time.monotonic()
        spec_cfg = None
        if s.method is not None:
            if not wait_for(s.drafter_dir / "metrics.json", self.deadline, self._done):
                s.error = f"no trained drafter in {s.drafter_dir} before the deadline"
                return
            check = self._check(s.drafter_dir)
            if not check["ok"]:
                s.error = "consistency: " + "; ".join(check["problems"])
                return
            spec_cfg = speculative_config(
                check["drafter"]["speculators_model_type"],
                s.drafter_dir.resolve(),
                s.k,
                s.bench_cfg,
            )
        s.timings["waited_s"] = round(time.monotonic() - t0, 1)
        with self._gate:
            time.sleep(max(0.0, self._last + self.stagger_s - time.monotonic()))
            self._last = time.monotonic()
        t1 = time.monotonic()
        # a second try: vLLM sizes its KV cache from the GPU memory that grew while it
        # profiled, and a training beside it may have grown it
        for attempt in (1, 2):
            try:
                s.server = start_server(
                    s.bench_cfg,
                    self.cfg["vllm"],
                    self.target,
                    spec_cfg,
                    s.name,
                    self.run / "logs" / f"speed_{s.name}.log",
                    cache_root=self.run / ".vllm-cache-speed" / s.name,
                )
                s.error = None
                break
            except (BenchError, ServerError) as e:
                s.error = str(e)[-2000:]
                log.warning("%s: start %d failed: %s", s.name, attempt, s.error[-300:])
                if self._done.wait(20):
                    break
        s.timings["start_s"] = round(time.monotonic() - t1, 1)
        log.info(
            "%s: %s after %.0f s", s.name, "up" if s.server else "FAILED", s.timings["start_s"]
        )


def compare(servers: list[Server], prompt_files: dict[str, str], measured: dict) -> list[dict]:
    """Each drafter run next to the baseline's (the bench stage's rows for bench.pairing:
    separate), with the prediction of the drafter's training."""
    base = servers[0]
    rows = []
    for s in servers[1:]:
        if s.name not in measured:
            continue
        prediction = read_json(s.drafter_dir / "metrics.json").get("prediction") or {}
        for name in prompt_files:
            drafted = [{"k": s.k, **r} for r in measured[s.name][name]]
            separate = {(r["temperature"], r["concurrency"]): r for r in measured[base.name][name]}
            for row in drafter_rows(name, drafted, s.method, separate):
                row["predicted_acceptance_length"] = predicted_acceptance_length(prediction, s.k)
                rows.append(row)
    return rows


def store_cache(servers, cfg, target, prompt_files, measured, cache_dir: Path) -> list[str]:
    """Put the measurements where the bench jobs look for them; returns what went in."""
    stored = []
    base = servers[0]
    if base.name in measured:
        key = bench_cache.baseline_key(target, base.bench_cfg, cfg["vllm"])
        bench_cache.store_runs(cache_dir, prompt_files, key, measured[base.name])
        stored.append("baseline")
    for method in dict.fromkeys(s.method for s in servers[1:]):
        mine = [s for s in servers if s.method == method]
        if not all(s.name in measured for s in mine):
            continue
        runs = {
            name: [{"k": s.k, **r} for s in mine for r in measured[s.name][name]]
            for name in prompt_files
        }
        key = bench_cache.drafter_key(
            mine[0].drafter_dir.resolve(), target, mine[0].bench_cfg, cfg["vllm"]
        )
        bench_cache.store_runs(cache_dir, prompt_files, key, runs)
        stored.append(method)
    return stored


def without_outputs(entries: list[dict]) -> list[dict]:
    """A set's measurements without the output token ids of their passes."""
    return [
        {
            **e,
            "rounds": [
                {
                    who: ({k: v for k, v in p.items() if k != "outputs"} if who != "order" else p)
                    for who, p in r.items()
                }
                for r in e["rounds"]
            ],
        }
        for e in entries
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", nargs="+", required=True, help="as given to snakemake")
    ap.add_argument("--methods", nargs="*", help="default: the run's train.methods")
    ap.add_argument("--wait", type=float, default=0, help="seconds to wait for the drafters")
    ap.add_argument("--stagger", type=float, default=10, help="seconds between server starts")
    ap.add_argument("--store-cache", action="store_true")
    ap.add_argument("--plan", action="store_true", help="print the servers and stop")
    ap.add_argument(
        "--limit", type=int, help="only the first N prompts of each set (a smoke test; not cached)"
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    setup_logging(None)

    cfg = cfglib.load_files(args.configfile)
    run = Path(cfglib.run_dir(cfg))
    servers = plan(cfg, args.methods or cfg["train"]["methods"])
    prompt_files = {n: str(run / "prompts" / f"bench_{n}.jsonl") for n in cfglib.bench_sets(cfg)}
    if args.plan:
        for s in servers:
            print(s.name, s.drafter_dir or "", json.dumps(s.bench_cfg, sort_keys=True))
        print("prompt sets:", " ".join(prompt_files))
        print("vllm", json.dumps(cfg["vllm"]["extra_args"]))
        return
    target = load_info(run / "target" / "target.json")
    manifest = read_json(run / "hidden_states" / "manifest.json")
    sets = {name: list(iter_jsonl(path))[: args.limit] for name, path in prompt_files.items()}
    if args.limit and args.store_cache:
        sys.exit("--limit measures part of each prompt set: it cannot go into the bench cache")
    if args.store_cache and cfg["bench"]["pairing"] != "separate":
        # the bench jobs of bench.pairing: alternate read rounds of both servers side by side
        sys.exit("--store-cache needs bench.pairing: separate (each server is measured alone)")

    t0 = time.monotonic()
    measured: dict[str, dict] = {}
    out = Path(args.out) if args.out else None
    all_up_s = None
    with Starter(servers, cfg, target, manifest, run, t0 + args.wait, args.stagger) as starter:
        starter.wait_all()
        all_up_s = round(time.monotonic() - t0, 1)
        for s in servers:
            if s.server is None:
                continue
            t1 = time.monotonic()
            try:
                rounds = bench_rounds(s.bench_cfg, cfg["vllm"])
                who = BASELINE if s.method is None else DRAFTER
                measured[s.name] = measure_rounds(s.server, sets, s.bench_cfg, rounds, who)
            except Exception as e:  # one server's failure keeps the others' measurements
                s.error = f"measurement: {e}"
            finally:
                s.server.stop()
                s.server = None
            s.timings["measure_s"] = round(time.monotonic() - t1, 1)
            log.info("%s: measured in %.0f s", s.name, s.timings["measure_s"])
            if out and servers[0].name in measured:
                # what is measured so far, marked incomplete: a host that goes away during the
                # next measurement leaves these behind
                write_result(out, result(args, run, cfg, servers, prompt_files, measured, all_up_s))

    if servers[0].name not in measured:
        sys.exit(f"the baseline was not measured: {servers[0].error}")
    stored = (
        store_cache(servers, cfg, target, prompt_files, measured, run / "bench" / ".cache")
        if args.store_cache
        else []
    )
    final = result(args, run, cfg, servers, prompt_files, measured, all_up_s, stored)
    print_table(final["rows"])
    for s in servers:
        print(f"{s.name}: {s.timings}" + (f"  ERROR {s.error}" if s.error else ""))
    if out:
        write_result(out, final)
    if any(s.error for s in servers):
        sys.exit(1)


def result(args, run, cfg, servers, prompt_files, measured, all_up_s, stored=None) -> dict:
    """The comparison as written to ``--out``: complete once every server was measured and
    the cache written (``stored`` given)."""
    return {
        "command": " ".join(["python", *sys.argv]),
        "complete": stored is not None,
        "run": str(run),
        "all_servers_up_s": all_up_s,
        "servers": [
            {"name": s.name, "method": s.method, "k": s.k, "error": s.error, **s.timings}
            for s in servers
        ],
        "rows": compare(servers, prompt_files, measured),
        "baseline": {n: without_outputs(r) for n, r in measured[servers[0].name].items()},
        "stored_in_bench_cache": stored or [],
        "bench": servers[0].bench_cfg,
        "vllm": cfg["vllm"],
        "versions": package_versions(),
    }


def print_table(rows: list[dict]) -> None:
    print(
        "\n| method | k | prompt set | c | τ | predicted | acceptance per position | tok/s "
        "| baseline tok/s | speedup | outputs ≠ baseline (T=0) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        diff = r.get("outputs_vs_baseline") or {}
        print(
            f"| {r['method']} | {r['k']} | {r['prompt_set']} | {r['concurrency']} "
            f"| {r['acceptance_length']:.2f} "
            f"| {r['predicted_acceptance_length'] or float('nan'):.2f} "
            f"| {' / '.join(f'{x:.2f}' for x in r['per_position'])} | {r['tokens_per_s']:.0f} "
            f"| {r['baseline_tokens_per_s']:.0f} | {r['speedup']:.2f} "
            f"| {diff.get('differing', '-')} of {diff.get('compared', '-')} |"
        )


if __name__ == "__main__":
    main()
