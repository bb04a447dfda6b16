"""Values derived from a validated config that the rules and stages use: prompt set names,
run directory, bench rounds, GPUs per stage, a drafter's k list, a job's config section."""

from __future__ import annotations

from pathlib import Path

from .. import methods
from .schema import ConfigError


def source_name(spec: dict) -> str:
    """Name of a prompt source: its `name`, else the file's stem, else the source kind."""
    if spec.get("name"):
        return spec["name"]
    if spec["source"] == "file":
        return Path(spec["path"]).name.split(".")[0]
    return spec["source"]


# The benchmark set that prompts.heldout takes out of the training pool (a reserved name).
HELDOUT_SET = "heldout"


def bench_sets(cfg: dict) -> list[str]:
    """The benchmark prompt sets the bench stage measures: ``bench.prompt_sets``, then the
    held-out set when ``prompts.heldout`` > 0."""
    sets = list(cfg["bench"]["prompt_sets"])
    if cfg["prompts"]["heldout"] and HELDOUT_SET not in sets:
        sets.append(HELDOUT_SET)
    return sets


def run_dir(cfg: dict) -> str:
    return f"{cfg['results_dir']}/{cfg['run']}"


def server_gpus(cfg: dict) -> int:
    """GPUs a managed vLLM server of this config occupies."""
    v = cfg["vllm"]
    return v["tensor_parallel_size"] if v["device"] == "cuda" else 0


def check_tensor_parallel(tensor_parallel_size: int, architecture: dict) -> None:
    """vLLM splits the attention heads over the tensor-parallel ranks and refuses a size that
    does not divide them (vllm/config/model.py, ``verify_with_parallel_config``), but only after
    its engine started (~30 s), in an error headed by an unrelated pydantic config name. Checked
    here, before a server starts, with the target's head count from target.json."""
    heads = architecture["num_attention_heads"]
    if heads % tensor_parallel_size:
        fits = [n for n in range(1, heads + 1) if heads % n == 0]
        raise ConfigError(
            f"config key `vllm.tensor_parallel_size`: {tensor_parallel_size} does not divide "
            f"the target's {heads} attention heads (target.json: "
            f"architecture.num_attention_heads), which vLLM requires; sizes that do: "
            f"{', '.join(map(str, fits))}"
        )


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


def bench_chat_template_kwargs(cfg: dict) -> dict:
    """The chat template variables of benchmark requests: bench.chat_template_kwargs, or
    synth.chat_template_kwargs where it is null (a thinking target measured as it is served)."""
    own = cfg["bench"].get("chat_template_kwargs")
    return dict(cfg["synth"]["chat_template_kwargs"] if own is None else own)


def speculative_tokens(cfg: dict, method: str) -> list[int]:
    """The k values (bench.num_speculative_tokens) the drafter of ``method`` is served with."""
    ks = cfg["bench"]["num_speculative_tokens"]
    return list(ks[method] if isinstance(ks, dict) else ks)


def job_section(snakemake_config: dict, params_config: dict, section: str) -> dict:
    """A config section as a job passes it to the library: the config's section with the
    rule's result-determining values (its params, which Snakemake tracks) laid over it.
    Every other key of the section is operational for this rule."""
    return {**snakemake_config[section], **params_config.get(section, {})}


def bench_set_spec(cfg: dict, name: str) -> dict:
    """The `prompts.bench` entry that defines benchmark set ``name``."""
    for spec in cfg["prompts"]["bench"]:
        if source_name(spec) == name:
            return spec
    raise KeyError(f"benchmark prompt set {name!r} is not defined in prompts.bench")


def prompt_files(specs: list[dict]) -> list[str]:
    """The user files that prompt sources read (declared as rule inputs)."""
    return [spec["path"] for spec in specs if spec["source"] == "file"]
