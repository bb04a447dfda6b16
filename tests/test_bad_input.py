"""Bad input a new user gives: each is refused before any job with a line naming the key or
file (and line) and what to do, or its rows are skipped and counted; none ends in a traceback
or loses a file. The generated cases are in test_bad_input_generated.py."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
import zstandard

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts
from eagle3_pipeline.config import files as config_files
from eagle3_pipeline.config.places import run_dir_problems
from eagle3_pipeline.online.servers import API_KEY_ENV, listening_environment

from smkcli import REPO, env_for, snakemake

DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def default(**sections) -> dict:
    cfg = copy.deepcopy(DEFAULT)
    for section, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    return cfg


def problems(cfg: dict, **kw) -> list[str]:
    with pytest.raises(cfglib.ConfigError) as err:
        cfglib.validate(cfg, **kw)
    return [ln[4:] for ln in str(err.value).splitlines() if ln.startswith("  - ")]


def one_problem(cfg: dict, **kw) -> str:
    found = problems(cfg, **kw)
    assert len(found) == 1, found
    return found[0]


def model_dir(path: Path, config: dict | None = None, template: str | None = TEMPLATE) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or {}))
    (path / "tokenizer.json").write_text("{}")
    if template is not None:
        (path / "chat_template.jinja").write_text(template)
    return path


def local(path: Path) -> dict:
    return {"source": "local", "path": str(path)}


# ---- crashes and data hazards --------------------------------------------------------------


def test_a_non_utf8_byte_skips_its_row_and_names_file_and_line(tmp_path, caplog):
    path = tmp_path / "mine.jsonl"
    path.write_bytes(b'{"prompt": "one"}\n{"prompt": "t\xffwo"}\n{"prompt": "three"}\n{oops\n')
    with caplog.at_level(logging.WARNING):
        rows, stats = prompts.collect({"source": "file", "path": str(path)}, "train", 0, 100, 0.6)
    assert [r["messages"][0]["content"] for r in rows] == ["one", "three"]
    assert stats["skipped"]["malformed"] == 2
    assert stats["malformed_detail"] == {
        "not UTF-8 text": 1,
        "invalid JSON (Expecting property name enclosed in double quotes)": 1,
    }
    assert f"prompt file {path} line 2: byte 0xff at column 14 is not UTF-8: skipped" in caplog.text
    assert f"prompt file {path} line 4: Expecting property name" in caplog.text


@pytest.mark.parametrize("name", ["cut.jsonl.zst", "cut.parquet"])
def test_a_corrupt_compressed_prompt_file_is_named(tmp_path, name):
    path = tmp_path / name
    rows = [{"prompt": f"prompt {i} " + "x" * 40} for i in range(3000)]
    if name.endswith(".zst"):
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        whole = zstandard.ZstdCompressor().compress(data)
    else:
        pl.DataFrame(rows).write_parquet(path)
        whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2] + (b"PAR1" if name.endswith(".parquet") else b""))
    with pytest.raises(ValueError) as err:
        prompts.collect({"source": "file", "path": str(path)}, "train", 0, 100, 0.5)
    assert f"prompt file {path}" in str(err.value)
    assert "a corrupt or truncated file; write it again" in str(err.value)


def test_a_run_named_dot_dot_would_write_into_the_checkout():
    found = problems(default(run=".."))
    assert any("`run`: '..' names no directory of its own" in p for p in found), found
    assert run_dir_problems({"run": "x", "results_dir": str(REPO.parent)}, REPO)
    message = run_dir_problems({"run": REPO.name, "results_dir": str(REPO.parent)}, "/")[0]
    assert "config key `run`: the run would write into" in message
    assert "the pipeline's checkout" in message


def test_a_completed_job_stopped_by_sigterm_succeeds_and_keeps_its_output(tmp_path):
    """Snakemake deletes the outputs of a job that fails; one stopped after writing them all
    (e.g. while its server shuts down) has done its work."""
    script = """
import os, signal, sys
from pathlib import Path
from types import SimpleNamespace
from eagle3_pipeline.runtime import run_job
out = Path(sys.argv[1])
def job(i, o, p, log):
    if sys.argv[2] == "write":
        out.write_text("done")
    os.kill(os.getpid(), signal.SIGTERM)
    import time; time.sleep(5)
ns = SimpleNamespace(log=[sys.argv[1] + ".log"], rule="synth", resources=SimpleNamespace(),
                     input=[], output=[str(out)], params=None)
run_job(ns, job)
"""
    for mode, succeeds in (("write", True), ("none", False)):
        out = tmp_path / f"{mode}.txt"
        proc = subprocess.run(
            [sys.executable, "-c", script, str(out), mode],
            env=env_for(REPO / "src"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (proc.returncode == 0) == succeeds, proc.stderr
    assert (tmp_path / "write.txt").read_text() == "done"
    assert (
        "after writing all its outputs: they are kept" in (tmp_path / "write.txt.log").read_text()
    )
    assert "interrupted; partial work is kept" in (tmp_path / "none.txt.log").read_text()


def test_an_extraction_server_beyond_loopback_needs_a_key(tmp_path):
    assert listening_environment("127.0.0.1", {}) == {} == listening_environment("::1", {})
    with pytest.raises(
        ValueError, match=f"--host 0.0.0.0 listens beyond this machine: set {API_KEY_ENV}"
    ):
        listening_environment("0.0.0.0", {})
    assert listening_environment("10.0.0.5", {API_KEY_ENV: "s3cret"}) == {"VLLM_API_KEY": "s3cret"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/extraction_server.py"),
            "--staging",
            str(tmp_path),
            "--host",
            "0.0.0.0",
            "--print",
        ],
        env={k: v for k, v in env_for(REPO / "src").items() if k != API_KEY_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"listens beyond this machine: set {API_KEY_ENV}" in proc.stderr


# ---- silent accepts ------------------------------------------------------------------------


def test_a_target_path_without_source_local_is_refused():
    message = one_problem(default(target={"path": "/models/x"}))
    assert "`target.path`: '/models/x' is not used with target.source 'packaged'" in message
    assert "set target.source: local" in message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_where_they_stand(value):
    found = problems(default(prompts={"max_bad_fraction": value}, train={"lr": value}))
    assert any(p.startswith("config key `prompts.max_bad_fraction`: ") for p in found), found
    assert any(
        p.startswith("config key `train.lr`: ") and "not a finite number" in p for p in found
    )


def test_a_key_given_twice_in_one_file_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("train:\n  epochs: 3\nvllm:\n  device: cpu\ntrain:\n  lr: 0.001\n")
    with pytest.raises(cfglib.ConfigError) as err:
        config_files.read(path)
    assert (
        f"config file {path} line 5: key `train` is given twice in one mapping (first at "
        "line 1)" in str(err.value)
    )
    assert config_files.duplicate_key_problems("a: {b: 1, c: 2}\nd: [{e: 1}, {e: 2}]\n", "x") == []


def test_a_quoted_value_in_a_file_stays_a_string():
    cfg = default(target={"trust_remote_code": "on"})
    message = one_problem(copy.deepcopy(cfg), cli={})
    assert "`target.trust_remote_code`: expected boolean, got 'on'" in message
    given = {"target": {"trust_remote_code": "on"}}  # from --config: YAML strings, read as values
    assert cfglib.validate(cfg, cli=given)["target"]["trust_remote_code"] is True


def test_no_bench_sets_plan_no_bench():
    message = one_problem(default(prompts={"heldout": 0}, bench={"prompt_sets": []}))
    assert "`bench.prompt_sets`: empty, and prompts.heldout is 0" in message
    assert "--until train" in message


def test_keys_the_extract_mode_ignores_are_noted():
    cfg = cfglib.validate(default(extract={"mode": "stored", "servers": 3}))
    assert any(
        "`extract.servers`: 3 changes nothing with extract.mode stored" in n
        for n in cfglib.notes(cfg)
    )
    online = cfglib.validate(default(extract={"mode": "online", "jobs": 4}))
    assert any(
        "`extract.jobs`: 4 changes nothing with extract.mode online" in n
        for n in cfglib.notes(online)
    )
    assert not any("extract." in n for n in cfglib.notes(cfglib.validate(default())))


# ---- late or unclear errors, now before any job --------------------------------------------


def test_answers_longer_than_the_context_are_refused():
    message = one_problem(default(synth={"max_tokens": 2048}))
    assert (
        "`synth.max_tokens`: 2048 leaves no room for a prompt in vllm.max_model_len 2048" in message
    )


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("rows.json", "[]", "unsupported prompt file type '.json'"),
        ("rows.jsonl.zst", '{"prompt": "x"}\n', "is not a zst file (it starts with b'{\"pr'"),
        ("rows.parquet", "not parquet", "is not a parquet file (it starts with b'not ')"),
    ],
)
def test_a_prompt_file_of_the_wrong_kind_is_named_before_any_job(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_text(content)
    cfg = default(prompts={"train": [{"source": "file", "path": str(path), "n": 100}]})
    message = one_problem(cfg)
    assert message.startswith("config key `prompts.train[0].path`: ") and fragment in message


def test_a_bench_file_whose_name_cannot_name_a_set(tmp_path):
    path = tmp_path / "my prompts.jsonl"
    path.write_text('{"prompt": "x"}\n')
    bench = [{"source": "mtbench"}, {"source": "humaneval"}, {"source": "file", "path": str(path)}]
    message = one_problem(default(prompts={"bench": bench}))
    assert "`prompts.bench[2].path`: the source's name would be 'my prompts'" in message
    assert "give it a `name`" in message


def test_the_targets_vocabulary_and_positions_bound_the_config(tmp_path):
    d = model_dir(tmp_path / "m", {"vocab_size": 1000, "max_position_embeddings": 1024})
    found = problems(default(target=local(d), vocab={"draft_vocab_size": 2000}))
    assert any(
        "`vocab.draft_vocab_size`: 2000 is more than the target's vocabulary (1000" in p
        for p in found
    )
    assert any(
        "`vllm.max_model_len`: 2048 is more than the target's 1024 positions" in p for p in found
    )
    packaged = one_problem(default(vocab={"draft_vocab_size": 60000}))
    assert "the packaged SmolLM2-135M-Instruct" in packaged


def test_a_model_dir_without_tokenizer_or_template_is_named(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    found = problems(default(target=local(bare)))
    assert any("`target.path`: " in p and "has no tokenizer" in p for p in found), found
    assert any("`target.chat_template`: " in p and "has no chat template" in p for p in found)
    code = tmp_path / "code"  # a tokenizer shipped as code (Kimi-K2): its files are its own
    model_dir(code).joinpath("tokenizer.json").unlink()
    (code / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["t.T", null]}}')
    cfglib.validate(default(target={**local(code), "trust_remote_code": True}))
    broken = model_dir(tmp_path / "broken", template="{% for m in messages %}{{ m }}")
    message = one_problem(default(target=local(broken)))
    assert (
        f"the chat template in {broken / 'chat_template.jinja'} is not valid Jinja (line 1:"
        in message
    )


def test_heldout_prompts_that_leave_none_to_train_on_blame_prompts_heldout():
    cfg = default(prompts={"train": [{"source": "sharegpt", "n": 8}], "heldout": 8})
    assert "`prompts.heldout`: 8 held-out prompts leave none" in one_problem(cfg)


def test_command_line_rule_names():
    rules = ["all", "target", "prompts_train", "prompts_bench", "extract", "train"]
    stored = cfglib.validate(default())
    found = cfglib.command_line_problems({"--until": ["prompts"]}, rules, stored)
    assert found == [
        "--until prompts: no rule of that name (did you mean prompts_train or prompts_bench?); "
        "the rules: target, prompts_train, prompts_bench, extract, train"
    ]
    online = cfglib.validate(default(extract={"mode": "online"}))
    [line] = cfglib.command_line_problems({"--until": ["extract"]}, rules, online)
    assert "with extract.mode online there is no extract job" in line
    given = cfglib.rule_options(["-n", "--until", "prompts", "-R", "train", "--cores", "2"])
    assert given == {"--until": ["prompts"], "--omit-from": [], "-R": ["train"]}


# ---- through the command line --------------------------------------------------------------


def test_the_workflow_refuses_them_before_any_job(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("run: a\nrun: b\ntarget:\n  trust_remote_code: 'on'\n")
    proc = snakemake("-n", "--configfile", str(twice), workdir=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.output
    assert f"config file {twice} line 2: key `run` is given twice" in proc.output
    assert "`target.trust_remote_code`: expected boolean, got 'on'" in proc.output
    assert "Building DAG of jobs" not in proc.output
    default_file = str(REPO / "config" / "config.yaml")
    up = snakemake(
        "-n", "--configfile", default_file, "--config", "run=..", workdir=tmp_path, check=False
    )
    assert up.returncode == 1 and "`run`: '..' names no directory of its own" in up.output
    until = snakemake(
        "-n", "--configfile", default_file, "--until", "prompts", workdir=tmp_path, check=False
    )
    assert until.returncode == 1 and "Traceback" not in until.output
    assert "--until prompts: no rule of that name (did you mean prompts_train" in until.output
    assert not (tmp_path / "target").exists() and not (REPO / "target").exists()
    assert set(os.listdir(tmp_path)) <= {"twice.yaml", ".snakemake"}  # nothing written
