"""Config files read strictly, and values no check can compare.

YAML keeps the last of two equal keys in one mapping and drops the first without a word: a
config file with two ``train:`` sections loses the first one's keys. Snakemake reads the files
that way, so the workflow reads each of them again here and reports every repeated key with its
lines (:func:`duplicate_key_problems`). ``.nan`` and ``.inf`` pass every range of the schema
(a comparison with NaN is false both ways), so they are refused wherever they stand
(:func:`non_finite_problems`).

Config files are trusted like code: a file whose first key is ``__use_yte__: true`` is a YTE
template, which Snakemake evaluates (Python included) when it reads the file, before anything
here sees it (docs/architecture.md, "What a run trusts"). The library's own readers
(:func:`read`) never evaluate one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from ..runtime.errors import ConfigError

MERGE_TAG = "tag:yaml.org,2002:merge"


def _walk(node: yaml.Node, path: str, problems: list[str], name: str) -> None:
    if isinstance(node, yaml.MappingNode):
        first: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                _walk(value_node, path, problems, name)
                continue
            key, line = key_node.value, key_node.start_mark.line + 1
            where = f"{path}.{key}" if path else key
            if key in first:
                problems.append(
                    f"config file {name} line {line}: key `{where}` is given twice in one "
                    f"mapping (first at line {first[key]}): YAML keeps only the last one and "
                    "drops the first without a word; merge the two into one"
                )
            else:
                first[key] = line
            _walk(value_node, where, problems, name)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, f"{path}[{i}]", problems, name)


def duplicate_key_problems(text: str, name: str) -> list[str]:
    """A line for every key repeated within one mapping of the YAML ``text`` (file ``name``);
    text YAML cannot parse gives none here (its reader reports it)."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return []
    problems: list[str] = []
    for node in nodes:
        if node is not None:
            _walk(node, "", problems, name)
    return problems


def file_problems(paths) -> list[str]:
    """:func:`duplicate_key_problems` of each config file of ``paths`` that can be read."""
    problems = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # Snakemake has read it already, or says why it cannot
        problems += duplicate_key_problems(text, str(path))
    return problems


def read(path: str | Path) -> dict:
    """A config file as the workflow reads it (never a YTE template evaluated); ConfigError for
    text that is not YAML, a key repeated in one mapping or a file that is not one mapping."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path}: byte {e.object[e.start]:#04x} at offset {e.start} is not "
            "UTF-8; save the file as UTF-8 text"
        ) from None
    problems = duplicate_key_problems(text, str(path))
    if problems:
        raise ConfigError("Invalid configuration:\n  - " + "\n  - ".join(problems))
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"config file {path}{line}: not valid YAML ({getattr(e, 'problem', None) or e}); "
            "fix the file (a key and its value: `key: value`, nested keys indented)"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of keys, got {data!r:.80}")
    return data


def non_finite_problems(value: Any, path: str = "") -> list[str]:
    """A line for every NaN or infinity in ``value`` (a config), naming its key."""
    if isinstance(value, float) and not math.isfinite(value):
        return [
            f"config key `{path or '<top level>'}`: {value!r} is not a finite number; give "
            "a number (NaN and infinity pass no range check, so they would disable one)"
        ]
    if isinstance(value, dict):
        return [
            p
            for k, v in value.items()
            for p in non_finite_problems(v, f"{path}.{k}" if path else str(k))
        ]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite_problems(v, f"{path}[{i}]")]
    return []
