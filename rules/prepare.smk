rule prepare:
    """Training rows {input_ids, loss_mask, seq_len} in the Arrow format speculators reads."""
    input:
        records=out("synth/synth.jsonl.zst"),
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
        config=result("prepare"),
        code=code("workflow_scripts/prepare.py"),
    script:
        "../workflow_scripts/prepare.py"
