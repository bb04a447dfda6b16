"""Values derived from a validated config that the rules and the plan use: the run directory,
GPUs per stage, the drafters' names and methods, a job's config section."""

from __future__ import annotations

from .. import methods


def run_dir(cfg: dict) -> str:
    return f"{cfg['results_dir']}/{cfg['run']}"


def server_gpus(cfg: dict) -> int:
    """GPUs a managed vLLM server of this config occupies."""
    v = cfg["vllm"]
    return v["tensor_parallel_size"] if v["device"] == "cuda" else 0


def extracts_in_train(cfg: dict) -> bool:
    """Whether the train jobs extract their hidden states themselves (extract.mode online or
    hybrid): the DAG then has no extract job."""
    return cfg["extract"]["mode"] != "stored"


def extraction_server_gpus(cfg: dict) -> int:
    """GPUs of their own that the extraction servers of one train job take in online/hybrid
    mode: extract.servers servers of vllm.tensor_parallel_size GPUs each, none where
    extract.endpoints names servers running elsewhere or extract.colocate puts them on the
    trainer's GPUs (or on the CPU)."""
    x = cfg["extract"]
    if x["endpoints"] or x["colocate"]:
        return 0
    return x["servers"] * server_gpus(cfg)


def online_server_gpus(cfg: dict) -> int:
    """GPUs a train job holds for its extraction servers beside its trainer's:
    :func:`extraction_server_gpus` in online/hybrid mode, none in stored mode."""
    return extraction_server_gpus(cfg) if extracts_in_train(cfg) else 0


def stage_gpus(cfg: dict, stage: str) -> int:
    """GPUs one job of ``stage`` holds (on each node, for training over several nodes)."""
    if stage == "synth":
        return 0 if cfg["synth"]["endpoint"] else server_gpus(cfg)
    if stage == "extract":
        return 0 if extracts_in_train(cfg) else server_gpus(cfg)
    if stage == "bench":
        return server_gpus(cfg)
    if stage == "train":
        return cfg["train"]["gpus"] + online_server_gpus(cfg)
    return 0


def drafter_names(cfg: dict) -> list[str]:
    """Every name a drafter may have in this config: the methods and the variants (longest
    first, so that a pattern made of them matches a variant before its method's prefix)."""
    return sorted({*methods.METHODS, *cfg["train"]["variants"]}, key=lambda n: (-len(n), n))


def method_of(cfg: dict, drafter: str) -> str:
    """The method of drafter ``drafter`` (a method of train.methods, or a variant's)."""
    return methods.method_of(cfg["train"], drafter)


def job_section(snakemake_config: dict, params_config: dict, section: str) -> dict:
    """A config section as a job passes it to the library: the config's section with the
    rule's result-determining values (its params, which Snakemake tracks) laid over it.
    Every other key of the section is operational for this rule."""
    return {**snakemake_config[section], **params_config.get(section, {})}
