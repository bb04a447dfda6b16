"""Rule `report`: the run's HTML/Markdown report (logic: eagle3_pipeline.report)."""

from eagle3_pipeline import report
from eagle3_pipeline.runtime import run_job

PER_METHOD = ("train", "train_plot", "bench")


def job(i, o, p, log):
    methods = p.config["train"]["methods"]
    report.build(
        inputs={k: v for k, v in i.items() if k not in ("bench_prompts", *PER_METHOD)},
        methods={m: {key: i[key][n] for key in PER_METHOD} for n, m in enumerate(methods)},
        bench_prompt_stats=list(i.bench_prompts),
        html_out=o.html,
        markdown_out=o.markdown,
        plots_dir=o.plots,
        run_name=p.config["run"],
    )


run_job(snakemake, job)
