rule target:
    """Materialize the target model as an HF directory and record its architecture."""
    input:
        code=code_of("workflow_scripts/target.py"),
    output:
        info=out("target/target.json"),
    log:
        log_of("target"),
    benchmark:
        bench_of("target")
    conda:
        "../envs/train.yaml"
    params:
        target=config["target"],
    script:
        "../workflow_scripts/target.py"
