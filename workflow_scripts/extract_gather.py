"""Rule `extract_gather`: merge part manifests (logic: eagle3_pipeline.extract)."""

from eagle3_pipeline import extract
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: extract.gather(
        parts=list(i.parts), manifest_out=o.manifest, cfg=snakemake.config["extract"]
    ),
)
