"""Rule `prepare`: training rows for speculators (logic: eagle3_pipeline.prepare)."""

from eagle3_pipeline import prepare
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: prepare.build_dataset(
        records_path=i.records,
        dataset_dir=o.dataset,
        stats_out=o.stats,
        seq_length=p.config["prepare"]["seq_length"],
        seed=p.config["prompts"]["seed"],
        cut_loops=p.config["prepare"]["cut_loops"],
    ),
)
