"""Rule `synth_gather`: the parts' answers merged and checked (logic: eagle3_pipeline.synth)."""

from eagle3_pipeline import synth
from eagle3_pipeline.config import job_section
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: synth.gather(
        target_json=i.target,
        prompts_path=i.prompts,
        part_manifests=list(i.parts),
        records_out=o.records,
        stats_out=o.stats,
        cfg=job_section(snakemake.config, p.config, "synth"),
        vllm_cfg=job_section(snakemake.config, p.config, "vllm"),
        work_dir=p.work_dir,
    ),
)
