"""Rule `vocab`: draft vocabulary map and coverage (logic: eagle3_pipeline.vocab)."""

from eagle3_pipeline import vocab
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: vocab.build(
        dataset_dir=i.dataset,
        target_json=i.target,
        d2t_out=o.d2t,
        t2d_out=o.t2d,
        freq_out=o.freq,
        coverage_out=o.coverage,
        plot_out=o.plot,
        draft_vocab_size=p.config["vocab"]["draft_vocab_size"],
        target_coverage=p.config["vocab"]["target_coverage"],
    ),
)
