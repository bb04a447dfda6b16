"""Rule `extract`: hidden states of one part of the rows (logic: eagle3_pipeline.extract)."""

from eagle3_pipeline import extract
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: extract.run_part(
        part=int(snakemake.wildcards.part),
        jobs=p.jobs,
        target_json=i.target,
        dataset_dir=i.dataset,
        root=p.root,
        part_out=o.part,
        cfg=p.extract,
        vllm_cfg=p.vllm,
        log_path=log,
        synth_temperature=p.synth_temperature,
    ),
    gpus_needed=snakemake.params.gpus,
)
