"""Rule `bench`: one drafter under vLLM speculative decoding against the target without it
(logic: eagle3_pipeline.bench)."""

from eagle3_pipeline import bench
from eagle3_pipeline.config import job_section, stage_gpus
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: bench.run(
        target_json=i.target,
        drafter_dir=i.drafter.rsplit("/", 1)[0],
        manifest_path=i.get("manifest"),  # none with extract.mode online/hybrid
        train_metrics=i.train_metrics,
        prompt_files=dict(zip(p.sets, i.prompts, strict=True)),
        baseline_json=i.baseline or None,
        metrics_out=o.metrics,
        cfg=job_section(snakemake.config, p.config, "bench"),
        vllm_cfg=job_section(snakemake.config, p.config, "vllm"),
        cache_dir=p.cache_dir,
        log_path=log,
        name=snakemake.wildcards.method,
    ),
    gpus_needed=stage_gpus(snakemake.config, "bench"),
)
