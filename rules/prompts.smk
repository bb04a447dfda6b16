rule prompts:
    """Training prompt pool and benchmark prompt sets, normalized to one schema."""
    input:
        code=code_of("workflow_scripts/prompts.py"),
    output:
        train=out("prompts/train.jsonl.zst"),
        bench=expand(out("prompts/bench_{name}.jsonl"), name=bench_names()),
        stats=out("prompts/stats.json"),
    log:
        log_of("prompts"),
    benchmark:
        bench_of("prompts")
    conda:
        "../envs/train.yaml"
    params:
        prompts=config["prompts"],
    script:
        "../workflow_scripts/prompts.py"
