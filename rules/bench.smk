rule bench:
    """Acceptance and speed under real vLLM speculative decoding, baseline side by side."""
    input:
        target=out("target/target.json"),
        drafter=out("drafter/config.json"),
        weights=out("drafter/model.safetensors"),
        manifest=out("hidden_states/manifest.json"),
        train_metrics=out("drafter/metrics.json"),
        prompts=expand(out("prompts/bench_{name}.jsonl"), name=config["bench"]["prompt_sets"]),
        code=code_of("workflow_scripts/bench.py"),
    output:
        metrics=out("bench/metrics.json"),
    log:
        log_of("bench"),
    benchmark:
        bench_of("bench")
    conda:
        "../envs/vllm.yaml"
    resources:
        gpus=gpus("bench"),
        gpu=gpus("bench"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        bench=config["bench"],
        vllm=config["vllm"],
        gpus=gpus("bench"),
        prompt_sets=config["bench"]["prompt_sets"],
    script:
        "../workflow_scripts/bench.py"
