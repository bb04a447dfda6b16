"""Rule `synth`: generate answers on a vLLM server (logic: eagle3_pipeline.synth)."""

from eagle3_pipeline import synth
from eagle3_pipeline.config import job_section, stage_gpus
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: synth.run(
        target_json=i.target,
        prompts_path=i.prompts,
        records_out=o.records,
        stats_out=o.stats,
        cfg=job_section(snakemake.config, p.config, "synth"),
        vllm_cfg=job_section(snakemake.config, p.config, "vllm"),
        work_dir=p.work_dir,
        log_path=log,
    ),
    gpus_needed=stage_gpus(snakemake.config, "synth"),
)
