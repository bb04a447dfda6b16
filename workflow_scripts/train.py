"""Rule `train`: one method's drafter with speculators (logic: eagle3_pipeline.train)."""

from eagle3_pipeline import train
from eagle3_pipeline.config import stage_gpus, train_job_section
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: train.run(
        target_json=i.target,
        dataset_dir=i.dataset,
        manifest_path=i.manifest,
        d2t=i.d2t,
        t2d=i.t2d,
        drafter_dir=o.config.rsplit("/", 1)[0],
        metrics_out=o.metrics,
        plot_out=o.plot,
        cfg=train_job_section(snakemake.config, p.config),
        work_dir=p.work_dir,
        log_path=log,
    ),
    gpus_needed=stage_gpus(snakemake.config, "train"),
)
