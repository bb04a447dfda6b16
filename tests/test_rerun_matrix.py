"""What a change to a finished run re-runs, on a real CI-sized run (tests/configs/ci.yaml).

Each row applies one change to a copy of the finished run and asserts the exact jobs
`snakemake -n` plans. Two of them (below "re-run for real") then run for real and assert, from
the stages' own records, that no vLLM server started and no training step ran: a needless
re-run costs seconds (benchmarks/rerun_costs.py measures what each row costs on the default
config).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from smkcli import REPO, copy_repo, job_names, parse_jobs, snakemake

# The session's CI-sized run is made in the background (tests/dag_runs.py); the first test here
# may wait for it.
pytestmark = pytest.mark.timeout(3600)

CI_CONFIG = REPO / "tests" / "configs" / "ci.yaml"
CI = yaml.safe_load(CI_CONFIG.read_text())
SERVER_STARTS = "starting vLLM server"  # what eagle3_pipeline.server logs as a server starts
# The CI config trains one method (eagle3): one train and one bench job; that job measures the
# baseline beside its drafter (bench.pairing: alternate), without it a bench_baseline job does.
TRAIN, BENCH = "train[method=eagle3]", "bench[method=eagle3]"
BASELINE = [] if CI["bench"].get("pairing", "alternate") == "alternate" else ["bench_baseline"]
# What depends on extraction, and on prepare's data set (which vocab reads too).
AFTER_EXTRACT = ["extract[part=0]", "extract[part=1]", "extract_gather", TRAIN, BENCH, "report"]
AFTER_PREPARE = sorted(["vocab", *AFTER_EXTRACT])
# (the training pool job also writes the held-out benchmark set: the baseline measures it)
SYNTH = [f"synth[part={k}]" for k in range(CI["synth"].get("jobs", 1))]
EVERYTHING_AFTER_PROMPTS = sorted([*SYNTH, "synth_gather", "prepare", *BASELINE, *AFTER_PREPARE])


@pytest.fixture(scope="module")
def copy(ci_run, tmp_path_factory):
    """(repo, work): a copy of the workflow (for code edits) and of the finished run."""
    base = tmp_path_factory.mktemp("matrix")
    repo = base / "repo"
    repo.mkdir()
    copy_repo(repo)
    work = base / "work"
    # The materialized target model is only read (target.json names it where it is).
    shutil.copytree(ci_run, work, symlinks=True, ignore=shutil.ignore_patterns("model"))
    assert planned(repo, work) == [], "the copy of a finished run must have nothing to do"
    # what the no-server checks below look for is what a starting server logs
    server_py = REPO / "src" / "eagle3_pipeline" / "server" / "__init__.py"
    assert f'log.info("{SERVER_STARTS}' in server_py.read_text()
    return repo, work


def config_args(*extra_configs: Path) -> list[str]:
    """The CI config, then changes on top of it (later config files win)."""
    return ["--configfile", str(CI_CONFIG), *map(str, extra_configs)]


def planned(repo: Path, work: Path, *args: str, configs: tuple = ()) -> list[str]:
    out = snakemake("-n", *config_args(*configs), *args, repo=repo, workdir=work).output
    return job_names(parse_jobs(out))


def with_config(tmp_path: Path, repo: Path, work: Path, change: dict) -> list[str]:
    extra = tmp_path / "change.yaml"
    extra.write_text(yaml.safe_dump(change))
    return planned(repo, work, configs=(extra,))


@contextlib.contextmanager
def edited(path: Path, text: str):
    """``path`` holds ``text`` inside the block; content and mtime are restored afterwards."""
    old, st = path.read_text(), path.stat()
    path.write_text(text)
    try:
        yield
    finally:
        path.write_text(old)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


# ---- dry-run rows --------------------------------------------------------------------------


def test_add_a_benchmark_set(copy, tmp_path):
    repo, work = copy
    (work / "data" / "extra.jsonl").write_text('{"prompt": "Name a color."}\n')
    change = {
        "prompts": {
            "bench": CI["prompts"]["bench"]
            + [{"name": "extra", "source": "file", "path": "data/extra.jsonl"}]
        },
        "bench": {"prompt_sets": CI["bench"]["prompt_sets"] + ["extra"]},
    }
    # the training pool is decontaminated against every benchmark source (prompts.pool): a new
    # source is checked against it, and what follows the pool plans again
    assert with_config(tmp_path, repo, work, change) == sorted(
        ["prompts_bench[name=extra]", "prompts_train", *EVERYTHING_AFTER_PROMPTS]
    )


def test_remove_a_benchmark_set(copy, tmp_path):
    repo, work = copy
    # humaneval removed (memorized stays: the CI config's gate judges it)
    change = {"bench": {"prompt_sets": ["mtbench", "mybench", "memorized"]}}
    assert with_config(tmp_path, repo, work, change) == sorted([*BASELINE, BENCH, "report"])


def test_edit_a_benchmark_set_definition(copy, tmp_path):
    repo, work = copy
    sets = [dict(s) for s in CI["prompts"]["bench"]]
    sets[0]["n"] = 2  # mtbench: 3 -> 2 questions
    assert with_config(tmp_path, repo, work, {"prompts": {"bench": sets}}) == sorted(
        ["prompts_bench[name=mtbench]", *BASELINE, BENCH, "report"]
    )


# the benchmark sets' jobs: a set's prompts must leave room for bench.max_tokens
PROMPTS_BENCH = [f"prompts_bench[name={s['name']}]" for s in CI["prompts"]["bench"]]


@pytest.mark.parametrize(
    "key, value, baseline, sets",
    [
        ("num_speculative_tokens", [1, 2], False, []),  # the drafter's k only
        ("temperatures", [0.0, 0.5], True, []),
        ("concurrency", [2], True, []),
        ("max_tokens", 16, True, PROMPTS_BENCH),
        # the gate's floors re-judge (its measurements are cached: benchmarks/ and test_gate)
        ("gate", {"floors": [{"prompt_set": "mybench", "acceptance_length": 1.0}]}, False, []),
    ],
)
def test_bench_keys(copy, tmp_path, key, value, baseline, sets):
    repo, work = copy
    expected = sorted([BENCH, "report", *(BASELINE if baseline else []), *sets])
    assert with_config(tmp_path, repo, work, {"bench": {key: value}}) == expected


def test_edit_a_training_prompt_file(copy):
    repo, work = copy
    path = work / "data" / "ci_train.jsonl"
    text = path.read_text().replace("three tips", "four tips")
    with edited(path, text):
        jobs = planned(repo, work)
    assert jobs == sorted(["prompts_train", *EVERYTHING_AFTER_PROMPTS])


def test_edit_a_benchmark_prompt_file(copy):
    repo, work = copy
    path = work / "data" / "ci_bench.jsonl"
    with edited(path, path.read_text().replace("five prime", "six prime")):
        jobs = planned(repo, work)
    # an edited benchmark file may now overlap the training pool, which is decontaminated
    # against it (as a new set is, above)
    assert jobs == sorted(
        ["prompts_bench[name=mybench]", "prompts_train", *EVERYTHING_AFTER_PROMPTS]
    )


def test_operational_keys(copy, tmp_path):
    from test_workflow import OPERATIONAL_CHANGES

    repo, work = copy
    assert with_config(tmp_path, repo, work, OPERATIONAL_CHANGES) == []


def test_draft_vocab_size(copy, tmp_path):
    repo, work = copy
    jobs = with_config(tmp_path, repo, work, {"vocab": {"draft_vocab_size": 512}})
    assert jobs == sorted(["vocab", TRAIN, BENCH, "report"])


@pytest.mark.parametrize("change", [{"lr": 0.001}, {"epochs": 3}])
def test_train_keys(copy, tmp_path, change):
    repo, work = copy
    assert with_config(tmp_path, repo, work, {"train": change}) == sorted([BENCH, "report", TRAIN])


def test_comment_only_edit_in_every_library_module(copy):
    from test_workflow import no_code_change

    repo, work = copy
    files = sorted((repo / "src" / "eagle3_pipeline").rglob("*.py"))
    with contextlib.ExitStack() as stack:
        for f in files:
            stack.enter_context(edited(f, no_code_change(f.read_text())))
        assert planned(repo, work) == []
    assert len(files) > 20


# ---- re-run for real, nothing recomputed -------------------------------------------------------


def records(work: Path) -> dict:
    run = work / "results" / "ci"
    read = lambda p: json.loads((run / p).read_text())  # noqa: E731
    return {
        "parts": [read(f"hidden_states/parts/part_{k}.json")["this_run"] for k in (0, 1)],
        "train": read("drafter/eagle3/metrics.json")["this_run"],
        "bench": read("bench/eagle3/metrics.json")["this_run"],
        "baseline": read("bench/baseline.json")["this_run"] if BASELINE else None,
    }


def log_states(work: Path) -> dict[Path, tuple[int, int]]:
    logs = (work / "results" / "ci" / "logs").glob("*.log")
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in logs}


def real_rerun(repo: Path, work: Path, *args: str) -> list[str]:
    """Run for real, as the run was made (the local executor); return the jobs that ran.
    Asserts that no server started (in the logs of the jobs that ran: Snakemake starts a job's
    log afresh) and that afterwards there is nothing left to do."""
    before = log_states(work)
    out = snakemake(
        *config_args(), "--cores", "2", *args, repo=repo, workdir=work, timeout=1800
    ).output
    ran = job_names(parse_jobs(out))
    changed = [p for p, state in log_states(work).items() if before.get(p) != state]
    assert len(changed) >= len(ran), (changed, ran)  # every job that ran wrote its log
    for path in changed:
        assert SERVER_STARTS not in path.read_text(errors="replace"), path
    assert planned(repo, work) == []
    return ran


def assert_nothing_recomputed(work: Path, ran: list[str]) -> None:
    """Every job that ran took its results from what was stored (the baseline's record is
    looked at only when it ran: it reads neither prepare's data nor the hidden states)."""
    r = records(work)
    for part in r["parts"]:
        assert part["server_started"] is False and part["samples"] == 0, part
    assert r["train"]["trained_steps"] == 0 and r["train"]["reused"], r["train"]
    for bench in (r["bench"], *([r["baseline"]] if "bench_baseline" in ran else [])):
        assert bench["servers_started"] == 0 and bench["measured_sets"] == [], bench


def test_touch_of_an_upstream_output_recomputes_nothing(copy):
    """(*) `touch` gives the data set a new mtime but the same content."""
    repo, work = copy
    dataset = work / "results" / "ci" / "prepare" / "dataset"
    for p in (dataset, dataset / ".snakemake_timestamp"):
        p.touch()
    assert planned(repo, work) == AFTER_PREPARE
    ran = real_rerun(repo, work)
    assert ran == AFTER_PREPARE
    assert_nothing_recomputed(work, ran)


def test_forced_extract_reuses_every_row(copy):
    """(*) `-R extract` with nothing changed: every row is reused, nothing downstream trains."""
    repo, work = copy
    ran = real_rerun(repo, work, "-R", "extract")
    assert ran == sorted(AFTER_EXTRACT)
    assert_nothing_recomputed(work, ran)
    r = records(work)
    assert sum(p["reused"] for p in r["parts"]) == 32
    assert collections.Counter(r["bench"]["cached_sets"]) == collections.Counter(
        [*CI["bench"]["prompt_sets"], "heldout"]
    )
