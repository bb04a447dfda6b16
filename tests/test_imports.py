"""The shape of the library, kept: its import graph has no cycle, no import inside a function
dodges one, and no module is longer than the team's limit.

The graph is read from the code with ``ast`` (nothing is imported). A module depends on every
module of the library it imports, wherever the import stands (a function's import runs too,
later), and on the packages above that module: ``from ..bench.gate import x`` runs
``bench/__init__.py`` first, so a package that re-exports its stage module puts that whole
stage under everyone who imports one of its small modules.

An import inside a function is allowed only where it keeps a heavy third-party library
(:data:`HEAVY`) out of the importer's own import: the module it names loads one when it is
imported. Anything else would be an import hidden from the graph's readers, usually one that
dodges a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGES = ("eagle3_pipeline", "eagle3_lab")
MAX_LINES = 500
# The code the limit holds for: the library and the scripts that call it.
LONG_FILES_DIRS = ("src", "workflow_scripts", "scripts")
# Third-party libraries whose import costs seconds or needs a GPU stack: planning, the
# Snakefile and the unit tests must not load them by importing a module of the library.
HEAVY = frozenset(
    {
        "datasets",
        "hs_connectors",
        "matplotlib",
        "mooncake",
        "safetensors",
        "speculators",
        "torch",
        "transformers",
        "vllm",
    }
)


class Module:
    def __init__(self, name: str, path: Path, is_package: bool):
        self.name, self.path, self.is_package = name, path, is_package
        self.tree = ast.parse(path.read_text(), filename=str(path))


def library(src: Path = SRC) -> dict[str, Module]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((src / package).rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            mods[".".join(parts)] = Module(".".join(parts), path, is_package)
    return mods


def _imports(tree: ast.AST):
    """Every import statement with whether it stands inside a function."""

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from walk(child, inside)

    yield from walk(tree, False)


def _targets(mod: Module, node: ast.AST, mods: dict[str, Module]) -> list[str]:
    """Dotted names an import statement names: library modules, or third-party ones."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        package = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _runs(name: str, importer: str, mods: dict[str, Module]) -> set[str]:
    """The library modules importing ``name`` runs for ``importer``: it and the packages above
    it that are not above the importer (those are running already)."""
    own = {importer, *_ancestors(importer)}
    return {m for m in (*_ancestors(name), name) if m in mods and m not in own}


def graph(mods: dict[str, Module]) -> tuple[dict[str, dict[str, list[int]]], list[tuple]]:
    """``edges[a][b]``: the lines where module a imports b (or a module inside package b);
    and every import inside a function of a module of the same package, as (module, line,
    imported name). The pipeline never imports the lab's package (staleness.code refuses it),
    so the lab's imports of the pipeline cannot close a cycle."""
    edges: dict[str, dict[str, list[int]]] = {m: {} for m in mods}
    lazy = []
    for mod in mods.values():
        for node, in_function in _imports(mod.tree):
            for target in _targets(mod, node, mods):
                runs = _runs(target, mod.name, mods)
                for dep in runs:
                    edges[mod.name].setdefault(dep, []).append(node.lineno)
                if in_function and target.split(".")[0] == mod.name.split(".")[0]:
                    lazy.append((mod.name, node.lineno, target))
    return edges, lazy


def cycles(edges: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def loads_heavy(name: str, mods: dict[str, Module], seen: set[str] | None = None) -> bool:
    """Whether importing library module ``name`` loads a :data:`HEAVY` library: it, or a module
    of the library it imports at module level, imports one outside any function."""
    seen = set() if seen is None else seen
    if name in seen or name not in mods:
        return False
    seen.add(name)
    mod = mods[name]
    for node, in_function in _imports(mod.tree):
        if in_function:
            continue
        for target in _targets(mod, node, mods):
            if target.split(".")[0] in HEAVY:
                return True
            if any(loads_heavy(m, mods, seen) for m in _runs(target, name, mods)):
                return True
    return False


def test_the_import_graph_has_no_cycle():
    mods = library()
    edges, _ = graph(mods)
    found = cycles(edges)
    lines = []
    for component in found:
        lines.append("cycle: " + ", ".join(component))
        for a in component:
            for b in component:
                if b in edges[a]:
                    where = f"{mods[a].path.relative_to(REPO)}:{edges[a][b][0]}"
                    lines.append(f"  {where} -> {b}")
    assert not found, "\n".join(lines)


def test_no_import_inside_a_function_hides_a_dependency():
    """A function's import of the library keeps a heavy library out of its module's import, or
    it belongs at the top of the module, where the graph's readers see it."""
    mods = library()
    _, lazy = graph(mods)
    hidden = [
        f"{mods[m].path.relative_to(REPO)}:{line} imports {target} inside a function, and "
        f"{target} loads none of {', '.join(sorted(HEAVY))}: import it at the top of the module"
        for m, line, target in lazy
        if not loads_heavy(target, mods)
    ]
    assert not hidden, "\n".join(hidden)


def test_no_module_is_longer_than_the_limit():
    """A module longer than this holds more than one idea (the team's rule)."""
    long = [
        f"{path.relative_to(REPO)}: {n} lines"
        for d in LONG_FILES_DIRS
        for path in sorted((REPO / d).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, f"modules over {MAX_LINES} lines (split them by idea):\n" + "\n".join(long)


def test_the_graph_reader_sees_what_python_runs(tmp_path):
    """The reader itself: a package's __init__ counts for whoever imports a module under it, a
    relative import resolves to the module it names, a function's import is an edge, and a
    cycle through a package's __init__ is found."""
    root = tmp_path / "src"
    files = {
        "eagle3_pipeline/__init__.py": "",
        "eagle3_pipeline/low/__init__.py": "from .stage import run\n",
        "eagle3_pipeline/low/stage.py": "def run():\n    from ..high import top\n",
        "eagle3_pipeline/low/small.py": "X = 1\n",
        "eagle3_pipeline/high.py": "from .low.small import X\n\ndef top():\n    return X\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    mods = library(root)
    edges, lazy = graph(mods)
    assert set(edges["eagle3_pipeline.high"]) == {
        "eagle3_pipeline.low",
        "eagle3_pipeline.low.small",
    }
    assert edges["eagle3_pipeline.low.stage"] == {"eagle3_pipeline.high": [2]}
    assert lazy == [("eagle3_pipeline.low.stage", 2, "eagle3_pipeline.high")]
    assert cycles(edges) == [
        ["eagle3_pipeline.high", "eagle3_pipeline.low", "eagle3_pipeline.low.stage"]
    ]
    assert not loads_heavy("eagle3_pipeline.high", mods)
