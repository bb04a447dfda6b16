"""What the extraction validator's work costs a sample, with nothing else in the process.

    .venv/bin/python benchmarks/validator_cost.py \
        --out benchmarks/results/efficiency/validator_cost_cpu.json

Writes a staged sample file shaped like the connector's (bf16, 4 captured layers) and runs
``extract.validator.take_sample`` on it (wait for the writer, read, parse, bit checks, probe
rows, sha256 and move into the shard) in a pool of 1 and then --threads worker threads, as
the extraction client does, at the 135M target's width and at the Llama-3.1-8B width. Reports
per sample: wall time, CPU time, and each phase's seconds summed over the threads (the
figures the extraction benchmarks print as ``validator_s_per_phase``). Writing the staged
files is not timed. Set against a benchmark's phases on a GPU host, it shows how much of a
phase is the work itself and how much is waiting for something else in the process.

With --busy-thread the same pool runs beside a thread that loops in pure Python, as the
extraction client's request loop does when it is busy, once at Python's switch interval
(5 ms) and once at the client's (extract.client.SWITCH_INTERVAL_S); the busy thread's loops a
second show what the shorter interval costs it.

With --copying the pool runs --rounds rounds (order reversed every round) of the validator
as it is (each thread reads into a buffer it keeps, the tensors are views of those bytes, the
bit checks write into a buffer it keeps) and as it was (a fresh bytes object a sample,
safetensors' load, which copies every tensor while holding the interpreter lock, a fresh mask
tensor), each beside a busy Python thread at the client's switch interval, and reports the
medians and min-max of wall time, page faults and system CPU a sample and of the busy thread's
loops a second (how much of the lock the validator leaves the request loop).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import save

from eagle3_lab.results import write_result
from eagle3_lab.rounds import spread
from eagle3_pipeline.extract.client import SWITCH_INTERVAL_S
from eagle3_pipeline.extract.validator import Timings, take_sample

WIDTHS = {"smollm2-135m": 576, "llama-8b": 4096}


def measure(hidden: int, tokens: int, layers: int, samples: int, threads: int) -> dict:
    ids = list(range(tokens))
    blob = save(
        {
            "hidden_states": torch.randn(tokens, layers, hidden).to(torch.bfloat16),
            "token_ids": torch.tensor(ids),
        }
    )
    row = {"input_ids": ids, "loss_mask": [0] * (tokens // 4) + [1] * (tokens - tokens // 4)}
    with tempfile.TemporaryDirectory() as tmp:
        staged = [Path(tmp) / f"staged_{i}.safetensors" for i in range(samples)]
        for p in staged:
            p.write_bytes(blob)
        timings = Timings()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0, c0 = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(threads) as pool:
            list(
                pool.map(
                    lambda i: take_sample(
                        str(staged[i]),
                        i,
                        row,
                        layers,
                        hidden,
                        16,
                        Path(tmp) / "shards",
                        1024,
                        timings,
                    ),
                    range(samples),
                )
            )
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "threads": threads,
        "wall_ms_per_sample": 1e3 * wall / samples,
        "cpu_ms_per_sample": 1e3 * cpu / samples,
        "system_cpu_ms_per_sample": 1e3 * (r1.ru_stime - r0.ru_stime) / samples,
        "page_faults_per_sample": (r1.ru_minflt - r0.ru_minflt) / samples,
        "phase_ms_per_sample": {k: 1e3 * v / samples for k, v in timings.seconds.items()},
    }


def beside_busy_thread(
    hidden: int, tokens: int, layers: int, samples: int, threads: int, intervals=None
):
    """:func:`measure` beside a pure-Python loop, at each switch interval (default: Python's
    and the extraction client's)."""
    runs = []
    default = sys.getswitchinterval()
    for interval in intervals or (default, SWITCH_INTERVAL_S):
        stop, loops = threading.Event(), [0]

        def busy(stop=stop, loops=loops):
            while not stop.is_set():
                sum(range(1000))
                loops[0] += 1

        sys.setswitchinterval(interval)
        loop = threading.Thread(target=busy, daemon=True)
        try:
            t0 = time.perf_counter()
            loop.start()
            run = measure(hidden, tokens, layers, samples, threads)
        finally:
            stop.set()
            loop.join()
            sys.setswitchinterval(default)
        run["busy_loops_per_s"] = loops[0] / (time.perf_counter() - t0)
        runs.append({"switch_interval_s": interval, **run})
    return runs


def current_against_copying(hidden, tokens, layers, samples, threads, rounds) -> dict:
    """:func:`beside_busy_thread` at the client's interval, the validator as it is and as it
    was (copying reads, parse and mask), alternating."""
    from safetensors.torch import load

    from eagle3_pipeline.extract import validator
    from eagle3_pipeline.hidden_states import checks as verify
    from eagle3_pipeline.hidden_states import shards

    current = (validator.read_into_thread_buffer, shards.tensors_from_bytes, verify._masked)
    copying = (lambda path: Path(path).read_bytes(), load, lambda bits, mask: bits & mask)
    runs: dict[str, list] = {"current": [], "copying": []}
    for r in range(rounds):
        for name in ("current", "copying") if r % 2 == 0 else ("copying", "current"):
            fns = current if name == "current" else copying
            validator.read_into_thread_buffer, shards.tensors_from_bytes, verify._masked = fns
            try:
                runs[name].append(
                    beside_busy_thread(
                        hidden, tokens, layers, samples, threads, [SWITCH_INTERVAL_S]
                    )[0]
                )
            finally:
                validator.read_into_thread_buffer, shards.tensors_from_bytes, verify._masked = (
                    current
                )
    keys = (
        "wall_ms_per_sample",
        "page_faults_per_sample",
        "system_cpu_ms_per_sample",
        "busy_loops_per_s",
    )
    return {
        "rounds": runs,
        "summary": {
            name: {k: spread([run[k] for run in rs]) for k in keys} for name, rs in runs.items()
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=182, help="per sample (the packaged rows' mean)")
    ap.add_argument("--layers", type=int, default=4, help="captured layers (3 aux + final)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--busy-thread",
        action="store_true",
        help="run the pool (--threads) beside a busy Python thread at Python's switch "
        "interval and at the extraction client's",
    )
    ap.add_argument(
        "--copying",
        action="store_true",
        help="compare the validator with its copying predecessor, beside a busy thread",
    )
    ap.add_argument("--rounds", type=int, default=3, help="with --copying (>= 3)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.copying and args.rounds < 3:
        ap.error("--rounds: at least 3 (a spread needs them)")
    torch.set_num_threads(1)  # as the extraction client sets it for its validator threads
    result = {"args": vars(args), "shapes": {}}
    for name, hidden in WIDTHS.items():
        measure(hidden, args.tokens, args.layers, 20, 1)  # warm-up
        if args.copying:
            ab = current_against_copying(
                hidden, args.tokens, args.layers, args.samples, args.threads, args.rounds
            )
            result["shapes"][name] = {"hidden_size": hidden, **ab}
            for variant, figures in ab["summary"].items():
                print(
                    f"{name}: {args.threads} thread(s), {variant}: "
                    + ", ".join(
                        f"{k} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
                        for k, v in figures.items()
                    )
                )
            continue
        if args.busy_thread:
            runs = beside_busy_thread(hidden, args.tokens, args.layers, args.samples, args.threads)
        else:
            runs = [
                measure(hidden, args.tokens, args.layers, args.samples, t)
                for t in (1, args.threads)
            ]
        result["shapes"][name] = {"hidden_size": hidden, "runs": runs}
        for r in runs:
            phases = {k: round(v, 2) for k, v in r["phase_ms_per_sample"].items()}
            beside = (
                f" beside a busy thread (switch interval {r['switch_interval_s'] * 1e3:g} ms, "
                f"{r['busy_loops_per_s']:.0f} of its loops a second)"
                if "busy_loops_per_s" in r
                else ""
            )
            print(
                f"{name}: {r['threads']} thread(s){beside} {r['wall_ms_per_sample']:.2f} ms "
                f"wall, {r['cpu_ms_per_sample']:.2f} ms CPU a sample; phases {phases}"
            )
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
