"""One place per drafter method: no module outside ``eagle3_pipeline.methods`` names a method,
every method's config section is in config/schema.yaml, old key places are refused with
their new one, and a variant's method must be registered."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import methods
from eagle3_pipeline.methods.base import SHARED_TRAIN_KEYS

SRC = Path(methods.__file__).resolve().parents[1]
# a method's name as a word (the package's own name, eagle3_pipeline / eagle3-pipeline, is not)
NAMES = "|".join(map(re.escape, methods.METHODS))
NAMED = re.compile(rf"\b({NAMES})\b(?![-_]pipeline)")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def test_no_method_is_named_outside_the_methods_package():
    """A string in code (not a docstring or comment) naming a method, anywhere in src/ but
    methods/, is a method-specific branch that belongs in that method's module."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "methods":
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and NAMED.search(node.value)
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "method names outside methods/:\n" + "\n".join(found)


def test_the_literal_check_can_fail():
    assert NAMED.search("if method == 'dflash'") and NAMED.search("eagle3")
    assert not NAMED.search("eagle3_pipeline.hidden_states.shards") and not NAMED.search(
        "eagle3-pipeline"
    )


def test_each_methods_keys_are_its_schema_section():
    train = cfglib.load_schema()["properties"]["train"]["properties"]
    for name, method in methods.REGISTRY.items():
        assert set(train[name]["properties"]) == set(method.own_keys), name
        # an own key named like a shared one replaces it (overrides) or merges (extra_args)
        clash = set(method.own_keys) & set(SHARED_TRAIN_KEYS)
        assert clash <= {*method.overrides, "extra_args"}, name
    shared = set(train) - set(methods.METHODS) - {"methods", "variants"}
    assert shared == set(SHARED_TRAIN_KEYS) | {"num_workers", "log_freq"}


@pytest.mark.parametrize(
    "given, message",
    [
        ({"ttt_steps": 2}, r"`train.ttt_steps`: unknown key \(did you mean `train.eagle3.ttt_"),
        ({"norm_output": False}, r"unknown key \(did you mean `train.eagle3.norm_output`\?\)"),
        (
            {"methods": ["v"], "variants": {"v": {"method": "eagle3", "num_layers": 2}}},
            r"`train.variants.v.num_layers`: unknown key \(did you mean "
            r"`train.variants.v.dflash.num_layers` or `train.variants.v.eagle3.num_layers` or ",
        ),
    ],
)
def test_a_methods_own_key_in_train_itself_names_its_place(given, message):
    with pytest.raises(cfglib.ConfigError, match=message):
        cfglib.validate({"train": given})


def test_the_default_eagle3_settings_are_where_they_were():
    """The default run trains with the same settings as before the keys moved."""
    train = cfglib.load(cfglib.DEFAULT_PATH)["train"]
    flat = methods.method_train_config(train, "eagle3")
    assert {k: flat[k] for k in ("ttt_steps", "num_layers", "norm_before_fc", "norm_output")} == {
        "ttt_steps": 3,
        "num_layers": 1,
        "norm_before_fc": True,
        "norm_output": True,
    }
    assert set(flat) == {*SHARED_TRAIN_KEYS, "method", *methods.get("eagle3").own_keys}


def test_a_variant_of_an_unknown_method_is_refused():
    with pytest.raises(cfglib.ConfigError, match=r"`train.variants.v.method`: expected one of \["):
        cfglib.validate({"train": {"methods": ["v"], "variants": {"v": {"method": "medusa"}}}})
