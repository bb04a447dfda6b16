"""The maintained benchmarks (benchmarks/*.py) still load against the package, and every
result file they write records the revision of the checkout that made it."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from eagle3_lab.results import write_result
from eagle3_pipeline.runtime.files import read_json
from eagle3_pipeline.runtime.provenance import code_version

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))


def writes(path: Path) -> list[str]:
    """The calls in ``path`` that write a file: ``write_result``, and what writes JSON or text
    otherwise (``write_json``, ``.write_text``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("write_result", "write_json", "write_text"):
                found.append(name)
    return found


def load_benchmark(path: Path, monkeypatch):
    """The benchmark script at ``path`` as a module: its definitions only (each runs main()
    under __main__)."""
    name = f"benchmark_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.syspath_prepend(str(path.parent))  # as for a script: its neighbours import
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_loads_and_records_its_revision(path, monkeypatch):
    module = load_benchmark(path, monkeypatch)
    assert callable(getattr(module, "main", None))
    # every benchmark writes its result through write_result (other files it writes are
    # inputs it makes: configs, prompt files, model folders)
    assert "write_result" in writes(path), f"{path.name} writes no result with its revision"


def test_a_result_records_the_revision_and_whether_the_tree_was_dirty(tmp_path):
    recorded = write_result(tmp_path / "r.json", {"figure": 1.5})
    assert read_json(tmp_path / "r.json") == recorded
    assert recorded["figure"] == 1.5 and recorded["code"] == code_version()
    assert recorded["code"]["git"] and isinstance(recorded["code"]["dirty"], bool)


def test_the_cpu_census_counts_what_each_kind_spent_while_it_ran(monkeypatch):
    """benchmarks/cpu_by_process.py: a process older than the command counts only what it spent
    meanwhile, each by the kind its command line names; the idle share is per minute."""
    census = load_benchmark(REPO / "benchmarks/cpu_by_process.py", monkeypatch)
    assert census.kind_of("python -m vllm.entrypoints.openai.api_server --model m", "python") == (
        "vLLM API server"
    )
    assert census.kind_of("python -B -c from multiprocessing.spawn", "VLLM::EngineCor") == (
        "vLLM engine core"
    )
    assert census.kind_of("python snakemake --snakefile S -n --forceall", "python") == (
        "Snakemake dry run"
    )
    assert census.kind_of("python snakemake --snakefile S --cores 2", "python") == "Snakemake"
    assert census.kind_of("", "kworker/0:1") == "kernel threads"
    seen = {"first_s": 0.0, "last_s": 120.0, "name": "python"}
    processes = {
        (1, 5): {**seen, "cpu_at_first": 100.0, "cpu": 130.0, "cmdline": "python -m pytest"},
        (2, 9): {**seen, "cpu_at_first": 0.0, "cpu": 10.0, "cmdline": "bash run.sh"},
    }
    tick = census.TICK
    # (time, busy ticks, idle ticks): 2 cores, minute 1 all busy, minute 2 half idle
    ticks = [(0.0, 0, 0), (60.0, 120 * tick, 0), (120.0, 180 * tick, 60 * tick)]
    summary = census.summarize(processes, ticks, 0.0, 2)
    assert summary["by_kind"]["pytest"] == {"cpu_s": 30.0, "processes": 1, "share": 0.75}
    assert summary["by_kind"]["other"]["cpu_s"] == 10.0
    assert summary["accounted_cpu_s"] == 40.0
    assert summary["idle_share_by_minute"] == [0.0, 0.5]
    assert summary["machine"] == {
        "cores": 2,
        "seconds": 120.0,
        "busy_core_s": 180.0,
        "idle_core_s": 60.0,
    }
