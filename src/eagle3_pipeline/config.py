"""Configuration: schema validation with defaults, readable errors, cross-key checks.

Everything here runs when Snakemake parses the workflow, before any job starts, so a bad
config never costs a model load.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem, one per line."""


def _with_defaults(validator_class):
    """A validator that fills in ``default`` values while it validates."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


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
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=",
              "exclusiveMaximum": "<"}[v]
        msg = f"expected a number {op} {error.validator_value}, got {value!r}"
    elif v == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed)) if isinstance(value, dict) else []
        msg = f"unknown key(s) {extra}; allowed keys: {allowed}"
        hint = None
    elif v == "required":
        msg = error.message.replace("is a required property", "is required")
    elif v == "pattern":
        msg = f"{value!r} does not match the pattern {error.validator_value!r}"
    elif v in ("minItems", "maxItems"):
        msg = f"expected a list with {'at least' if v == 'minItems' else 'at most'} " \
              f"{error.validator_value} item(s), got {len(value)}"
    elif v == "uniqueItems":
        msg = f"items must be unique, got {value!r}"
    elif v == "oneOf":
        options = [s.get("description") or s.get("const") or s.get("type")
                   for s in error.validator_value]
        msg = f"got {value!r}; expected one of: {options}"
    else:
        msg = error.message
    return f"{msg} ({hint})" if hint else msg


def validate(config: dict, schema: dict | None = None) -> dict:
    """Validate ``config`` in place (filling defaults) and run the cross-key checks.

    Raises ConfigError naming each offending key and what is expected.
    """
    schema = schema or load_schema()
    errors = sorted(_Validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    problems = [f"config key `{_key(e)}`: {_describe(e)}" for e in errors]
    if not problems:
        problems = check_semantics(config)
    if problems:
        raise ConfigError("Invalid configuration:\n  - " + "\n  - ".join(problems))
    return config


def check_semantics(cfg: dict) -> list[str]:
    """Checks that span keys or touch the file system; each returns a readable problem."""
    problems: list[str] = []
    t = cfg["target"]
    if t["source"] in ("local", "hub") and not t["path"]:
        problems.append(f"config key `target.path`: required when target.source is "
                        f"{t['source']!r} (a model directory or hub id)")
    if t["source"] == "local" and t["path"]:
        p = Path(t["path"]).expanduser()
        if not (p / "config.json").is_file():
            problems.append(f"config key `target.path`: {str(p)!r} is not a model directory "
                            "(no config.json there)")

    if cfg["vllm"]["device"] == "cpu" and cfg["vllm"]["tensor_parallel_size"] != 1:
        problems.append("config key `vllm.tensor_parallel_size`: must be 1 when vllm.device "
                        "is 'cpu' (tensor parallelism needs GPUs)")

    def check_sources(key: str, sources: list[dict], need_name: bool) -> set[str]:
        names = set()
        for i, src in enumerate(sources):
            where = f"`{key}[{i}]`"
            if src["source"] == "file":
                if not src.get("path"):
                    problems.append(f"config key {where}.path: required for source 'file'")
                elif not Path(src["path"]).expanduser().is_file():
                    problems.append(f"config key {where}.path: file {src['path']!r} not found")
            if need_name and not src.get("name"):
                problems.append(f"config key {where}.name: required for a benchmark set")
                continue
            name = source_name(src) if src.get("path") or src["source"] != "file" else None
            if name in names:
                problems.append(f"config key {where}.name: {name!r} is used twice")
            names.add(name)
        return names

    check_sources("prompts.train", cfg["prompts"]["train"], need_name=False)
    bench_names = check_sources("prompts.bench", cfg["prompts"]["bench"], need_name=True)
    for name in cfg["bench"]["prompt_sets"]:
        if name not in bench_names:
            problems.append(f"config key `bench.prompt_sets`: {name!r} is not defined in "
                            f"prompts.bench (defined: {sorted(n for n in bench_names if n)})")

    if cfg["synth"]["api_key_env"] and not cfg["synth"]["endpoint"]:
        problems.append("config key `synth.api_key_env`: only used with synth.endpoint")

    layer_ids = cfg["extract"]["layer_ids"]
    if layer_ids is not None and layer_ids != sorted(layer_ids):
        problems.append(f"config key `extract.layer_ids`: must be in increasing order, "
                        f"got {layer_ids}")

    if cfg["prepare"]["seq_length"] > cfg["vllm"]["max_model_len"]:
        problems.append("config key `prepare.seq_length`: must not exceed vllm.max_model_len "
                        f"({cfg['prepare']['seq_length']} > {cfg['vllm']['max_model_len']}), "
                        "or extraction cannot prefill the rows")
    if cfg["train"]["gpus"] == 0 and cfg["train"]["fsdp"]:
        problems.append("config key `train.fsdp`: FSDP needs train.gpus >= 2")
    if cfg["train"]["gpus"] == 0 and cfg["train"]["attn_impl"] == "simple_flex_attention":
        problems.append("config key `train.attn_impl`: simple_flex_attention has no CPU "
                        "backward; use sdpa when train.gpus is 0")
    return problems


def load(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a YAML config file, apply overrides (nested dicts), validate."""
    cfg = yaml.safe_load(Path(path).read_text()) or {}
    if overrides:
        deep_update(cfg, overrides)
    return validate(cfg)


def deep_update(base: dict, other: dict) -> dict:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = v
    return base


# ---- values derived from the config, used by the rules -------------------------------------

def source_name(spec: dict) -> str:
    """Name of a prompt source: its `name`, else the file's stem, else the source kind."""
    if spec.get("name"):
        return spec["name"]
    if spec["source"] == "file":
        return Path(spec["path"]).name.split(".")[0]
    return spec["source"]


def run_dir(cfg: dict) -> str:
    return f"{cfg['results_dir']}/{cfg['run']}"


def server_gpus(cfg: dict) -> int:
    """GPUs a managed vLLM server of this config occupies."""
    v = cfg["vllm"]
    return v["tensor_parallel_size"] if v["device"] == "cuda" else 0


def stage_gpus(cfg: dict, stage: str) -> int:
    if stage == "synth":
        return 0 if cfg["synth"]["endpoint"] else server_gpus(cfg)
    if stage in ("extract", "bench"):
        return server_gpus(cfg)
    if stage == "train":
        return cfg["train"]["gpus"]
    return 0


def bench_names(cfg: dict) -> list[str]:
    return [source_name(src) for src in cfg["prompts"]["bench"]]
