"""Rule `train`: one method's drafter with speculators (logic: eagle3_pipeline.train)."""

from eagle3_pipeline import train
from eagle3_pipeline.config import extracts_in_train, job_section, stage_gpus, train_job_section
from eagle3_pipeline.runtime import run_job

config = snakemake.config
online = None
if extracts_in_train(config):  # extract.mode online/hybrid: the job extracts itself
    online = {
        "extract": job_section(config, snakemake.params.config, "extract"),
        "vllm": job_section(config, snakemake.params.config, "vllm"),
        "synth_temperature": config["synth"]["temperature"],
        "allow_low_disk": "disk" in config["plan"]["allow"],
    }

run_job(
    snakemake,
    lambda i, o, p, log: train.run(
        target_json=i.target,
        dataset_dir=i.dataset,
        manifest_path=i.get("manifest"),
        d2t=i.d2t,
        t2d=i.t2d,
        drafter_dir=o.config.rsplit("/", 1)[0],
        metrics_out=o.metrics,
        plot_out=o.plot,
        cfg=train_job_section(config, p.config),
        work_dir=p.work_dir,
        log_path=log,
        online=online,
    ),
    gpus_needed=stage_gpus(config, "train"),
)
