rule prompts_train:
    """The training prompt pool, normalized to one schema, without duplicates and prompts of
    the benchmark sets, and the held-out benchmark set taken out of it (prompts.heldout > 0)."""
    input:
        # the target's tokenizer and chat template count each prompt's tokens
        target=out("target/target.json"),
        # the user's prompt files: editing one re-runs this job and what depends on it
        files=train_prompt_files(),
        # the sources of the benchmark sets the pool is decontaminated against
        bench_files=decontamination_files(),
    output:
        **heldout_outputs(),
        train=out("prompts/train.jsonl.zst"),
        stats=out("prompts/train.stats.json"),
    log:
        log_of("prompts_train"),
    benchmark:
        bench_of("prompts_train")
    conda:
        "../envs/train.yaml"
    params:
        config=result("prompts_train"),
        code=code("workflow_scripts/prompts.py"),
    script:
        "../workflow_scripts/prompts.py"


rule prompts_bench:
    """One benchmark prompt set (a job per set: adding one touches no other). The held-out
    set is not one of them: prompts_train writes it."""
    input:
        target=out("target/target.json"),
        files=bench_prompt_files,
    output:
        prompts=out(f"prompts/bench_{{name,{NOT_HELDOUT}}}.jsonl"),
        stats=out(f"prompts/bench_{{name,{NOT_HELDOUT}}}.stats.json"),
    log:
        log_of("prompts_bench_{name}"),
    benchmark:
        bench_of("prompts_bench_{name}")
    conda:
        "../envs/train.yaml"
    params:
        config=lambda wildcards: result("prompts_bench", bench_set=wildcards.name),
        code=code("workflow_scripts/prompts.py"),
    script:
        "../workflow_scripts/prompts.py"
