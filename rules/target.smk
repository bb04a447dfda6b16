rule target:
    """Materialize the target model as an HF directory and record its architecture."""
    input:
        # a local target's config, tokenizer and chat template: an edit re-runs the chain
        defining=target_files(),
    output:
        info=out("target/target.json"),
    log:
        log_of("target"),
    benchmark:
        bench_of("target")
    conda:
        "../envs/train.yaml"
    params:
        config=result("target"),
        code=code("workflow_scripts/target.py"),
    script:
        "../workflow_scripts/target.py"
