rule synth:
    """Answers from the target on a vLLM server, with the exact prompt and completion token ids."""
    input:
        target=out("target/target.json"),
        prompts=out("prompts/train.jsonl.zst"),
    output:
        records=out("synth/synth.jsonl.zst"),
        stats=out("synth/stats.json"),
    log:
        log_of("synth"),
    benchmark:
        bench_of("synth")
    conda:
        "../envs/vllm.yaml"
    threads: vllm_threads()
    resources:
        gpus=gpus("synth"),
        gpu=gpus("synth"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        config=result("synth"),
        code=code("workflow_scripts/synth.py"),
        work_dir=out("synth/.partial"),
    script:
        "../workflow_scripts/synth.py"
