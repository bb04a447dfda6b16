"""Rule `target`: materialize the target model (logic: eagle3_pipeline.target)."""

from eagle3_pipeline import target
from eagle3_pipeline.config import job_section
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: target.materialize(
        job_section(snakemake.config, p.config, "target"), o.info
    ),
)
