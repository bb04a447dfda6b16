rule bench:
    """Acceptance and speed under real vLLM speculative decoding, baseline side by side.

    One job for all prompt sets (each server start is a model load), with results cached per
    set: a set whose drafter, target, prompts and parameters are unchanged is not measured
    again, and with nothing to measure no server starts.
    """
    input:
        target=out("target/target.json"),
        drafter=out("drafter/config.json"),
        weights=out("drafter/model.safetensors"),
        manifest=out("hidden_states/manifest.json"),
        train_metrics=out("drafter/metrics.json"),
        prompts=expand(out("prompts/bench_{name}.jsonl"), name=bench_sets()),
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
        config=result("bench"),
        code=code("workflow_scripts/bench.py"),
        cache_dir=out("bench/.cache"),
        sets=bench_sets(),
    script:
        "../workflow_scripts/bench.py"
