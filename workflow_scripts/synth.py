"""Rule `synth`: one part of the prompts answered on vLLM (logic: eagle3_pipeline.synth)."""

from eagle3_pipeline import synth
from eagle3_pipeline.config import job_section, stage_gpus
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: synth.run_part(
        target_json=i.target,
        prompts_path=i.prompts,
        part_out=o.part,
        part=p.part,
        parts=p.parts,
        cfg=job_section(snakemake.config, p.config, "synth"),
        vllm_cfg=job_section(snakemake.config, p.config, "vllm"),
        work_dir=p.work_dir,
        log_path=log,
    ),
    gpus_needed=stage_gpus(snakemake.config, "synth"),
)
