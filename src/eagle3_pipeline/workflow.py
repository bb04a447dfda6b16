"""Helpers the Snakefile uses at parse time (kept free of heavy imports: planning stays fast)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = "eagle3_pipeline"
PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache  # each module is parsed once per plan, however many rules import it
def _imported_modules(path: Path) -> frozenset[str]:
    """Names of ``eagle3_pipeline`` modules that ``path`` imports (relative or absolute)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    in_package = path.resolve().parent == PACKAGE_DIR
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1:
                    found.add(parts[1])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] == PACKAGE:
                parts = node.module.split(".")
                if len(parts) > 1:
                    found.add(parts[1])
                else:  # from eagle3_pipeline import x, y
                    found.update(a.name for a in node.names)
            elif node.level == 1 and in_package:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:  # from . import x
                    found.update(a.name for a in node.names)
    return frozenset(m for m in found if (PACKAGE_DIR / f"{m}.py").is_file())


@functools.cache
def module_closure(script: str | Path) -> tuple[str, ...]:
    """Library source files a workflow script depends on, transitively, as sorted paths.

    Declared as rule inputs, they make an edit to a library module re-run exactly the stages
    that import it (Snakemake itself only tracks the ``script:`` file).
    """
    todo = list(_imported_modules(Path(script)))
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        todo.extend(_imported_modules(PACKAGE_DIR / f"{mod}.py") - seen)
    seen.add("__init__")
    return tuple(sorted(str(PACKAGE_DIR / f"{m}.py") for m in seen))
