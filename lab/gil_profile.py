"""Where the extraction client's interpreter lock goes: a py-spy profile, summarized.

py-spy (``pip install py-spy``, not a dependency of the pipeline) samples only the thread that
holds the lock with ``--gil``; this script runs it on ``benchmarks/extract_throughput.py``
and sorts the samples of the extract stage's client (its request coroutines, its validator
threads and the probe) into what they were doing, as milliseconds of the lock a request. With
``--typed-requests`` among the benchmark's arguments the same rounds also send the rows
through the openai client's typed route, so both ways of sending are measured side by side:

    PYTHONPATH=src python lab/gil_profile.py --py-spy /path/to/py-spy \
        --out benchmarks/results/efficiency/gil_profile_cpu.json -- \
        --rows 64 --concurrency 8 --rounds 3 --typed-requests

Arguments after ``--`` go to extract_throughput.py (its --rows and --rounds also give the
number of requests). ``--raw FILE`` summarizes a profile recorded before. The bare-prefill
and capture-only clients' samples and start-up (imports, model loading) are counted apart.
"""

from __future__ import annotations

import argparse
import json
import lzma
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from eagle3_lab.results import write_result

REPO = Path(__file__).resolve().parents[1]

# (category, the frames that mark it), first match wins. Each extraction variant's request
# coroutine is Extractor.run's `one`; the typed route goes through typed_request.
CATEGORIES = [
    ("start-up and other", ("_find_and_load",)),  # a module's first import, once
    ("typed route: openai transform", ("typed_request", "_transform.py")),
    ("typed route: the rest", ("typed_request",)),
    ("plain JSON request", ("Extractor.run.<locals>.one",)),
    ("validator threads (read, parse, checks, hash, move)", ("take_sample",)),
    # the threads that wait for the server's writes outside the validator pool
    ("waiting for the server's writes", ("wait_written",)),
    ("probe", ("ProbeBatcher._probe",)),
    ("validate coroutine and journal", ("Extractor.run.<locals>.validate",)),
    ("bare-prefill client", ("bare_prefill",)),
    ("capture-only client", ("minimal_client",)),
    # aiohttp's protocol callbacks run from the event loop, outside any request's coroutine:
    # every client's responses arrive through them
    ("HTTP transport callbacks (aiohttp), every client's", ("aiohttp/",)),
]


# What the validator threads held the lock for, by the call under take_sample (first match)
VALIDATOR_PARTS = [
    ("parse: safetensors' load (copies)", "load (safetensors"),
    ("parse: views of the bytes", "tensors_from_bytes"),
    ("read", "read_bytes"),
    ("read", "read_into_thread_buffer"),
    ("bit checks", "check_stored"),
    ("probe rows", "final_rows"),
    ("hash", "sha256"),
]


def validator_part(stack: str) -> str:
    return next((name for name, mark in VALIDATOR_PARTS if mark in stack), "the rest")


def categorize(stack: str) -> str:
    for name, marks in CATEGORIES:
        if all(m in stack for m in marks):
            return name
    return "start-up and other"


# shared by every extraction variant of the run: per sample of all of them
SHARED = ("validator threads", "waiting for the server's writes", "probe", "validate coroutine")
# shared by every client of the run (bare prefill and capture only too): per request of all
EVERY_CLIENT = ("HTTP transport callbacks",)


def summarize(
    raw: Path, rate: int, requests: int, extraction_variants: int = 1, clients: int = 3
) -> dict:
    """Samples per category, and the lock's milliseconds a request of each way of sending
    (``requests``: rows times rounds, per variant; the validator, probe and journal per
    sample of all ``extraction_variants``; the transport's callbacks per request of all
    ``clients``: the extraction variants, bare prefill and capture only)."""
    counts: Counter[str] = Counter()
    opener = lzma.open if raw.suffix == ".xz" else open
    with opener(raw, "rt", errors="replace") as f:
        lines = f.read().splitlines()
    validator: Counter[str] = Counter()
    for line in lines:
        stack, _, n = line.rpartition(" ")
        if n.isdigit():
            counts[categorize(stack)] += int(n)
            if categorize(stack).startswith("validator threads"):
                validator[validator_part(stack)] += int(n)

    def per(k: str) -> int:
        if k.startswith(SHARED):
            return extraction_variants
        return clients if k.startswith(EVERY_CLIENT) else 1

    ms = {
        k: 1e3 * v / rate / requests / per(k)
        for k, v in counts.items()
        if k != "start-up and other"
    }
    typed = sum(v for k, v in ms.items() if k.startswith("typed route"))
    return {
        "samples": dict(counts.most_common()),
        "lock_ms_per_request": dict(sorted(ms.items(), key=lambda kv: -kv[1])),
        "request_lock_ms": {"typed route": typed, "plain JSON": ms.get("plain JSON request", 0)},
        "validator_lock_ms_per_sample": {
            k: 1e3 * v / rate / requests / extraction_variants for k, v in validator.most_common()
        },
    }


# the extraction benchmark's figures a profile keeps: what the profiled run measured
BENCH_FIGURES = ("ratio", "ratio_per_round", "capture_ratio", "median", "spread", "tokens")


def drop_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without ``name VALUE`` (or ``name=VALUE``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    ap.add_argument("--rate", type=int, default=200, help="samples a second")
    ap.add_argument(
        "--raw", help="summarize this py-spy raw profile (.xz too) instead of recording one"
    )
    ap.add_argument("--keep-raw", help="with a recording: keep its raw profile here (xz)")
    ap.add_argument(
        "--recording-s", type=float, help="with --raw: how long that recording ran (seconds)"
    )
    ap.add_argument("--out")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- extract_throughput args")
    args = ap.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    recording_s = args.recording_s
    measured = None
    if args.raw:
        raw = Path(args.raw)
    else:
        tmp = Path(tempfile.mkdtemp())
        raw = tmp / "gil.txt"
        # the benchmark's own result: proof that it finished (py-spy exits 0 whatever the
        # process it records does), and the ratios of the run the profile is of
        bench_out = tmp / "bench.json"
        bench = [sys.executable, str(REPO / "benchmarks" / "extract_throughput.py")]
        bench += [*drop_option(bench_args, "--out"), "--out", str(bench_out)]
        record = [args.py_spy, "record", "--gil", "--nonblocking", "--format", "raw"]
        t0 = time.monotonic()
        subprocess.run(
            [*record, "--rate", str(args.rate), "-o", str(raw), "--", *bench], check=True
        )
        recording_s = time.monotonic() - t0
        if not bench_out.exists():
            sys.exit(
                "the benchmark under py-spy wrote no result: it failed (its output above says "
                "why), so there is no profile of a measurement to summarize"
            )
        measured = json.loads(bench_out.read_text())
        if args.keep_raw:
            Path(args.keep_raw).write_bytes(lzma.compress(raw.read_bytes()))
    bench = argparse.ArgumentParser(add_help=False)
    bench.add_argument("--rows", type=int, default=64)
    bench.add_argument("--rounds", type=int, default=3)
    bench.add_argument("--typed-requests", action="store_true")
    bench.add_argument("--python-switch-interval", action="store_true")
    bench.add_argument("--httpx-transport", action="store_true")
    bench.add_argument("--validator-wait", action="store_true")
    known, _ = bench.parse_known_args(bench_args)
    requests = known.rows * known.rounds
    variants = 1 + known.typed_requests + known.python_switch_interval + known.httpx_transport
    variants += known.validator_wait
    summary = summarize(raw, args.rate, requests, variants, clients=variants + 2)
    held_s = sum(summary["samples"].values()) / args.rate
    result = {
        "command": " ".join(sys.argv),
        "rate": args.rate,
        "requests_per_variant": requests,
        "extraction_variants": variants,
        # how much of the recording (start-up and server starts included) the lock was held
        "recording_s": recording_s,
        "lock_held_s": held_s,
        "lock_held_share": held_s / recording_s if recording_s else None,
        **summary,
    }
    if measured is not None:
        result["benchmark"] = {k: measured.get(k) for k in BENCH_FIGURES}
    for name, ms in result["lock_ms_per_request"].items():
        print(f"{ms:7.2f} ms a request  {name}")
    for name, ms in result["validator_lock_ms_per_sample"].items():
        print(f"{ms:7.2f} ms a sample   validator: {name}")
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
