"""The miniature Kimi-K2.5 for the tests: built once per machine with the committed script's
library call, cached under tests/.cache/miniature/ by its fingerprint (minutes the first time,
nothing after), one training shared by both exports. The session builds it in the background
(the ``miniature`` shared run, tests/dag_runs.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "tests" / ".cache" / "miniature"


def build_cached(quantize: str) -> Path:
    """The miniature under tests/.cache/miniature/<fingerprint>-<quantize> ("w4a16" or "none")."""
    from eagle3_pipeline.miniature import build

    train_fp = build.fingerprint(build.inputs(build.BuildSettings()))
    out = CACHE / f"{train_fp}-{quantize}"
    build.build(out, quantize=quantize, cache=CACHE)
    return out


def build_all() -> dict[str, str]:
    """Both exports, one after the other (the second finds the training cached)."""
    return {quantize: str(build_cached(quantize)) for quantize in ("none", "w4a16")}
