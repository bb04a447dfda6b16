"""Rule `report`: the run's HTML/Markdown report (logic: eagle3_pipeline.report)."""

from eagle3_pipeline import report
from eagle3_pipeline.runtime import run_job

run_job(
    snakemake,
    lambda i, o, p, log: report.build(
        inputs={k: v for k, v in i.items() if k != "bench_prompts"},
        bench_prompt_stats=list(i.bench_prompts),
        html_out=o.html,
        markdown_out=o.markdown,
        plots_dir=o.plots,
        run_name=p.config["run"],
    ),
)
