"""Workflow-level behaviour on the default config, through the snakemake CLI: its plan, the
lint, and the staleness matrix (what a change of a key, a parameter or the code re-runs after a
finished run). The quick tier's share of the workflow; plans of GPU, cluster, methods and
online settings are tests/test_workflow_plans.py.

Every test is a dry run (or a `--touch` run) in a temporary directory: no stage code runs, so
these stay fast and need neither models nor vLLM. What they prove and what they do not is said
test by test.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from smkcli import (
    REPO,
    STAGES,
    downstream,
    env_for,
    job_names,
    plan,
    rerun_plan,
    snakemake,
)

SRC = REPO / "src"

DEFAULT_CONFIG = str(REPO / "config" / "config.yaml")
CUDA_TP8 = "vllm={device: cuda, tensor_parallel_size: 8}"


def by_rule(jobs):
    return collections.Counter(j.rule for j in jobs)


# ---- the default plan ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_plan(tmp_path_factory):
    return plan("--configfile", DEFAULT_CONFIG, workdir=tmp_path_factory.mktemp("default"))


def test_default_config_plans_every_stage_once(default_plan):
    # one prompts_bench job per benchmark set (the default has two; the held-out set comes
    # from prompts_train), one train and one bench job for its one method (which measures the
    # baseline beside its drafter: bench.pairing alternate)
    assert job_names(default_plan) == [
        "bench[method=eagle3]",
        "extract[part=0]",
        "extract_gather",
        "prepare",
        "prompts_bench[name=humaneval]",
        "prompts_bench[name=mtbench]",
        "prompts_train",
        "report",
        "synth[part=0]",
        "synth_gather",
        "target",
        "train[method=eagle3]",
        "vocab",
    ]
    for job in default_plan:
        if job.rule != "all":
            assert job.reason.startswith("Missing output files"), (job.rule, job.reason)


def test_default_config_asks_no_gpus(default_plan):
    # The embedded default runs on the CPU: no job may ask Snakemake (or Slurm) for a GPU.
    for job in default_plan:
        assert job.gpus == 0, (job.rule, job.resources)
        assert int(job.resources.get("gpu", 0)) == 0, (job.rule, job.resources)
    gpu_rules = {j.rule for j in default_plan if "gpus" in j.resources}
    assert gpu_rules == {"synth", "extract", "train", "bench"}


def test_lint_is_clean():
    out = snakemake("--lint").output
    assert "Congratulations, your workflow is in a good condition!" in out, out


# ---- reruns after a completed run ------------------------------------------------------------
# A real run takes ~15 minutes. Instead every output is created empty and `--touch --forceall`
# runs every job through Snakemake's touch executor, which records the same metadata a real
# job records (params, input checksums): `snakemake -n` afterwards says "Nothing to be done",
# so the rerun triggers below are evaluated against real metadata. What this does not prove:
# that the stage code itself reruns cheaply (tests/test_rerun_matrix.py does that on a real
# CI-sized run).


# (done_copy, a session fixture in conftest.py: a copy of the workflow with such a run)


def test_nothing_to_do_after_a_complete_run(done_copy):
    out = snakemake("-n", repo=done_copy).output
    assert "Nothing to be done" in out, out
    assert "missing provenance" not in out.lower()


def test_another_number_of_synth_jobs_replans_the_parts_and_their_gather(done_copy):
    """The parts' params carry synth.jobs (which prompts each answers); the merged answers do
    not depend on it, and every answer is found again (tests/test_synth_parts.py), so the
    re-run costs the parts' start-up, not the answers."""
    jobs = rerun_plan(done_copy, "--config", "synth={jobs: 2}")
    assert {"synth", "synth_gather", "prepare"} <= set(jobs)
    assert jobs["synth_gather"].startswith(("Input files updated", "Missing input", "Set of input"))


def test_params_change_replans_that_stage_and_downstream(done_copy):
    jobs = rerun_plan(done_copy, "--config", "train={epochs: 7}")
    assert set(jobs) == {"train", "bench", "report", "all"}
    assert jobs["train"].startswith("Params have changed since last execution")
    assert "'epochs': 7" in jobs["train"]


def test_same_params_given_on_the_command_line_do_not_rerun(done_copy):
    # --config puts the key first in the section, config.yaml has it further down. The workflow
    # sorts config keys, so the section's repr (what Snakemake compares) does not change.

    epochs = yaml.safe_load(Path(DEFAULT_CONFIG).read_text())["train"]["epochs"]
    out = snakemake("-n", "--config", f"train={{epochs: {epochs}}}", repo=done_copy).output
    assert "Nothing to be done" in out, out


# A changed value for every operational key (config.OPERATIONAL_KEYS): none may re-run a job.
# A new operational key needs a value here (test_every_operational_key_is_tried says so).
OPERATIONAL_CHANGES = {
    "vllm": {
        "startup_timeout_s": 1234,
        "shutdown_grace_s": 5,
        "cpu_kvcache_gib": 3,
        "extra_args": ["--max-num-seqs", "16"],
        "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
        "gpu_memory_gib": 80,
    },
    "plan": {"allow": ["disk", "gpu_memory"]},
    "prompts": {"max_bad_fraction": 0.3},
    "synth": {
        "endpoint": "http://127.0.0.1:9/v1",
        "api_key_env": "MY_KEY",
        "model_name": "served-name",
        "concurrency": 3,
        "servers_per_gpu": 2,
        "request_timeout_s": 42,
        "retries": 7,
        "server_args": ["--max-num-batched-tokens", "4096"],
        "max_failed_fraction": 0.2,
        "max_template_mismatch_fraction": 0.1,
    },
    "extract": {
        "concurrency": 3,
        "request_timeout_s": 42,
        "retries": 7,
        "min_next_token_agreement": 0.95,
        "agreement_positions_per_sample": 16,
        "verify_device": "cpu",
        "reference_forward": "never",
        "max_reference_rel_error": 0.1,
        "server_args": ["--max-num-seqs", "4"],
        "hybrid_disk_gib": 1,
        "servers": 2,
        "colocate": True,
        "colocated_gpu_memory": 0.3,
        "endpoints": ["http://127.0.0.1:9/v1"],
        "transport": "mooncake",
        "mooncake": {"master": "127.0.0.1:9", "segment_mib": 256},
    },
    "train": {"num_workers": 3, "log_freq": 5},
    "bench": {"request_timeout_s": 42, "server_args": ["--max-num-seqs", "8"]},
}


def _flat(section_values: dict) -> set[str]:
    return {f"{s}.{k}" for s, values in section_values.items() for k in values}


def test_every_operational_key_is_tried():
    from eagle3_pipeline.config import OPERATIONAL_KEYS

    # results_dir is in every output path: another value is another run, not a re-run.
    assert _flat(OPERATIONAL_CHANGES) == set(OPERATIONAL_KEYS) - {"results_dir"}


def test_operational_keys_rerun_nothing(done_copy, tmp_path):
    # All at once (a re-run is planned for a key alone exactly if it is planned among others:
    # each key reaches the params of the rules that list it, or of none).

    changed = tmp_path / "operational.yaml"
    changed.write_text(yaml.safe_dump(OPERATIONAL_CHANGES))
    out = snakemake("-n", "--configfile", DEFAULT_CONFIG, str(changed), repo=done_copy).output
    assert "Nothing to be done" in out, out


def test_every_config_key_is_classified():
    """Every schema key changes some rule's output (config.RESULT_KEYS) or none
    (config.OPERATIONAL_KEYS), never both: a new key must be classified deliberately."""
    from eagle3_pipeline.config import OPERATIONAL_KEYS, RESULT_KEYS, load_schema

    schema = load_schema()
    keys = set()
    for name, sub in schema["properties"].items():
        if sub.get("type") == "object" and "properties" in sub:
            keys |= {f"{name}.{k}" for k in sub["properties"]}
        else:
            keys.add(name)
    result = {k for ks in RESULT_KEYS.values() for k in ks}
    assert not result & set(OPERATIONAL_KEYS)
    assert result | set(OPERATIONAL_KEYS) == keys


def test_a_modules_role_follows_its_folder():
    """Logic unless in an infrastructure package (staleness.code.INFRASTRUCTURE_PACKAGES): no
    list of modules to keep, and no flat module beside the packages but the shared statistics."""
    from eagle3_pipeline.staleness.code import (
        INFRASTRUCTURE,
        INFRASTRUCTURE_PACKAGES,
        LOGIC,
        library_modules,
        role,
    )

    modules = library_modules()
    assert role("server.guard") == INFRASTRUCTURE and role("config.schema") == INFRASTRUCTURE
    assert role("hidden_states.connector") == LOGIC and role("engine.spec") == LOGIC
    assert {m.split(".")[0] for m in modules} >= set(INFRASTRUCTURE_PACKAGES)
    package = SRC / "eagle3_pipeline"
    flat = {m for m in modules if "." not in m and not (package / m / "__init__.py").is_file()}
    assert flat == {"__init__", "stats"}, flat


def code_closures(repo: Path) -> dict[str, list[str]]:
    """Per workflow script, the logic modules its code hash covers (workflow.logic_modules)."""
    prog = (
        "import json, sys; from pathlib import Path; "
        "from eagle3_pipeline.staleness.code import logic_modules; "
        "print(json.dumps({p.stem: list(logic_modules(p)) for p in "
        "sorted((Path(sys.argv[1]) / 'workflow_scripts').glob('*.py'))}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", prog, str(repo)],
        env=env_for(repo / "src"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


# The workflow scripts each rule runs (prompts.py serves both prompts rules).
SCRIPT_OF = {s: "prompts" if s.startswith("prompts") else s for s in STAGES}


@contextlib.contextmanager
def edited(path: Path, edit):
    """Apply ``edit(text) -> text`` to ``path``; restore content and mtime afterwards."""
    text, st = path.read_text(), path.stat()
    path.write_text(edit(text))
    try:
        yield
    finally:
        path.write_text(text)
        os.utime(path, (st.st_atime, st.st_mtime))


def no_code_change(text: str) -> str:
    """Every docstring reworded, a comment on every def line, blank lines added: the code
    itself is the same."""
    import ast

    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines[node.lineno - 1] += "  # reviewed"
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if (
                isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                line = lines[doc.lineno - 1]
                quote = 3 if line[doc.col_offset :][:3] in ('"""', "'''") else 1
                col = doc.col_offset + quote
                lines[doc.lineno - 1] = line[:col] + "Reworded. " + line[col:]
    return "\n".join(lines) + "\n\n\n# a trailing comment\n"


def real_change(text: str) -> str:
    return text + "\n_EDITED_BY_A_TEST = 1\n"


def test_comment_and_docstring_edits_rerun_nothing(done_copy):
    """A comment, docstring or formatting edit in every library module and every workflow
    script at once: no code changed, so nothing re-runs."""
    files = sorted((done_copy / "src" / "eagle3_pipeline").rglob("*.py"))
    files += sorted((done_copy / "workflow_scripts").glob("*.py"))
    with contextlib.ExitStack() as stack:
        for f in files:
            stack.enter_context(edited(f, no_code_change))
        out = snakemake("-n", repo=done_copy).output
    assert "Nothing to be done" in out, out


def test_logic_edit_replans_importing_stages_and_downstream(done_copy):
    module = done_copy / "src" / "eagle3_pipeline" / "vocab" / "stage.py"
    closures = code_closures(done_copy)
    importers = {s for s in STAGES if "vocab.stage" in closures[SCRIPT_OF[s]]}
    assert "vocab" in importers
    with edited(module, real_change):
        jobs = rerun_plan(done_copy)
    assert set(jobs) == downstream(importers) | {"all"}
    assert {"vocab", "train", "bench", "report", "all"} <= set(jobs)
    assert not {"target", "prompts_train", "synth", "extract"} & set(jobs)  # upstream stays done
    assert jobs["vocab"].startswith("Params have changed since last execution")
    for rule in set(jobs) - importers - {"all"}:
        assert jobs[rule].startswith("Input files updated by another job"), (rule, jobs[rule])
    assert "Nothing to be done" in snakemake("-n", repo=done_copy).output  # restored


def test_infrastructure_edit_reruns_nothing(done_copy):
    """The server package decides how servers run, not what a stage computes: a real code
    change in it re-runs nothing (a forced re-run would cost seconds: the stages reuse their
    work)."""
    from eagle3_pipeline.staleness.code import INFRASTRUCTURE, role

    assert role("server") == INFRASTRUCTURE
    with edited(done_copy / "src" / "eagle3_pipeline" / "server" / "__init__.py", real_change):
        out = snakemake("-n", repo=done_copy).output
    assert "Nothing to be done" in out, out


def test_script_edit_replans_that_stage_and_downstream(done_copy):
    with edited(done_copy / "workflow_scripts" / "vocab.py", real_change):
        jobs = rerun_plan(done_copy)
    assert set(jobs) == {"vocab", "train", "bench", "report", "all"}
    assert jobs["vocab"].startswith("Params have changed since last execution")


def test_code_fingerprint_sees_code_only(tmp_path):
    from eagle3_pipeline.staleness.code import code_fingerprint

    def fp(name: str, text: str) -> str:
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        return code_fingerprint(path)

    base = fp("a", '"""Doc."""\n\n\ndef f(x):\n    """Add one."""\n    return x + 1\n')
    assert base == fp("b", '"""Other doc."""\n# note\ndef f( x ):  # why\n    return (x+1)\n')
    assert base != fp("c", '"""Doc."""\n\n\ndef f(x):\n    """Add one."""\n    return x + 2\n')
    # a string that is not a docstring is code
    assert fp("d", "X = 1\n'note'\n") != fp("e", "X = 1\n'other'\n")


def test_code_parses_are_kept_by_content(tmp_path, monkeypatch):
    """A plan parses a file once per content: the cache's entry is what a later plan reads, an
    edit is parsed anew, and a damaged entry or a cache that cannot be written is passed over."""
    from eagle3_pipeline.staleness import code

    parse = code.parsed.__wrapped__  # past the per-process memo, as a new plan
    monkeypatch.setenv("EAGLE3_CODE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "stage.py"
    source.write_text("from eagle3_pipeline.vocab import build\n\nX = 1\n")
    fresh = parse(source)
    assert fresh["imports"] == [[0, "eagle3_pipeline.vocab", ["build"]]]
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_text(json.dumps({**fresh, "fingerprint": "planted"}))
    assert parse(source)["fingerprint"] == "planted"  # read back, not parsed again
    source.write_text("from eagle3_pipeline.vocab import build\n\nX = 2\n")
    edited = parse(source)
    assert edited["fingerprint"] not in ("planted", fresh["fingerprint"])
    entry.write_text("{")  # torn
    source.write_text("from eagle3_pipeline.vocab import build\n\nX = 1\n")
    assert parse(source) == fresh
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("EAGLE3_CODE_CACHE", str(tmp_path / "a_file" / "cache"))
    assert parse(source) == fresh


def test_infrastructure_is_a_boundary_of_a_stages_code():
    """config imports the train stage's CPU/GPU rule for its checks; that does not make every
    script that reads the config depend on training code."""
    from eagle3_pipeline.staleness.code import logic_modules

    config_imports = (REPO / "src" / "eagle3_pipeline" / "config" / "checks.py").read_text()
    assert "from ..train" in config_imports
    assert logic_modules(REPO / "workflow_scripts" / "target.py") == ("target", "target.stage")
    assert logic_modules(REPO / "workflow_scripts" / "prompts.py") == (
        "prompts",
        "prompts.decontam",
        "prompts.dedup",
        "prompts.pool",
        "prompts.rows",
        "prompts.selection",
        "prompts.sources",
        "prompts.stage",
        "prompts.suites",
        "target",  # its tokenizer and chat template count a prompt's tokens
        "target.chat",
        "target.stage",
    )
    assert "train.entry" in logic_modules(REPO / "workflow_scripts" / "train.py")
    assert "hidden_states.connector" in logic_modules(REPO / "workflow_scripts" / "extract.py")


def test_the_lab_package_stays_out_of_every_stage(tmp_path):
    """eagle3_lab (the instruments of benchmarks/ and lab/: rounds, step costs, the drafter
    replay) is used by no rule: no library module imports it, and a stage script importing it
    fails its plan."""
    from eagle3_pipeline.staleness.code import LabImportError, _imported_modules, logic_modules

    for path in (SRC / "eagle3_pipeline").rglob("*.py"):
        _imported_modules(path)  # raises LabImportError for a module importing eagle3_lab
    for script in sorted((REPO / "workflow_scripts").glob("*.py")):
        logic_modules(script, None)  # raises if a stage reached the lab package
    bad = tmp_path / "bad_stage.py"
    bad.write_text("from eagle3_lab.diagnostics import walk\n")
    with pytest.raises(LabImportError, match=r"imports eagle3_lab\.diagnostics"):
        logic_modules(bad)
