"""What the training pool's cleaning removes from the packaged chat sources: every usable
prompt of ShareGPT and chitchat-dataset (first turns, or each user turn with --each-turn),
decontaminated against the default benchmark sources (MT-Bench and HumanEval, every row) and
deduplicated across sources and by MinHash near-duplicates at the default threshold.

    .venv/bin/python benchmarks/pool_cleaning.py --out pool_cleaning.json

Reports, per source, the prompts sampled, removed by reason (benchmark prompts by benchmark
and way, repeats of an earlier source, near-duplicates), what stays, a few removed prompts,
and the seconds the cleaning took (one run).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts
from eagle3_pipeline.runtime import setup_logging

KEYS = (
    "licence",
    "rows_read",
    "kept",
    "duplicates",
    "sampled",
    "decontaminated",
    "decontaminated_by_how",
    "duplicates_across_sources",
    "near_duplicates",
    "in_pool",
    "removed_examples",
)


def clean_pool(cfg: dict, train: list[dict]) -> tuple[dict, dict, float]:
    """``(prompts section, stats, seconds)`` of one training pool of ``train``'s sources at
    the config's defaults, decontaminated against its benchmark sources, none held out."""
    section = {
        **cfg["prompts"],
        "train": train,
        "heldout": 0,
        "decontaminate_against": cfglib.decontamination_sources(cfg),
    }
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        st = prompts.build_train(section, Path(tmp) / "t.jsonl.zst", Path(tmp) / "t.json")
        return section, st, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--each-turn", action="store_true", help="every user turn, with its context")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    setup_logging(None)
    cfg = cfglib.validate({})
    turns = {"each_turn": True, "multi_turn": True} if args.each_turn else {}
    section, st, seconds = clean_pool(
        cfg,
        [
            {"source": "sharegpt", "n": None, **turns},
            {"source": "chitchat", "n": None, **turns},
        ],
    )
    result = {
        "what": "the packaged chat sources through the training pool's cleaning",
        "settings": {
            k: section[k] for k in ("near_duplicates", "decontamination_ngram", "max_chars")
        }
        | {"each_turn": args.each_turn, "against": section["decontaminate_against"]},
        "sources": {n: {k: s.get(k) for k in KEYS} for n, s in st["train"].items()},
        "totals": st["totals"],
        "benchmark_turns_indexed": st["decontamination"]["turns_indexed"],
        "seconds": round(seconds, 1),
    }
    write_result(args.out, result)
    for n, s in result["sources"].items():
        print(
            f"{n}: {s['sampled']} sampled, decontaminated {s['decontaminated']}, repeats "
            f"{s['duplicates_across_sources']}, near-duplicates {s['near_duplicates']}, "
            f"{s['in_pool']} in the pool"
        )


if __name__ == "__main__":
    main()
