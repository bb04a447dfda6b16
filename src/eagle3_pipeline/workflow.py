"""Helpers the Snakefile uses at parse time (kept free of heavy imports: planning stays fast).

A stage's code is tracked by a *param*, :func:`code_hash`: a hash of the syntax tree of its
workflow script and of the library modules that decide what it computes. Comments,
docstrings and formatting are not in that tree, so editing them re-runs nothing; a real edit
changes the param and Snakemake re-runs the stage (reason "Params have changed").
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = "eagle3_pipeline"
PACKAGE_DIR = Path(__file__).resolve().parent

LOGIC = "logic"
INFRASTRUCTURE = "infrastructure"
DIAGNOSTIC = "diagnostic"

# Every module of the library, by what an edit to it means for the stages that import it.
# - logic: it decides what a stage computes; an edit re-runs the importing stages.
# - infrastructure: it decides *how* a stage runs (server lifecycle, GPU locks, progress, file
#   helpers, provenance records, config validation, these planning helpers); an edit re-runs
#   nothing. A needed re-run after such an edit is forced with `-R <rule>`, and costs seconds
#   where nothing is left to compute: every expensive stage reuses its finished work by content.
# - diagnostic: used by no rule (lab/ runs it); no stage may import it, so an edit to it re-runs
#   nothing, and a stage that did import one fails its plan (logic_modules).
# A new module must be added here (tests/test_workflow.py fails until it is).
MODULE_ROLES = {
    "__init__": INFRASTRUCTURE,
    "bench": LOGIC,
    "bench.cache": LOGIC,
    "bench.measure": LOGIC,
    "bench.rounds": INFRASTRUCTURE,
    "bench.stage": LOGIC,
    "bench.verdict": LOGIC,
    "client": INFRASTRUCTURE,
    "config": INFRASTRUCTURE,
    "config_checks": INFRASTRUCTURE,
    "config_schema": INFRASTRUCTURE,
    "config_values": INFRASTRUCTURE,
    "consistency": LOGIC,
    "dummy_models": INFRASTRUCTURE,
    "extract": LOGIC,
    "extract.book": LOGIC,
    "extract.client": LOGIC,
    "extract.plan": LOGIC,
    "extract.stage": LOGIC,
    "extract.validator": LOGIC,
    "fileio": INFRASTRUCTURE,
    "gpus": INFRASTRUCTURE,
    "hs_backend": LOGIC,
    "layers": LOGIC,  # which layers extraction captures: decides what extract computes
    "methods": LOGIC,
    "model_shape": INFRASTRUCTURE,  # the plan's reading of config.json (no stage result)
    # The plan printed and checked before any job, and the extract job's disk check: they
    # decide whether a run starts, never what a stage computes.
    "plan": INFRASTRUCTURE,
    "prepare": LOGIC,
    "prompts": LOGIC,
    "prompts.rows": LOGIC,
    "prompts.selection": LOGIC,
    "prompts.sources": LOGIC,
    "prompts.stage": LOGIC,
    "reasoning": LOGIC,
    "provenance": INFRASTRUCTURE,
    "rates": INFRASTRUCTURE,  # the plan's stage time estimates
    "report": LOGIC,
    "report.plots": LOGIC,
    "report.render": LOGIC,
    "report.sections": LOGIC,
    "runtime": INFRASTRUCTURE,
    "server": INFRASTRUCTURE,
    "server_guard": INFRASTRUCTURE,
    "serving": LOGIC,
    "shards": LOGIC,
    "stage_keys": INFRASTRUCTURE,
    "stats": LOGIC,
    "step_costs": LOGIC,
    "synth": LOGIC,
    "target": LOGIC,
    "train": LOGIC,
    "train.checkpoints": LOGIC,
    "train.entry": LOGIC,
    "train.errors": INFRASTRUCTURE,
    "train.export": LOGIC,
    "train.fingerprint": LOGIC,
    "train.launcher": LOGIC,
    "train.metrics": LOGIC,
    "train.plot": LOGIC,
    "train.stage": LOGIC,
    "train.trainer_config": LOGIC,
    "verify": LOGIC,
    "vllm_connector": LOGIC,
    "vllm_cpu_fixes": LOGIC,  # loaded by vLLM's CPU servers: acceptance at T > 0
    "vocab": LOGIC,
    "workflow": INFRASTRUCTURE,
}


def library_modules() -> list[str]:
    """Dotted names (relative to the package) of every module file of the library."""
    names = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        names.append(".".join(parts))
    return names


# Every module of these packages has the package's role: a new drafter method is one module of
# methods/, with no entry here.
PACKAGE_ROLES = {"methods": LOGIC, "diagnostics": DIAGNOSTIC}
MODULE_ROLES.update(
    {
        m: PACKAGE_ROLES[m.split(".")[0]]
        for m in library_modules()
        if m.split(".")[0] in PACKAGE_ROLES
    }
)


def module_file(name: str) -> Path | None:
    """The source file of library module ``name`` (a module or a package), or None."""
    base = PACKAGE_DIR.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str | None:
    """Dotted name of a library file, None for a file outside the library (a script)."""
    path = path.resolve()
    if PACKAGE_DIR not in path.parents:
        return None
    parts = list(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _with_parents(name: str) -> set[str]:
    """A module and the packages above it (importing a.b runs a/__init__.py first)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _resolve(base: str, names: list[str]) -> set[str]:
    """Modules named by ``from <base> import names``: submodules where they exist, else base."""
    found = set()
    for n in names:
        sub = f"{base}.{n}" if base else n
        if module_file(sub):
            found.add(sub)
        elif base:
            found.add(base)
    return found


@functools.cache  # each module is parsed once per plan, however many rules import it
def _imported_modules(path: Path) -> frozenset[str]:
    """Library modules that the file ``path`` imports (absolute or relative imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    if me is None:
        package = None  # a workflow script: only absolute imports reach the library
    elif me == "__init__":
        package = ""
    else:
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                first, _, rest = alias.name.partition(".")
                if first == PACKAGE and rest:
                    found.add(rest)
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level == 0 and node.module and node.module.split(".")[0] == PACKAGE:
                base = node.module.partition(".")[2]
                found |= _resolve(base, names)
            elif node.level and package is not None:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(parts + ([node.module] if node.module else []))
                found |= _resolve(base, names)
    return frozenset(m for name in found for m in _with_parents(name) if module_file(m))


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


@functools.cache
def code_fingerprint(path: Path) -> str:
    """Hash of a Python file's syntax tree without docstrings: comments, docstrings and
    formatting do not change it (``ast.dump`` leaves out line and column numbers)."""
    tree = _strip_docstrings(ast.parse(path.read_text(), filename=str(path)))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


@functools.cache
def logic_modules(script: str | Path) -> tuple[str, ...]:
    """The logic modules (``MODULE_ROLES``) a script depends on: those it imports, and those
    they import, transitively (a diagnostic module among them is an error). An infrastructure
    module is a boundary: what it imports serves
    how a stage runs (config validation importing the train stage's CPU/GPU rule does not make
    every stage depend on training code)."""
    todo = list(_imported_modules(Path(script)))
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        if mod not in MODULE_ROLES:
            raise KeyError(
                f"library module {mod!r} is not classified in eagle3_pipeline.workflow."
                "MODULE_ROLES (logic or infrastructure)"
            )
        if MODULE_ROLES[mod] == DIAGNOSTIC:
            raise ValueError(
                f"{script} imports the diagnostic module {mod!r}: diagnostics are used by no "
                "stage (a stage's code moves out of eagle3_pipeline.diagnostics first)"
            )
        seen.add(mod)
        if MODULE_ROLES[mod] == LOGIC:
            todo.extend(_imported_modules(module_file(mod)) - seen)
    return tuple(sorted(m for m in seen if MODULE_ROLES[m] == LOGIC))


@functools.cache
def code_hash(script: str | Path) -> str:
    """What a stage's result depends on in code: its script and its logic modules.

    Given to the rule as a param, so a change of either re-runs the stage (and what depends
    on it), while an edit to an infrastructure module or to comments re-runs nothing.
    """
    script = Path(script)
    parts = {script.name: code_fingerprint(script.resolve())}
    for mod in logic_modules(script):
        parts[mod] = code_fingerprint(module_file(mod))
    blob = "\n".join(f"{k} {v}" for k, v in sorted(parts.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def modules_hash(modules: list[str]) -> str:
    """:func:`code_hash` of a list of library modules (a stage's own reuse fingerprints)."""
    blob = "\n".join(f"{m} {code_fingerprint(module_file(m))}" for m in sorted(modules))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
