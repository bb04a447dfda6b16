"""The best checkpoint exported as the drafter vLLM loads as is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .. import methods
from ..runtime.files import atomic_path


def export_checkpoint(ckpt: Path, drafter_dir: Path, verifier_path: str) -> dict[str, Any]:
    """Copy ``ckpt`` to ``drafter_dir`` as a self-describing speculators checkpoint whose
    verifier path is absolute and whose config says what vLLM must build for it (the
    method's :meth:`~eagle3_pipeline.methods.base.Method.exported_config`). Weights first,
    config.json last (each file atomically)."""
    drafter_dir.mkdir(parents=True, exist_ok=True)
    verifier = str(Path(verifier_path).resolve())
    config = json.loads((ckpt / "config.json").read_text())
    method = config.get("speculators_model_type")
    if method in methods.REGISTRY:
        config = methods.get(method).exported_config(config)
    config.setdefault("speculators_config", {}).setdefault("verifier", {})
    config["speculators_config"]["verifier"]["name_or_path"] = verifier
    for name in ("model.safetensors", "config.py"):
        if (ckpt / name).exists():
            with atomic_path(drafter_dir / name) as tmp:
                shutil.copyfile(ckpt / name, tmp)
    with atomic_path(drafter_dir / "config.json") as tmp:
        tmp.write_text(json.dumps(config, indent=2) + "\n")
    return config
