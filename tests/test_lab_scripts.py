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


# A lab script that writes a result file (it takes --out or --json) records the revision of the
# checkout that made it, as the benchmarks do (eagle3_lab.results.write_result; drafter_tau's
# write_result and its neighbours' use of it go through it too).
RESULT_WRITERS = SCRIPTS + sorted((REPO / "lab" / "tp_cpu").glob("*.py"))


def writes_a_result(path: Path) -> tuple[bool, bool]:
    """(takes --out or --json, calls write_result or the alias drafter_tau gives it)."""
    import ast

    tree = ast.parse(path.read_text())
    options = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in ("--out", "--json")
    }
    calls = {
        (n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", ""))
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
    }
    return bool(options), bool(calls & {"write_result", "write_with_revision"})


@pytest.mark.parametrize("path", RESULT_WRITERS, ids=lambda p: str(p.relative_to(REPO)))
def test_a_lab_script_records_its_revision_in_what_it_writes(path):
    takes_out, records = writes_a_result(path)
    assert records or not takes_out, f"{path.name} writes a result without its revision"


def test_a_result_writer_without_the_revision_is_found(tmp_path):
    script = tmp_path / "s.py"
    script.write_text('ap.add_argument("--out")\nPath(args.out).write_text(json.dumps(r))\n')
    assert writes_a_result(script) == (True, False)
    script.write_text('ap.add_argument("--out")\nwrite_result(args.out, r)\n')
    assert writes_a_result(script) == (True, True)


def test_the_gpu_miniature_check_refuses_a_bf16_export(tmp_path):
    """The GPU run of the Kimi miniature is meant for vLLM's Marlin WNA16 MoE: a bf16 export of
    the same weights (no quantization_config, as in text_config of the W4A16 build) is refused
    before the host spends its minutes on the unquantized kernel."""
    import json
    import subprocess

    script = REPO / "lab" / "gpu" / "miniature_quantized.py"
    w4a16 = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32}}},
    }
    for name, quant in [("bf16", {}), ("w4a16", {"quantization_config": w4a16})]:
        (tmp_path / name).mkdir()
        text_config = {"n_routed_experts": 8, **quant}
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": text_config}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    run = lambda d: subprocess.run(  # noqa: E731
        [sys.executable, str(script), str(tmp_path / d)], capture_output=True, text=True
    )
    refused, accepted = run("bf16"), run("w4a16")
    assert refused.returncode != 0 and "a bf16 export" in refused.stderr, refused
    assert "pack_miniature.sh" in refused.stderr
    assert accepted.returncode == 0 and "W4A16 group 32" in accepted.stdout, accepted
