"""Configuration: schema validation with defaults, readable errors, cross-key checks.

Everything here runs when Snakemake parses the workflow, before any job starts, so a bad
config never costs a model load.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from . import methods
from .train.trainer_config import device_problems

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem, one per line."""


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    return yaml.safe_load(Path(path).read_text())


def _key(error: jsonschema.ValidationError) -> str:
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in error.absolute_path]
    return ".".join(parts).replace(".[", "[") or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    v, value, schema = error.validator, error.instance, error.schema
    hint = schema.get("description")
    if v == "type":
        expected = v and error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        msg = f"expected {expected}, got {value!r} ({type(value).__name__})"
    elif v == "enum":
        msg = f"expected one of {error.validator_value}, got {value!r}"
    elif v == "const":
        msg = f"expected {error.validator_value!r}, got {value!r}"
    elif v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        msg = f"expected a number {op} {error.validator_value}, got {value!r}"
    elif v == "additionalProperties":  # reported per key by _problems()
        msg = error.message
        hint = None
    elif v == "required":
        msg = error.message.replace("is a required property", "is required")
    elif v == "pattern":
        msg = f"{value!r} does not match the pattern {error.validator_value!r}"
    elif v in ("minItems", "maxItems"):
        msg = (
            f"expected a list with {'at least' if v == 'minItems' else 'at most'} "
            f"{error.validator_value} item(s), got {len(value)}"
        )
    elif v == "uniqueItems":
        msg = f"items must be unique, got {value!r}"
    elif v in ("oneOf", "anyOf"):
        # The branch of the right type explains best (0 -> "expected >= 1"); else list them.
        near = [e for e in error.context or [] if e.validator not in ("type", "const", "enum")]
        if near:
            msg = _describe(near[0]).split(" (")[0]
        else:
            msg = (
                f"expected {' or '.join(_option(s) for s in error.validator_value)}, got {value!r}"
            )
    else:
        msg = error.message
    return f"{msg} ({hint})" if hint else msg


def _option(schema: dict) -> str:
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return " or ".join(map(repr, schema["enum"]))
    text = str(schema.get("type", "a value"))
    if "minimum" in schema:
        text += f" >= {schema['minimum']}"
    return text


def validate(config: dict) -> dict:
    """Validate ``config`` in place (filling defaults) and run the cross-key checks.

    Raises ConfigError naming each offending key and what is expected: every problem at once,
    an unknown key with the nearest known one. Snakemake's own ``validate`` fills the defaults
    once the config is valid (it stops at the first error, with jsonschema's message).
    """
    from snakemake.utils import validate as fill_defaults

    schema = load_schema()
    coerce_cli_strings(config, schema)
    for variant in ((config.get("train") or {}).get("variants") or {}).values():
        if isinstance(variant, dict):  # typed by the train section it is laid over
            own = {"train": {k: v for k, v in variant.items() if k != "method"}}
            variant.update(coerce_cli_strings(own, schema)["train"])
    errors = jsonschema.Draft202012Validator(schema).iter_errors(config)
    problems = moved_key_problems(config) or [
        p for e in sorted(errors, key=lambda e: list(e.absolute_path)) for p in _problems(e)
    ]
    if not problems:
        fill_defaults(config, str(SCHEMA_PATH), set_default=True)
        problems = check_semantics(config)
    if problems:
        raise ConfigError(
            "Invalid configuration:\n  - "
            + "\n  - ".join(problems)
            + "\n(every key, its type and its default: config/schema.yaml)"
        )
    return sort_keys(config)


def moved_key_problems(config: dict) -> list[str]:
    """A method's own key given where it was before it moved under ``train.<method>`` (in
    ``train`` or a variant): named with its new place."""
    train = config.get("train")
    if not isinstance(train, dict):
        return []
    sections = {"train": train}
    for name, variant in (train.get("variants") or {}).items():
        if isinstance(variant, dict):
            sections[f"train.variants.{name}"] = variant
    return [
        f"config key `{where}.{key}`: {where}.{key} moved to {where}.{m.name}.{key}"
        for where, section in sections.items()
        for m in methods.REGISTRY.values()
        for key in m.moved_from_train
        if key in section
    ]


def sort_keys(value: Any) -> Any:
    """Sort every mapping's keys, in place (lists keep their order).

    Snakemake decides "Params have changed" by comparing the repr of each param, and a config
    section's repr depends on key order: the same values given through ``--config`` (which puts
    the given keys first) or a reordered file would re-run finished stages. Sorted keys make a
    section's repr depend on its values only.
    """
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        value.clear()
        value.update((k, sort_keys(v)) for k, v in items)
    elif isinstance(value, list):
        for item in value:
            sort_keys(item)
    return value


def _problems(error: jsonschema.ValidationError) -> list[str]:
    """One readable line per problem; an unknown key is named itself, with a suggestion."""
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return [f"config key `{_key(error)}`: {_describe(error)}"]
    allowed = sorted(error.schema.get("properties", {}))
    where = _key(error)
    prefix = "" if where == "<top level>" else where + "."
    lines = []
    for extra in sorted(set(error.instance) - set(allowed)):
        close = difflib.get_close_matches(str(extra), allowed, n=1)
        guess = f" (did you mean `{prefix}{close[0]}`?)" if close else ""
        scope = "at the top level" if not prefix else f"in `{where}`"
        lines.append(
            f"config key `{prefix}{extra}`: unknown key{guess}; allowed {scope}: "
            f"{', '.join(allowed)}"
        )
    return lines


def coerce_cli_strings(config: dict, schema: dict, max_rounds: int = 50) -> dict:
    """Turn strings back into the numbers/booleans/nulls they spell, where the schema wants those.

    ``snakemake --config 'vllm={tensor_parallel_size: 8}'`` parses nested values with YAML's
    BaseLoader, so every nested scalar arrives as a string (``'8'``, ``'true'``). A string is
    replaced by ``yaml.safe_load(string)`` only where the schema rejects the string and accepts
    the parsed value, so strings the schema wants (paths, names, ``auto``) are left alone.
    """
    validator = jsonschema.Draft202012Validator(schema)
    for _ in range(max_rounds):
        changed = False
        for error in list(validator.iter_errors(config)):  # (collected before any change)
            path = list(error.absolute_path)
            if not path or not isinstance(error.instance, str):
                continue
            value = _scalar_from_string(error.instance)
            if isinstance(value, str):
                continue
            if error.validator == "type":
                types = error.validator_value
                fits = any(
                    validator.is_type(value, t)
                    for t in (types if isinstance(types, list) else [types])
                )
            else:  # oneOf / anyOf / enum / const: the parsed value must satisfy the keyword
                fits = validator.evolve(schema=error.schema).is_valid(value)
            if fits:
                parent = config
                for key in path[:-1]:
                    parent = parent[key]
                if parent[path[-1]] == error.instance:
                    parent[path[-1]] = value
                    changed = True
        if not changed:
            break
    return config


def _scalar_from_string(text: str) -> Any:
    """``'8'`` -> 8, ``'1e-4'`` -> 0.0001, ``'true'`` -> True, ``'null'`` -> None; else ``text``."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, (dict, list)):
        return text
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
        except ValueError:
            return text
    return value


def check_semantics(cfg: dict) -> list[str]:
    """Checks that span keys or touch the file system; each returns a readable problem."""
    problems: list[str] = []
    t = cfg["target"]
    if t["source"] in ("local", "hub") and not t["path"]:
        problems.append(
            f"config key `target.path`: required when target.source is "
            f"{t['source']!r} (a model directory or hub id)"
        )
    if t["source"] == "local" and t["path"]:
        p = Path(t["path"]).expanduser()
        if not (p / "config.json").is_file():
            problems.append(
                f"config key `target.path`: {str(p)!r} is not a model directory "
                "(no config.json there)"
            )

    if cfg["vllm"]["device"] == "cpu" and cfg["vllm"]["tensor_parallel_size"] != 1:
        problems.append(
            "config key `vllm.tensor_parallel_size`: must be 1 when vllm.device "
            "is 'cpu' (the pipeline runs tensor parallelism on GPUs; on the CPU the ranks "
            "would only share the same cores)"
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
                elif not Path(src["path"]).expanduser().is_file():
                    problems.append(f"config key `{where}.path`: file {src['path']!r} not found")
            if src["source"] == "file" and not src.get("path"):
                continue
            name = source_name(src)
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
    for name in cfg["bench"]["prompt_sets"]:
        if name not in bench_names:
            problems.append(
                f"config key `bench.prompt_sets`: {name!r} is not defined in "
                f"prompts.bench (defined: {sorted(n for n in bench_names if n)}"
                + ("; the held-out set needs prompts.heldout > 0)" if name == HELDOUT_SET else ")")
            )

    if cfg["synth"]["api_key_env"] and not cfg["synth"]["endpoint"]:
        problems.append("config key `synth.api_key_env`: only used with synth.endpoint")

    layer_ids = cfg["extract"]["layer_ids"]
    if layer_ids is not None and layer_ids != sorted(layer_ids):
        problems.append(
            f"config key `extract.layer_ids`: must be in increasing order, got {layer_ids}"
        )

    if cfg["prepare"]["seq_length"] > cfg["vllm"]["max_model_len"]:
        problems.append(
            "config key `prepare.seq_length`: must not exceed vllm.max_model_len "
            f"({cfg['prepare']['seq_length']} > {cfg['vllm']['max_model_len']}), "
            "or extraction cannot prefill the rows"
        )
    problems += device_problems(cfg["train"])
    problems += method_problems(cfg)
    return problems


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
        for p in _problems(e)
    ]


def load(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a YAML config file, apply overrides (nested dicts), validate."""
    cfg = yaml.safe_load(Path(path).read_text()) or {}
    if overrides:
        deep_update(cfg, overrides)
    return validate(cfg)


DEFAULT_PATH = SCHEMA_PATH.with_name("config.yaml")


def load_files(paths: list[str | Path]) -> dict:
    """The config a Snakemake run with ``--configfile PATHS`` gets: the workflow's
    config/config.yaml, then each file merged over it in order (nested keys merged, lists
    replaced), validated."""
    cfg = yaml.safe_load(DEFAULT_PATH.read_text()) or {}
    for path in paths:
        deep_update(cfg, yaml.safe_load(Path(path).read_text()) or {})
    return validate(cfg)


def deep_update(base: dict, other: dict) -> dict:
    """``other`` laid over ``base`` in place (mappings merged key by key); returns ``base``."""
    base.update(methods.merged(base, other))
    return base


# ---- values derived from the config, used by the rules -------------------------------------


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


# bench.rounds: auto: speed on a GPU needs several rounds to show its spread; on the CPU one
# round keeps the embedded default short (its speeds are noisy either way).
AUTO_ROUNDS = {"cuda": 3, "cpu": 1}


def bench_rounds(bench_cfg: dict, vllm_cfg: dict) -> int:
    """How many rounds each bench measurement takes (``bench.rounds``, auto resolved)."""
    rounds = bench_cfg["rounds"]
    return AUTO_ROUNDS[vllm_cfg["device"]] if rounds == "auto" else int(rounds)


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


def stage_gpus(cfg: dict, stage: str) -> int:
    if stage == "synth":
        return 0 if cfg["synth"]["endpoint"] else server_gpus(cfg)
    if stage in ("extract", "bench"):
        return server_gpus(cfg)
    if stage == "train":
        return cfg["train"]["gpus"]
    return 0


# ---- what makes a stage stale -----------------------------------------------------------------

BENCH_VLLM_KEYS = (
    "vllm.device",
    "vllm.dtype",
    "vllm.tensor_parallel_size",
    "vllm.enforce_eager",
    "vllm.max_model_len",
)
# Config keys whose value changes a rule's output, per rule. A rule's params carry exactly these
# (:func:`result_config`), so a change of one re-runs that rule and everything downstream of it.
# A prompts_bench job gets only its own set's entry of prompts.bench.
RESULT_KEYS: dict[str, tuple[str, ...]] = {
    "target": (
        "target.source",
        "target.path",
        "target.revision",
        "target.dtype",
        "target.trust_remote_code",
    ),
    "prompts_train": ("prompts.seed", "prompts.max_chars", "prompts.train", "prompts.heldout"),
    "prompts_bench": ("prompts.seed", "prompts.max_chars", "prompts.bench"),
    "synth": (
        "synth.max_tokens",
        "synth.temperature",
        "synth.top_p",
        "synth.seed",
        "synth.reasoning_parser",
        "synth.chat_template_kwargs",
        "vllm.device",
        "vllm.dtype",
        "vllm.max_model_len",
    ),
    "prepare": ("prepare.seq_length", "prepare.cut_loops", "prompts.seed"),
    "vocab": ("vocab.draft_vocab_size", "vocab.target_coverage"),
    "extract": (
        "extract.layer_ids",
        "extract.storage",
        "extract.samples_per_shard",
        "extract.jobs",
        "vllm.device",
        "vllm.dtype",
    ),
    "extract_gather": (),
    # One job per method, whose params carry only the keys that method reads
    # (methods.method_train_config): a key of train.<method> re-runs that method's training
    # alone.
    "train": (
        *(f"train.{k}" for k in methods.SHARED_TRAIN_KEYS),
        *(f"train.{m}" for m in methods.METHODS),
        "train.variants",
    ),
    # The baseline on its own (bench.pairing: separate), shared by every method.
    "bench_baseline": (
        "bench.prompt_sets",
        "bench.temperatures",
        "bench.concurrency",
        "bench.max_tokens",
        "bench.rounds",
        *BENCH_VLLM_KEYS,
    ),
    # One job per method; num_speculative_tokens is that method's list.
    "bench": (
        "bench.prompt_sets",
        "bench.num_speculative_tokens",
        "bench.temperatures",
        "bench.concurrency",
        "bench.max_tokens",
        "bench.rounds",
        "bench.pairing",
        "bench.min_acceptance_length",
        "bench.min_measured_to_predicted",
        *BENCH_VLLM_KEYS,
    ),
    # the methods to put side by side (adding one adds its train and bench jobs)
    "report": ("run", "train.methods"),
}

# Keys that change no rule's output: they decide how a stage runs, not what it produces -
# where and how fast (concurrency, timeouts, retries, memory, server arguments and environment,
# data loader workers, logging) and the acceptance checks that fail a job (a stricter threshold
# applies from the next run that computes). Jobs read them from the config, so changing one
# re-runs nothing. A key that changes one rule's output is operational for the other rules
# (vllm.tensor_parallel_size sets the speed bench measures, and only how synth runs).
# `results_dir` is part of every output path: another value is another run, not a re-run.
OPERATIONAL_KEYS: tuple[str, ...] = (
    "results_dir",
    "vllm.startup_timeout_s",
    "vllm.shutdown_grace_s",
    "vllm.cpu_kvcache_gib",
    "vllm.extra_args",
    "vllm.env",
    "prompts.max_bad_fraction",
    "synth.endpoint",
    "synth.api_key_env",
    "synth.model_name",
    "synth.concurrency",
    "synth.request_timeout_s",
    "synth.retries",
    "synth.server_args",
    "synth.max_failed_fraction",
    "synth.max_template_mismatch_fraction",
    "extract.concurrency",
    "extract.request_timeout_s",
    "extract.retries",
    "extract.min_next_token_agreement",
    "extract.agreement_positions_per_sample",
    "extract.verify_device",
    "extract.reference_forward",
    "extract.reference_rows",
    "extract.max_reference_rel_error",
    "extract.disk_margin",
    "extract.server_args",
    "train.num_workers",
    "train.log_freq",
    "bench.request_timeout_s",
    "bench.server_args",
)


def _lookup(cfg: dict, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = value[part]
    return value


def result_config(
    cfg: dict, rule: str, bench_set: str | None = None, method: str | None = None
) -> dict:
    """The result-determining part of the config for ``rule``, as nested sections
    (``{"synth": {"max_tokens": ...}, "vllm": {...}}``): the rule's ``params``. For
    ``prompts_bench``, ``prompts.bench`` holds only the entry of ``bench_set``; for ``train``,
    ``train`` holds the keys ``method`` reads (flat, its own over the shared ones); for
    ``bench``, ``bench.num_speculative_tokens`` is the list of ``method``."""
    if rule == "train":
        return {
            "train": sort_keys(copy.deepcopy(methods.method_train_config(cfg["train"], method)))
        }
    out: dict = {}
    for key in sorted(RESULT_KEYS[rule]):
        *sections, name = key.split(".")
        node = out
        for s in sections:
            node = node.setdefault(s, {})
        if key == "prompts.bench":
            node[name] = [copy.deepcopy(bench_set_spec(cfg, bench_set))]
        elif key == "bench.num_speculative_tokens":
            node[name] = speculative_tokens(cfg, method)
        else:
            node[name] = copy.deepcopy(_lookup(cfg, key))
    if rule == "extract" and methods.extra_layer_ids(cfg["train"]):
        # layers a method asks for beyond extract.layer_ids (absent when there are none, so
        # the default config's extraction params are what they were)
        out["extract"]["method_layer_ids"] = methods.extra_layer_ids(cfg["train"])
    return out


def drafter_names(cfg: dict) -> list[str]:
    """Every name a drafter may have in this config: the methods and the variants (longest
    first, so that a pattern made of them matches a variant before its method's prefix)."""
    return sorted({*methods.METHODS, *cfg["train"]["variants"]}, key=lambda n: (-len(n), n))


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
