"""The figures the documentation quotes are those of the files it cites, and the result files
kept in the repository are those it cites.

Each claim (tests/figures_*.py, one module a page or part of one) is a passage of a page with its
figures read again from their files (tests/figures.py); a figure that differs from its file, or a
passage reworded without its claim, fails. The results pages name a file for every figure; a
result file no page cites (nor a cited JSON file's ``files``) is not kept, and one that records no
revision is among those results_history.md lists as written before the benchmarks recorded it."""

from __future__ import annotations

import fnmatch
import json

import figures_data
import pytest

import figures
import figures_history
import figures_history_more
import figures_readme
import figures_results_data
import figures_results_gpu
import figures_results_more
from figures import REPO, RESULTS, Claim, cited_files, missing, tracked_results

MODULES = [
    figures_data,
    figures_results_data,
    figures_results_gpu,
    figures_results_more,
    figures_history,
    figures_history_more,
    figures_readme,
]
# The pages whose citations keep a result file in the repository.
CITING = [
    REPO / "README.md",
    REPO / "benchmarks" / "README.md",
    *sorted(REPO.glob("docs/*.md")),
    REPO / "lab" / "README.md",
]
# The JSON files written before the benchmarks recorded the revision: results_history.md, "Result
# files without a revision", lists them in these words.
WITHOUT_REVISION = [
    "efficiency/*.json",
    "tensor_parallel/*.json",
    "checks/*.json",
    "thinking_cpu/*.json",
    "quality_vs_data/*.json",
    "methods/*.json",
    "default_run/bench_eagle3_46463ef.json",
    "gpu_runs/quality-speed/*.json",
    "gpu_runs/gpu-methods-2500/h200_drafter_speed.json",
    "gpu_runs/gpu-methods-blocks/h200_drafter_speed.json",
]
WITH_REVISION_THERE = [
    "efficiency/h200_step_costs_quality_drafter_*.json",
    "quality_vs_data/quality_levers.json",
    "quality_vs_data/tau_vs_data_all.json",
    "quality_vs_data/h200_quality_on_policy_*",
    "methods/gpu-methods-rounds_cpu_tau.json",
    "checks/bad_input.json",
    "checks/mla_extraction_miniature*.json",
]


def test_there_are_claims_on_every_results_page():
    pages = {claim.page for claim in CLAIMS}
    assert pages == {
        "docs/results.md",
        "docs/results_history.md",
        "README.md",
        "docs/data.md",
        "docs/miniature.md",
    }
    assert sum(claim.figures for claim in CLAIMS) > 1000


def claims_of(module) -> list[Claim]:
    return [
        claim
        for name in dir(module)
        if name.isupper() and isinstance(getattr(module, name), list)
        for claim in getattr(module, name)
        if isinstance(claim, Claim)
    ]


CLAIMS = [claim for module in MODULES for claim in claims_of(module)]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.removeprefix("figures_"))
def test_every_figure_is_the_one_in_its_file(module):
    claims = claims_of(module)
    assert claims
    assert missing(claims) == []


def test_a_figure_that_differs_from_its_file_fails(tmp_path, monkeypatch):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "r.json").write_text(
        json.dumps({"runs": [{"set": "a", "tau": 1.2345}, {"set": "b", "tau": 2.5}], "x": -0.031})
    )
    (tmp_path / "page.md").write_text("τ 1.23 on a,\nb 2.50; x −0.03.\n")
    monkeypatch.setattr(figures, "REPO", tmp_path)
    monkeypatch.setattr(figures, "RESULTS", tmp_path / "benchmarks" / "results")
    good = Claim(
        "page.md",
        "r.json",
        "τ {f.runs.where(set='a').tau|.2f} on a, b {f.runs[1].tau|.2f}; x {f.x|.2f}",
    )
    assert missing([good]) == []
    wrong = Claim("page.md", "r.json", "τ {f.runs.where(set='a').tau|.3f} on a")
    assert missing([wrong]) == ["page.md: not found: 'τ 1.234 on a'"]
    absent = Claim("page.md", "r.json", "τ {f.runs.where(set='c').tau|.2f}")
    assert "no item with {'set': 'c'}" in missing([absent])[0]


def test_a_spread_renders_as_the_pages_write_it():
    assert figures.fmt(figures.spread([1.02, 1.0409, 1.063]), ".2f×") == "1.04× (1.02–1.06)"
    assert figures.fmt(figures.spread([38.5, 38.64, 39.49]), ".1f s") == "38.6 s (38.5–39.5)"
    assert figures.fmt(4.805e-05, ".1e") == "4.8e-5"
    assert figures.fmt(-0.1535, "+.2f") == "−0.15"
    assert figures.fmt(19131, "") == "19,131"


def result_citations() -> tuple[set[str], list[str]]:
    return cited_files(CITING, tracked_results())


def test_every_cited_result_file_is_there():
    _, unresolved = result_citations()
    assert unresolved == []


def test_every_file_a_claim_reads_is_cited():
    cited, _ = result_citations()
    read = {
        path.relative_to(RESULTS).as_posix()
        for claim in CLAIMS
        for path in claim.paths().values()
        if RESULTS in path.parents
    }
    assert read - cited == set()


def test_only_cited_result_files_are_kept():
    cited, _ = result_citations()
    assert sorted(tracked_results() - cited) == []


def named(name: str, pattern: str) -> bool:
    """``pattern`` names ``name``: as many folders, each part matched (``*`` within a part)."""
    parts, wanted = name.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatch, parts, wanted))


def records_a_revision(data) -> bool:
    return isinstance(data, dict) and any(
        isinstance(where, dict) and isinstance(where.get("code"), dict)
        for where in (data, data.get("provenance"))
    )


def test_the_cited_results_without_a_revision_are_those_the_history_lists():
    cited, _ = result_citations()
    jsons = {name for name in cited if name.endswith(".json")}
    without = {n for n in jsons if not records_a_revision(json.loads((RESULTS / n).read_text()))}
    listed = {
        name
        for name in jsons
        if any(named(name, p) for p in WITHOUT_REVISION)
        and not any(named(name, p) for p in WITH_REVISION_THERE)
    }
    # full_run_e8cdefe.json names its revision as a string, without the dirty flag
    assert without == listed | {"default_run/full_run_e8cdefe.json"}
    text = " ".join((REPO / "docs" / "results_history.md").read_text().split())
    assert "## Result files without a revision" in (REPO / "docs/results_history.md").read_text()
    for pattern in WITHOUT_REVISION + WITH_REVISION_THERE:
        words = (
            pattern.removesuffix("*.json")
            if pattern.endswith("/*.json")
            else pattern.split("/")[-1]
        )
        assert f"`{words}`" in text or f"`{pattern}`" in text, pattern
