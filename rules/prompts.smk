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
        # the prompts the target wrote (self_written sources), with their stats
        written=expand(out("prompts/self_written_{name}.jsonl.zst"), name=self_written()),
        written_stats=expand(out("prompts/self_written_{name}.stats.json"), name=self_written()),
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


rule prompts_write:
    """One part of a self_written source's conversations (synth.jobs parts), written by the
    target on its own vLLM server(s), each step journaled under
    prompts/self_written/<name>/.partial beside the part manifest that is written last."""
    input:
        target=out("target/target.json"),
    output:
        part=out("prompts/self_written/{name}/parts/part_{part}.json"),
    log:
        log_of("prompts_write_{name}_part{part}"),
    benchmark:
        bench_of("prompts_write_{name}_part{part}")
    conda:
        "../envs/vllm.yaml"
    threads: vllm_threads()
    resources:
        gpus=gpus("synth"),
        gpu=gpus("synth"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        config=lambda wildcards: result("prompts_write", written=wildcards.name),
        code=code("workflow_scripts/prompts_write.py"),
        work_dir=lambda wildcards: out(f"prompts/self_written/{wildcards.name}/.partial"),
        part=lambda wildcards: int(wildcards.part),
        parts=config["synth"]["jobs"],
    script:
        "../workflow_scripts/prompts_write.py"


rule prompts_write_gather:
    """A self_written source's kept turns as prompt rows, in conversation order (the same
    whatever synth.jobs is), with what its filters removed."""
    input:
        target=out("target/target.json"),
        parts=expand(
            out("prompts/self_written/{{name}}/parts/part_{part}.json"), part=synth_parts()
        ),
    output:
        rows=out("prompts/self_written_{name}.jsonl.zst"),
        stats=out("prompts/self_written_{name}.stats.json"),
    log:
        log_of("prompts_write_gather_{name}"),
    benchmark:
        bench_of("prompts_write_gather_{name}")
    conda:
        "../envs/train.yaml"
    params:
        config=lambda wildcards: result("prompts_write_gather", written=wildcards.name),
        code=code("workflow_scripts/prompts_write.py"),
        work_dir=lambda wildcards: out(f"prompts/self_written/{wildcards.name}/.partial"),
    script:
        "../workflow_scripts/prompts_write.py"
