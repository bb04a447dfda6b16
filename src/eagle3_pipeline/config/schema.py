"""The config's schema and what its errors say: loading config/schema.yaml, one readable line
per schema error (an unknown key with the nearest known one), ``--config`` strings turned back
into the numbers they spell."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "config" / "schema.yaml"


# libyaml's loader where PyYAML was built with it: the schema is read several times per plan,
# and the pure-Python loader takes ten times as long over its 40 kB
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    return yaml.load(Path(path).read_text(), Loader=_LOADER)


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
    elif v == "additionalProperties":  # reported per key by problems_of()
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


def problems_of(error: jsonschema.ValidationError) -> list[str]:
    """One readable line per problem; an unknown key is named itself, with a suggestion."""
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return [f"config key `{_key(error)}`: {_describe(error)}"]
    properties = error.schema.get("properties", {})
    allowed = sorted(properties)
    where = _key(error)
    prefix = "" if where == "<top level>" else where + "."
    lines = []
    for extra in sorted(set(error.instance) - set(allowed)):
        # a key of this name one level down (a method's own key given in train itself), else
        # the nearest name here
        nested = [f"{k}.{extra}" for k in allowed if extra in properties[k].get("properties", {})]
        close = nested or difflib.get_close_matches(str(extra), allowed, n=1)
        names = " or ".join(f"`{prefix}{c}`" for c in close)
        guess = f" (did you mean {names}?)" if close else ""
        scope = "at the top level" if not prefix else f"in `{where}`"
        lines.append(
            f"config key `{prefix}{extra}`: unknown key{guess}; allowed {scope}: "
            f"{', '.join(allowed)}"
        )
    return lines


def at(tree: Any, path) -> Any:
    """The value at ``path`` (keys and list indices) of nested dicts and lists, or None."""
    for part in path:
        found = isinstance(tree, dict) and part in tree
        found |= isinstance(tree, list) and isinstance(part, int) and part < len(tree)
        if not found:
            return None
        tree = tree[part]
    return tree


def coerce_cli_strings(
    config: dict, schema: dict, cli: dict | None = None, max_rounds: int = 50
) -> dict:
    """Turn strings back into the numbers/booleans/nulls they spell, where the schema wants those.

    ``snakemake --config 'vllm={tensor_parallel_size: 8}'`` parses nested values with YAML's
    BaseLoader, so every nested scalar arrives as a string (``'8'``, ``'true'``). A string is
    replaced by ``yaml.safe_load(string)`` only where the schema rejects the string and accepts
    the parsed value, so strings the schema wants (paths, names, ``auto``) are left alone; and
    only where ``cli`` (the ``--config`` values; None: anywhere) holds that same string: a
    value quoted in a config file (``trust_remote_code: "on"``) is the string it says, which
    the schema then refuses.
    """
    validator = jsonschema.Draft202012Validator(schema)
    for _ in range(max_rounds):
        changed = False
        for error in list(validator.iter_errors(config)):  # (collected before any change)
            path = list(error.absolute_path)
            if not path or not isinstance(error.instance, str):
                continue
            if cli is not None and at(cli, path) != error.instance:
                continue  # not given on the command line
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
