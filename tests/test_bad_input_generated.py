"""Generated bad input (hypothesis): malformed prompt files and configs. Each ends in a clear
error naming the file or key, or its bad rows are skipped and counted; none ends in another
exception, and no input or earlier output is changed.

The examples are derandomized, so every run tries the same cases: 150 per test in the full
tier, 40 in the quick one (plain `pytest`);
benchmarks/bad_input_census.py runs this file with EAGLE3_BAD_INPUT_TALLY set and tallies
what each case got (benchmarks/results/checks/bad_input.json)."""

from __future__ import annotations

import collections
import copy
import gzip
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts
from eagle3_pipeline.config import files as config_files
from eagle3_pipeline.runtime.files import iter_jsonl

import tiers
from smkcli import REPO

EXAMPLES = int(os.environ.get("EAGLE3_BAD_INPUT_EXAMPLES", "40" if tiers.QUICK_ONLY else "150"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TALLY: collections.Counter = collections.Counter()
DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def record(kind: str, outcome: str) -> None:
    TALLY[f"{kind}: {outcome}"] += 1


@pytest.fixture(scope="module", autouse=True)
def write_tally():
    yield
    out = os.environ.get("EAGLE3_BAD_INPUT_TALLY")
    if out:
        Path(out).write_text(json.dumps(dict(sorted(TALLY.items())), indent=1) + "\n")


REFUSALS = {  # a fragment of the message -> what the user is told
    "truncated": "corrupt or truncated",
    "no `prompts.train` source gave a usable row": "no usable row",
    "has no rows": "no rows",
    "not valid YAML": "not YAML, with its line",
    "given twice": "a key given twice, with both lines",
    "not UTF-8": "not UTF-8 text",
    "expected a mapping": "not a mapping of keys",
}


def refusal(message: str) -> str:
    return next((what for frag, what in REFUSALS.items() if frag in message), "other")


# ---- prompt files ----------------------------------------------------------------------------

TEXT = st.text(max_size=30)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool", ""]),
        "content": st.one_of(TEXT, st.integers(), st.none()),
    }
)
LINE = st.one_of(
    st.builds(lambda t: json.dumps({"prompt": t}).encode(), TEXT),
    st.builds(lambda ms: json.dumps({"messages": ms}).encode(), st.lists(MESSAGE, max_size=3)),
    st.builds(
        lambda v: json.dumps(v).encode(),
        st.one_of(
            st.integers(),
            st.none(),
            st.lists(st.integers(), max_size=2),
            st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
        ),
    ),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),  # not JSON, or not UTF-8
    st.just(b"   "),
)


def packed(lines: list[bytes], container: str, cut: bool) -> bytes:
    data = b"".join(line + b"\n" for line in lines)
    if container == "zst":
        data = zstandard.ZstdCompressor().compress(data)
    elif container == "gz":
        data = gzip.compress(data)
    return data[: max(len(data) - 3, 0)] if cut else data


@SETTINGS
@given(
    lines=st.lists(LINE, max_size=12),
    container=st.sampled_from(["plain", "zst", "gz"]),
    cut=st.booleans(),
)
def test_a_malformed_prompt_file_is_skipped_and_counted_or_named(lines, container, cut):
    cut = cut and container != "plain"
    suffix = {"plain": ".jsonl", "zst": ".jsonl.zst", "gz": ".jsonl.gz"}[container]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"mine{suffix}"
        data = packed(lines, container, cut)
        path.write_bytes(data)
        out = Path(tmp) / "out" / "train.jsonl.zst"
        out.parent.mkdir()
        out.write_bytes(b"an earlier run's output")
        spec = {"source": "file", "path": str(path), "multi_turn": True}
        params = {"seed": 0, "max_chars": 200, "max_bad_fraction": 1.0, "train": [spec]}
        try:
            stats = prompts.build_train(params, out, out.with_name("stats.json"))
        except ValueError as e:
            assert str(path) in str(e) or "train/mine" in str(e), e  # the file or its source
            assert out.read_bytes() == b"an earlier run's output"  # kept, not half-replaced
            record("prompt file", f"refused, naming the file: {refusal(str(e))}")
        else:
            source = stats["train"]["mine"]
            bad = sum(source["skipped"].values())
            assert source["rows_read"] == bad + source["duplicates"] + source["kept"]
            # the pool's cleaning (prompts.pool) removes repeats and near-duplicates, counted
            removed = (
                sum(source["decontaminated"].values())
                + source["duplicates_across_sources"]
                + source["near_duplicates"]
            )
            assert source["sampled"] == source["kept"]
            assert len(list(iter_jsonl(out))) == source["in_pool"] == source["kept"] - removed
            if not cut:
                assert source["rows_read"] == sum(1 for line in lines if line.strip())
            record("prompt file", "read; bad rows skipped and counted" if bad else "read")
        assert path.read_bytes() == data  # the input is never changed


# ---- configs ---------------------------------------------------------------------------------


def leaves(tree: dict, prefix: tuple = ()) -> list[tuple]:
    found = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            found += leaves(value, (*prefix, key))
        else:
            found.append((*prefix, key))
    return found


KEYS = [*leaves(DEFAULT), ("modle",), ("train", "epoch"), ("vllm", "env", "X")]
VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(),  # NaN and infinities included
    st.text(max_size=12),
    st.sampled_from(["auto", "cuda", "..", "on", "1e3", ".nan", "/nonexistent.jsonl", "a b"]),
    st.lists(st.one_of(st.integers(-3, 40), st.text(max_size=4)), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def with_values(changes: list[tuple[tuple, object]]) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for path, value in changes:
        node = cfg
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = value
    return cfg


def judged(cfg: dict, kind: str, **kw) -> None:
    try:
        cfglib.validate(cfg, **kw)
    except cfglib.ConfigError as e:
        lines = str(e).splitlines()
        items = [ln for ln in lines if ln.startswith("  - ")]
        assert lines[0] == "Invalid configuration:" and items, e
        for item in items:
            assert item.startswith(("  - config key `", "  - config file ")), item
        record(kind, "refused, naming the key")
    else:
        record(kind, "valid: accepted")


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(KEYS), VALUE), min_size=1, max_size=3))
def test_a_config_with_wrong_values_is_refused_naming_each_key(changes):
    judged(with_values(changes), "config values")


@SETTINGS
@given(
    st.lists(st.tuples(st.sampled_from(KEYS), VALUE), max_size=2),
    st.integers(0, 400),
    st.sampled_from(["duplicate a line", "cut", "insert bytes"]),
    st.binary(min_size=1, max_size=6),
)
def test_a_damaged_config_file_is_refused_naming_the_file(changes, at, damage, noise):
    text = yaml.safe_dump(with_values(changes), sort_keys=False).encode()
    lines = text.splitlines(keepends=True)
    at %= max(len(lines), 1)
    if damage == "duplicate a line":
        text = b"".join(lines[: at + 1] + lines[at : at + 1] + lines[at + 1 :])
    elif damage == "cut":
        text = b"".join(lines[:at])
    else:
        text = text[:at] + noise + text[at:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "my.yaml"
        path.write_bytes(text)
        try:
            cfg = config_files.read(path)
        except cfglib.ConfigError as e:
            assert str(e).startswith(("config file ", "Invalid configuration:\n  - config file "))
            assert str(path) in str(e), e
            record("config file", f"refused, naming the file: {refusal(str(e))}")
            return
        assert path.read_bytes() == text
    judged(cfglib.deep_update(copy.deepcopy(DEFAULT), cfg), "config file", cli={})
