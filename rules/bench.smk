rule bench_baseline:
    """Throughput without a drafter on every prompt set: measured once, shared by the methods
    (their speedups are against the same reference). Results are cached per set: a set whose
    target, prompts and settings are unchanged is not measured again, and with nothing to
    measure no server starts."""
    input:
        target=out("target/target.json"),
        prompts=expand(out("prompts/bench_{name}.jsonl"), name=bench_sets()),
    output:
        baseline=out("bench/baseline.json"),
    log:
        log_of("bench_baseline"),
    benchmark:
        bench_of("bench_baseline")
    conda:
        "../envs/vllm.yaml"
    threads: measuring_threads()
    resources:
        gpus=gpus("bench"),
        gpu=gpus("bench"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        config=result("bench_baseline"),
        code=code("workflow_scripts/bench_baseline.py"),
        cache_dir=out("bench/.cache"),
        sets=bench_sets(),
    script:
        "../workflow_scripts/bench_baseline.py"


rule bench:
    """One method's drafter under real vLLM speculative decoding, next to the shared baseline.

    One job per method for all prompt sets (each server start is a model load), with results
    cached per set: a set whose drafter, target, prompts and parameters are unchanged is not
    measured again, and with nothing to measure no server starts.
    """
    input:
        target=out("target/target.json"),
        drafter=out("drafter/{method}/config.json"),
        weights=out("drafter/{method}/model.safetensors"),
        manifest=out("hidden_states/manifest.json"),
        train_metrics=out("drafter/{method}/metrics.json"),
        baseline=out("bench/baseline.json"),
        prompts=expand(out("prompts/bench_{name}.jsonl"), name=bench_sets()),
    output:
        metrics=out("bench/{method}/metrics.json"),
    log:
        log_of("bench_{method}"),
    benchmark:
        bench_of("bench_{method}")
    conda:
        "../envs/vllm.yaml"
    threads: measuring_threads()
    resources:
        gpus=gpus("bench"),
        gpu=gpus("bench"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        config=lambda wildcards: result("bench", method=wildcards.method),
        code=code("workflow_scripts/bench.py"),
        cache_dir=out("bench/.cache"),
        sets=bench_sets(),
    script:
        "../workflow_scripts/bench.py"
