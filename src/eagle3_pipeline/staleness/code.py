"""What a stage's result depends on in code (used by the Snakefile at parse time; kept free of
heavy imports, so planning stays fast).

A stage's code is tracked by a *param*, :func:`code_hash`: a hash of the syntax tree of its
workflow script and of the library modules that decide what it computes. Comments,
docstrings and formatting are not in that tree, so editing them re-runs nothing; a real edit
changes the param and Snakemake re-runs the stage (reason "Params have changed").

Which modules decide what a stage computes follows from the folders, not from a list of
modules:

- every module of the library is **logic** (an edit re-runs the stages that import it),
  except those of the **infrastructure** packages :data:`INFRASTRUCTURE_PACKAGES`, which
  decide how a stage runs (config validation, the plan, job runtime and files, vLLM server
  processes, these hashes) and never what it computes: an edit there re-runs nothing. A
  needed re-run after such an edit is forced with ``-R <rule>`` and costs seconds where
  nothing is left to compute: every expensive stage reuses its finished work by content.
- a module of ``methods/`` named after a drafter method is that method's: only the jobs that
  train or serve a drafter of that method (and the report that shows it) depend on it, so an
  edit to one method re-runs no other method's jobs (:func:`logic_modules`).
- the measuring instruments of benchmarks/ and lab/ live in another package, ``eagle3_lab``:
  no stage may import it (:func:`logic_modules` refuses), so they re-run nothing.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from ..methods import METHODS

PACKAGE = "eagle3_pipeline"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
LAB_PACKAGE = "eagle3_lab"

LOGIC = "logic"
INFRASTRUCTURE = "infrastructure"
# Packages (top folders of the library) whose modules decide how a stage runs, not what it
# computes.
INFRASTRUCTURE_PACKAGES = ("config", "plan", "runtime", "server", "staleness")
METHODS_PACKAGE = "methods"
# What a file's parse gives (its imports, its fingerprint) is kept by the file's content, so
# that a dry run parses only the files edited since the last one (the parse is most of the
# time a plan spends on code); the Python version is in the key, as ast.dump's text is its.
PARSE_FORMAT = "pipeline-code-parse/1"


def role(module: str) -> str:
    """LOGIC or INFRASTRUCTURE: the role of library module ``module`` (dotted, relative to
    the package), from the folder it is in."""
    top = module.split(".")[0]
    return INFRASTRUCTURE if module == "__init__" or top in INFRASTRUCTURE_PACKAGES else LOGIC


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


def method_module(module: str) -> str | None:
    """The drafter method whose module ``module`` is (``methods.<name>`` for a registered
    method), None for any other module (the registry, the shared base, the checks)."""
    top, _, rest = module.partition(".")
    if top != METHODS_PACKAGE or not rest:
        return None
    return rest if rest in METHODS else None


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


class LabImportError(ValueError):
    def __init__(self, path: Path, module: str):
        super().__init__(
            f"{path} imports {module}: the instruments of benchmarks/ and lab/ ({LAB_PACKAGE}) "
            "are used by no stage (move what a stage needs into eagle3_pipeline first)"
        )


def parse_cache_dir() -> Path:
    """Where parses are kept: $EAGLE3_CODE_CACHE, else the user's cache folder."""
    if os.environ.get("EAGLE3_CODE_CACHE"):
        return Path(os.environ["EAGLE3_CODE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "eagle3-pipeline" / "code"


def _raw_imports(tree: ast.AST) -> list[list]:
    """Each import statement of a file as [level, module, names] (names None: ``import x``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [[0, alias.name, None] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append([node.level, node.module, [a.name for a in node.names]])
    return found


@functools.cache  # each file is read once per plan, however many rules import it
def parsed(path: Path) -> dict:
    """A Python file's ``imports`` (:func:`_raw_imports`) and ``fingerprint`` (its syntax
    tree without docstrings, hashed: comments, docstrings and formatting do not change it;
    ``ast.dump`` leaves out line and column numbers), from the cache when its content was
    parsed before. A cache that cannot be read or written is passed over."""
    source = Path(path).read_bytes()
    key = hashlib.sha256(f"{PARSE_FORMAT} {sys.version_info[:2]}\n".encode() + source)
    entry = parse_cache_dir() / f"{key.hexdigest()}.json"
    try:
        return json.loads(entry.read_text())
    except (OSError, ValueError):
        pass
    tree = ast.parse(source, filename=str(path))
    imports = _raw_imports(tree)
    fingerprint = hashlib.sha256(ast.dump(_strip_docstrings(tree)).encode()).hexdigest()
    result = {"imports": imports, "fingerprint": fingerprint}
    # whole or absent, whoever reads it meanwhile (not runtime.files.write_json: an entry
    # lost with the machine is parsed again, so no fsync per file of a first plan)
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, delete=False) as tmp:
            json.dump(result, tmp)
        os.replace(tmp.name, entry)
    except OSError:
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)
    return result


@functools.cache
def _imported_modules(path: Path) -> frozenset[str]:
    """Library modules that the file ``path`` imports (absolute or relative imports)."""
    me = _module_name(path)
    if me is None:
        package = None  # a workflow script: only absolute imports reach the library
    elif me == "__init__":
        package = ""
    else:
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for level, module, names in parsed(path)["imports"]:
        if names is None:
            first, _, rest = module.partition(".")
            if first == LAB_PACKAGE:
                raise LabImportError(path, module)
            if first == PACKAGE and rest:
                found.add(rest)
        elif level == 0 and module and module.split(".")[0] == LAB_PACKAGE:
            raise LabImportError(path, module)
        elif level == 0 and module and module.split(".")[0] == PACKAGE:
            found |= _resolve(module.partition(".")[2], names)
        elif level and package is not None:
            parts = package.split(".") if package else []
            parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
            found |= _resolve(".".join(parts + ([module] if module else [])), names)
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


def code_fingerprint(path: Path) -> str:
    """Hash of a Python file's syntax tree without docstrings (:func:`parsed`)."""
    return parsed(Path(path))["fingerprint"]


@functools.cache
def logic_modules(script: str | Path, methods: tuple[str, ...] | None = ()) -> tuple[str, ...]:
    """The logic modules a script depends on: those it imports, and those they import,
    transitively. An infrastructure module is a boundary: what it imports serves how a stage
    runs (config validation importing the drafter methods does not make every stage depend on
    them). Of the drafter methods' own modules only those of ``methods`` count (None: all):
    a job depends on the methods of the drafters it trains or serves, no other."""
    todo = list(_imported_modules(Path(script)))
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        owner = method_module(mod)
        if owner is not None and methods is not None and owner not in methods:
            continue
        if role(mod) == LOGIC:
            todo.extend(_imported_modules(module_file(mod)) - seen)
    return tuple(
        sorted(
            m
            for m in seen
            if role(m) == LOGIC
            and (methods is None or method_module(m) is None or method_module(m) in methods)
        )
    )


@functools.cache
def code_hash(script: str | Path, methods: tuple[str, ...] | None = ()) -> str:
    """What a stage's result depends on in code: its script and its logic modules (of the
    drafter methods, those of ``methods``: :func:`logic_modules`).

    Given to the rule as a param, so a change of either re-runs the stage (and what depends
    on it), while an edit to an infrastructure module or to comments re-runs nothing.
    """
    script = Path(script)
    parts = {script.name: code_fingerprint(script.resolve())}
    for mod in logic_modules(script, methods):
        parts[mod] = code_fingerprint(module_file(mod))
    blob = "\n".join(f"{k} {v}" for k, v in sorted(parts.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def modules_hash(modules: list[str]) -> str:
    """:func:`code_hash` of a list of library modules (a stage's own reuse fingerprints)."""
    blob = "\n".join(f"{m} {code_fingerprint(module_file(m))}" for m in sorted(modules))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
