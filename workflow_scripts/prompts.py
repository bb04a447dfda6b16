"""Rules `prompts_train` and `prompts_bench`: the training pool or one benchmark set
(logic: eagle3_pipeline.prompts)."""

from eagle3_pipeline import prompts
from eagle3_pipeline.config import job_section
from eagle3_pipeline.runtime import run_job


def job(i, o, p, log):
    section = job_section(snakemake.config, p.config, "prompts")
    if snakemake.rule == "prompts_train":
        prompts.build_train(
            section,
            train_out=o.train,
            stats_out=o.stats,
            heldout_out=o.get("heldout"),
            heldout_stats_out=o.get("heldout_stats"),
        )
    else:
        [spec] = section["bench"]
        prompts.build_bench(section, spec, out=o.prompts, stats_out=o.stats)


run_job(snakemake, job)
