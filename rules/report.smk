rule report:
    """One HTML/Markdown report of the whole run: every stage's figures, plots and provenance."""
    input:
        **stored_hidden_states(),
        target=out("target/target.json"),
        prompts=out("prompts/train.stats.json"),
        bench_prompts=expand(out("prompts/bench_{name}.stats.json"), name=bench_sets()),
        synth=out("synth/stats.json"),
        prepare=out("prepare/stats.json"),
        vocab=out("vocab/coverage.json"),
        vocab_plot=out("vocab/coverage.png"),
        train=expand(out("drafter/{method}/metrics.json"), method=drafter_methods()),
        train_plot=expand(out("drafter/{method}/loss.png"), method=drafter_methods()),
        bench=expand(out("bench/{method}/metrics.json"), method=drafter_methods()),
    output:
        html=report(out("report/report.html"), category="Report", caption="../report/report.rst"),
        markdown=out("report/report.md"),
        plots=report(
            directory(out("report/plots")),
            patterns=["{plot}.png"],
            category="Benchmark",
            caption="../report/bench.rst",
        ),
    log:
        log_of("report"),
    benchmark:
        bench_of("report")
    conda:
        "../envs/train.yaml"
    params:
        config=result("report"),
        code=code("workflow_scripts/report.py", drafter_methods()),
    script:
        "../workflow_scripts/report.py"
