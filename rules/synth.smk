rule synth:
    """One part of the prompts (synth.jobs parts) answered on its own vLLM server(s), with
    the exact prompt and completion token ids. Answers are journaled per prompt under
    synth/.partial, beside the part manifest that is written last: a part is complete exactly
    when its manifest exists, and a failed part keeps what it answered."""
    input:
        target=out("target/target.json"),
        prompts=out("prompts/train.jsonl.zst"),
    output:
        part=out("synth/parts/part_{part}.json"),
    log:
        log_of("synth_part{part}"),
    benchmark:
        bench_of("synth_part{part}")
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
        part=lambda wildcards: int(wildcards.part),
        parts=config["synth"]["jobs"],
    script:
        "../workflow_scripts/synth.py"


rule synth_gather:
    """Every part's answers merged into one output in the prompt pool's order (the same
    whatever synth.jobs is), and the token-id check over all of them."""
    input:
        target=out("target/target.json"),
        prompts=out("prompts/train.jsonl.zst"),
        parts=expand(out("synth/parts/part_{part}.json"), part=synth_parts()),
    output:
        records=out("synth/synth.jsonl.zst"),
        stats=out("synth/stats.json"),
    log:
        log_of("synth_gather"),
    benchmark:
        bench_of("synth_gather")
    conda:
        "../envs/train.yaml"
    params:
        config=result("synth_gather"),
        code=code("workflow_scripts/synth_gather.py"),
        work_dir=out("synth/.partial"),
    script:
        "../workflow_scripts/synth_gather.py"
