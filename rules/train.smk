rule train:
    """Train one method's drafter with speculators and export a checkpoint vLLM loads as-is.

    One job per method of train.methods, all from the same prepared rows, vocab map and hidden
    states; each job's params carry only the keys its method reads. With extract.mode online
    or hybrid the job extracts its hidden states itself (its own extraction servers beside the
    trainer, counted in its GPUs), and its params carry extraction's result keys."""
    input:
        **stored_hidden_states(),
        target=out("target/target.json"),
        dataset=out("prepare/dataset"),
        d2t=out("vocab/d2t.npy"),
        t2d=out("vocab/t2d.npy"),
    output:
        config=out("drafter/{method}/config.json"),
        weights=out("drafter/{method}/model.safetensors"),
        metrics=out("drafter/{method}/metrics.json"),
        plot=report(
            out("drafter/{method}/loss.png"),
            category="Training",
            subcategory="{method}",
            caption="../report/train.rst",
        ),
    log:
        log_of("train_{method}"),
    benchmark:
        bench_of("train_{method}")
    conda:
        "../envs/train.yaml"
    # On the CPU, training uses every core it is given (capped at --cores); on GPUs the cores
    # feed the data loader workers.
    threads: 64
    resources:
        **train_nodes_resources(),
        gpus=gpus("train"),
        gpu=gpus("train") * config["train"]["nodes"],  # all its GPUs: the plugin's --gpus
    params:
        config=lambda wildcards: result("train", method=wildcards.method),
        code=lambda wildcards: code("workflow_scripts/train.py", [wildcards.method]),
        work_dir=out("train_work/{method}"),
    script:
        "../workflow_scripts/train.py"
