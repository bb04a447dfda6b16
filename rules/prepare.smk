rule prepare:
    """Training rows {input_ids, loss_mask, seq_len} in the Arrow format speculators reads."""
    input:
        records=out("synth/synth.jsonl.zst"),
        code=code_of("workflow_scripts/prepare.py"),
    output:
        dataset=directory(out("prepare/dataset")),
        stats=out("prepare/stats.json"),
    log:
        log_of("prepare"),
    benchmark:
        bench_of("prepare")
    conda:
        "../envs/train.yaml"
    params:
        prepare=config["prepare"],
        seed=config["prompts"]["seed"],
    script:
        "../workflow_scripts/prepare.py"
