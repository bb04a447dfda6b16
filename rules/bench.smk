rule bench_baseline:
    """Throughput without a drafter on every prompt set, for bench.pairing: separate (a target
    that cannot be loaded twice): measured once in bench.rounds rounds, shared by the methods.
    Results are cached per set: a set whose target, prompts and settings are unchanged is not
    measured again, and with nothing to measure no server starts."""
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
    threads: measurement_threads()
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
    """One method's drafter under real vLLM speculative decoding against the target without a
    drafter: with bench.pairing: alternate a baseline server beside the drafter's, rounds
    alternating between them; with separate, the shared bench_baseline.

    One job per method for all prompt sets (each server start is a model load), with results
    cached per set: a set whose drafter, target, prompts and parameters are unchanged is not
    measured again, and with nothing to measure no server starts. Like bench_baseline it holds
    every core, so that Snakemake runs nothing beside a speed measurement.
    """
    input:
        **stored_hidden_states(),
        target=out("target/target.json"),
        drafter=out("drafter/{method}/config.json"),
        weights=out("drafter/{method}/model.safetensors"),
        train_metrics=out("drafter/{method}/metrics.json"),
        baseline=separate_baseline(),
        prompts=expand(out("prompts/bench_{name}.jsonl"), name=bench_sets()),
    output:
        metrics=out("bench/{method}/metrics.json"),
    log:
        log_of("bench_{method}"),
    benchmark:
        bench_of("bench_{method}")
    conda:
        "../envs/vllm.yaml"
    threads: measurement_threads()
    resources:
        gpus=gpus("bench"),
        gpu=gpus("bench"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        config=lambda wildcards: result("bench", method=wildcards.method),
        code=lambda wildcards: code("workflow_scripts/bench.py", [wildcards.method]),
        cache_dir=out("bench/.cache"),
        sets=bench_sets(),
    script:
        "../workflow_scripts/bench.py"
