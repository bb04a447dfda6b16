"""The lab's scripts (lab/, lab/gpu/) still load against the package: they import what they
use from it by name, so a restructuring that moves or renames a function fails here instead of
on a GPU host (lab/tests dry-runs the host's steps; it is not part of the default run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "lab").glob("*.py")) + sorted((REPO / "lab" / "gpu").glob("*.py"))


def test_there_are_lab_scripts():
    assert {"drafter_speed.py", "drafter_tau.py", "adopt_synth_journal.py"} <= {
        p.name for p in SCRIPTS
    }


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_a_lab_script_loads(path, monkeypatch):
    name = f"lab_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
    monkeypatch.syspath_prepend(str(path.parent))  # as for a script: its neighbours import
    spec.loader.exec_module(module)  # definitions only: each runs main() under __main__
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


def pipeline_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from eagle3_pipeline... import name`` in ``path``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eagle3_pipeline"):
            found += [(node.module, a.name) for a in node.names]
    return found


def internal_imports(path: Path) -> list[str]:
    """What ``path`` takes from the pipeline beyond its public API: a stage's job module
    (``<stage>.stage``, which its package's ``__init__`` exports what others may use of) or a
    private name."""
    return [
        f"{module}: {name}"
        for module, name in pipeline_imports(path)
        if module.endswith(".stage") or name == "stage" or name.startswith("_")
    ]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_a_lab_script_uses_the_public_api(path):
    assert internal_imports(path) == []


def test_an_internal_import_is_found(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "from eagle3_pipeline.bench.stage import start_server\n"
        "from eagle3_pipeline.target import stage as target\n"
        "from eagle3_pipeline.bench import _private, start_server\n"
    )
    assert internal_imports(script) == [
        "eagle3_pipeline.bench.stage: start_server",
        "eagle3_pipeline.target: stage",
        "eagle3_pipeline.bench: _private",
    ]
