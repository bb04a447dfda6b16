"""Rule `extract`: hidden states of one part of the rows (logic: eagle3_pipeline.extract)."""

from eagle3_pipeline import extract
from eagle3_pipeline.config import job_section, stage_gpus
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: extract.run_part(
        part=int(snakemake.wildcards.part),
        jobs=p.config["extract"]["jobs"],
        target_json=i.target,
        dataset_dir=i.dataset,
        root=p.root,
        part_out=o.part,
        cfg=job_section(snakemake.config, p.config, "extract"),
        vllm_cfg=job_section(snakemake.config, p.config, "vllm"),
        log_path=log,
        synth_temperature=snakemake.config["synth"]["temperature"],
        allow_low_disk="disk" in snakemake.config["plan"]["allow"],
    ),
    gpus_needed=stage_gpus(snakemake.config, "extract"),
)
