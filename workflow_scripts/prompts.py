"""Rule `prompts`: training pool and benchmark sets (logic: eagle3_pipeline.prompts)."""

from pathlib import Path

from eagle3_pipeline import prompts
from eagle3_pipeline.runtime import run_job


def job(i, o, p, log):
    bench_outs = {Path(f).stem.removeprefix("bench_"): f for f in o.bench}
    prompts.build(p.prompts, train_out=o.train, bench_outs=bench_outs, stats_out=o.stats)


run_job(snakemake, job)
