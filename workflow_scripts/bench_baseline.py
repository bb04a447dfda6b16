"""Rule `bench_baseline`: throughput without a drafter, shared by every method's bench job
(logic: eagle3_pipeline.bench)."""

from eagle3_pipeline import bench
from eagle3_pipeline.config import job_section, stage_gpus
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: bench.run_baseline(
        target_json=i.target,
        prompt_files=dict(zip(p.sets, i.prompts, strict=True)),
        out=o.baseline,
        cfg=job_section(snakemake.config, p.config, "bench"),
        vllm_cfg=job_section(snakemake.config, p.config, "vllm"),
        cache_dir=p.cache_dir,
        log_path=log,
    ),
    gpus_needed=stage_gpus(snakemake.config, "bench"),
)
