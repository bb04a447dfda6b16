"""Make the package's vLLM plugins visible where it runs from its source tree (PYTHONPATH=src
on the offline GPU host, where nothing is pip-installed): a minimal ``.dist-info`` beside the
package holding pyproject.toml's entry points, which ``importlib.metadata`` (and so vLLM's
plugin loader) finds on the path.

    python3 lab/gpu/entry_points.py src
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]


def main(src: str) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    info = Path(src) / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, entries in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    print(f"entry points of {project['name']} in {info}")


if __name__ == "__main__":
    main(sys.argv[1])
