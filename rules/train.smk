rule train:
    """Train the EAGLE-3 drafter with speculators and export a checkpoint vLLM loads as-is."""
    input:
        target=out("target/target.json"),
        dataset=out("prepare/dataset"),
        manifest=out("hidden_states/manifest.json"),
        d2t=out("vocab/d2t.npy"),
        t2d=out("vocab/t2d.npy"),
    output:
        config=out("drafter/config.json"),
        weights=out("drafter/model.safetensors"),
        metrics=out("drafter/metrics.json"),
        plot=report(out("drafter/loss.png"), category="Training", caption="../report/train.rst"),
    log:
        log_of("train"),
    benchmark:
        bench_of("train")
    conda:
        "../envs/train.yaml"
    # On the CPU, training uses every core it is given (capped at --cores); on GPUs the cores
    # feed the data loader workers.
    threads: 64
    resources:
        gpus=gpus("train"),
        gpu=gpus("train"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        config=result("train"),
        code=code("workflow_scripts/train.py"),
        work_dir=out("train_work"),
    script:
        "../workflow_scripts/train.py"
