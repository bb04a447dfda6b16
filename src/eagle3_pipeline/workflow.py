"""Helpers the Snakefile uses at parse time (kept free of heavy imports: planning stays fast)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = "eagle3_pipeline"
PACKAGE_DIR = Path(__file__).resolve().parent


def module_file(name: str) -> Path | None:
    """The source file of library module ``name`` (dotted, relative to the package: ``train``,
    ``train.stage``): a module file or a subpackage's ``__init__.py``; None if there is none."""
    base = PACKAGE_DIR.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_name(path: Path) -> str | None:
    """``path``'s dotted name relative to the package, or None outside it."""
    try:
        rel = path.resolve().relative_to(PACKAGE_DIR)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache  # each module is parsed once per plan, however many rules import it
def _imported_modules(path: Path) -> frozenset[str]:
    """Library modules (dotted, relative to the package) that ``path`` imports, absolute or
    relative; ``from x import y`` counts ``x.y`` when ``y`` is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _module_name(path)
    # the package relative imports start from: the module's own package
    here = None if own is None else (own if path.name == "__init__.py" else own.rpartition(".")[0])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE + "."))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module != PACKAGE and not (node.module or "").startswith(PACKAGE + "."):
                    continue
                base = (node.module or "").removeprefix(PACKAGE).removeprefix(".")
            elif here is None:
                continue
            else:
                parts = here.split(".") if here else []
                up = node.level - 1
                if up > len(parts):
                    continue
                base = ".".join(parts[: len(parts) - up] + ([node.module] if node.module else []))
            if base:
                found.add(base)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if base else alias.name)
    return frozenset(m for m in found if module_file(m) is not None)


@functools.cache
def module_closure(script: str | Path) -> tuple[str, ...]:
    """Library source files a workflow script depends on, transitively, as sorted paths
    (importing ``a.b`` runs ``a/__init__.py`` too, so parent packages count).

    Declared as rule inputs, they make an edit to a library module re-run exactly the stages
    that import it (Snakemake itself only tracks the ``script:`` file).
    """
    todo = list(_imported_modules(Path(script)))
    seen: set[str] = {""}  # the package's own __init__
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parent = mod.rpartition(".")[0]
        todo.extend({parent, *_imported_modules(module_file(mod))} - seen)
    return tuple(sorted(str(module_file(m) or PACKAGE_DIR / "__init__.py") for m in seen))
