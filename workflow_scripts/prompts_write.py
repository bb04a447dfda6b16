"""Rules `prompts_write` (one part of a self_written source's conversations, written by the
target on vLLM) and `prompts_write_gather` (its kept turns as prompt rows) (logic:
eagle3_pipeline.self_written)."""

from eagle3_pipeline import self_written
from eagle3_pipeline.config import job_section, self_written_spec, stage_gpus
from eagle3_pipeline.runtime import run_job


def job(i, o, p, log):
    prompts = job_section(snakemake.config, p.config, "prompts")
    spec = {**self_written_spec(snakemake.config, snakemake.wildcards.name), **prompts["write"]}
    shared = dict(
        spec=spec,
        seed=prompts["seed"],
        synth_cfg=job_section(snakemake.config, p.config, "synth"),
        vllm_cfg=job_section(snakemake.config, p.config, "vllm"),
        work_dir=p.work_dir,
    )
    if snakemake.rule == "prompts_write":
        return self_written.run_part(i.target, o.part, p.part, p.parts, log_path=log, **shared)
    return self_written.gather(i.target, list(i.parts), o.rows, o.stats, **shared)


gpus = stage_gpus(snakemake.config, "synth") if snakemake.rule == "prompts_write" else 0
run_job(snakemake, job, gpus_needed=gpus)
