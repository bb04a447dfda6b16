rule vocab:
    """Draft vocabulary map (d2t/t2d) from the loss-masked token frequencies, with coverage."""
    input:
        dataset=out("prepare/dataset"),
        target=out("target/target.json"),
    output:
        d2t=out("vocab/d2t.npy"),
        t2d=out("vocab/t2d.npy"),
        freq=out("vocab/token_freq.npy"),
        coverage=out("vocab/coverage.json"),
        plot=report(out("vocab/coverage.png"), category="Vocabulary", caption="../report/vocab.rst"),
    log:
        log_of("vocab"),
    benchmark:
        bench_of("vocab")
    conda:
        "../envs/train.yaml"
    params:
        config=result("vocab"),
        code=code("workflow_scripts/vocab.py"),
    script:
        "../workflow_scripts/vocab.py"
