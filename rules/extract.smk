rule extract:
    """Hidden states of one contiguous part of the training rows (one model load per part).

    Shards are written beside the part manifest and survive a failed job; the manifest is
    written last, so a part is complete exactly when its manifest exists.
    """
    input:
        target=out("target/target.json"),
        dataset=out("prepare/dataset"),
    output:
        part=out("hidden_states/parts/part_{part}.json"),
    log:
        log_of("extract_part{part}"),
    benchmark:
        bench_of("extract_part{part}")
    conda:
        "../envs/vllm.yaml"
    threads: vllm_threads()
    resources:
        gpus=gpus("extract"),
        gpu=gpus("extract"),  # same count, under the name the slurm plugin turns into --gpus
    params:
        config=result("extract"),
        code=code("workflow_scripts/extract.py"),
        # hidden_states/ (shards live beside the manifests), derived from the output path
        root=lambda wildcards, output: str(Path(output.part).parent.parent),
    script:
        "../workflow_scripts/extract.py"


rule extract_gather:
    """Merge the part manifests into the manifest training reads."""
    input:
        parts=expand(out("hidden_states/parts/part_{part}.json"), part=extract_parts()),
    output:
        manifest=out("hidden_states/manifest.json"),
    log:
        log_of("extract_gather"),
    benchmark:
        bench_of("extract_gather")
    conda:
        "../envs/train.yaml"
    params:
        code=code("workflow_scripts/extract_gather.py"),
    script:
        "../workflow_scripts/extract_gather.py"
