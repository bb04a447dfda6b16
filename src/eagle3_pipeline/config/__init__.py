"""Configuration: schema validation with defaults, readable errors, cross-key checks.

Everything here runs when Snakemake parses the workflow, before any job starts, so a bad
config never costs a model load.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from .. import methods
from ..bench.settings import bench_chat_template_kwargs, bench_sets, speculative_tokens
from ..prompts.selection import HELDOUT_SET
from ..prompts.sources import bench_set_spec, prompt_files
from ..runtime.errors import ConfigError
from ..staleness.keys import BENCH_VLLM_KEYS, OPERATIONAL_KEYS, RESULT_KEYS
from .checks import (
    check_semantics,
    method_problems,
    notes,
    resolve_train_gpus,
    variant_problems,
)
from .params import result_config, sort_keys
from .schema import SCHEMA_PATH, coerce_cli_strings, load_schema, problems_of
from .values import (
    drafter_names,
    extraction_server_gpus,
    extracts_in_train,
    job_section,
    method_of,
    online_server_gpus,
    run_dir,
    server_gpus,
    stage_gpus,
)

# what the rules, scripts and tests import from here (the config's public names, some of them
# defined where the stage they describe lives)
__all__ = [
    "BENCH_VLLM_KEYS",
    "DEFAULT_PATH",
    "HELDOUT_SET",
    "OPERATIONAL_KEYS",
    "RESULT_KEYS",
    "SCHEMA_PATH",
    "ConfigError",
    "bench_chat_template_kwargs",
    "bench_set_spec",
    "bench_sets",
    "check_semantics",
    "coerce_cli_strings",
    "deep_update",
    "drafter_names",
    "drafter_train_config",
    "extraction_server_gpus",
    "extracts_in_train",
    "job_section",
    "load",
    "load_files",
    "load_schema",
    "method_of",
    "method_problems",
    "notes",
    "online_server_gpus",
    "prompt_files",
    "resolve_train_gpus",
    "result_config",
    "run_dir",
    "server_gpus",
    "speculative_tokens",
    "stage_gpus",
    "train_job_section",
    "validate",
    "variant_problems",
]


def train_job_section(config: dict, params_config: dict) -> dict:
    """One drafter's train settings as its job passes them to the library, in one flat shape:
    its result-determining settings (the rule's params: the shared ``train.*`` keys with the
    method's own ``train.<method>.*`` over them, :func:`methods.method_train_config`) and the
    operational ``train.*`` keys. No other method's section, no list of methods or variants:
    the job trains one drafter."""
    operational = {
        key.partition(".")[2]: config["train"][key.partition(".")[2]]
        for key in OPERATIONAL_KEYS
        if key.startswith("train.")
    }
    return {**operational, **params_config["train"]}


def drafter_train_config(config: dict, drafter: str) -> dict:
    """:func:`train_job_section` of drafter ``drafter`` (a method or a variant) of a validated
    config, as its train job gets it."""
    return train_job_section(config, result_config(config, "train", method=drafter))


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
    problems = [
        p for e in sorted(errors, key=lambda e: list(e.absolute_path)) for p in problems_of(e)
    ]
    explicit_cpu_training = (config.get("train") or {}).get("gpus") == 0
    if not problems:
        fill_defaults(config, str(SCHEMA_PATH), set_default=True)
        problems = resolve_train_gpus(config, explicit_cpu_training)
        problems += check_semantics(config)
    if problems:
        raise ConfigError(
            "Invalid configuration:\n  - "
            + "\n  - ".join(problems)
            + "\n(every key, its type and its default: config/schema.yaml)"
        )
    return sort_keys(config)


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
