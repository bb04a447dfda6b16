"""How the report writes one value in a table cell or a sentence."""

from __future__ import annotations

from typing import Any


def fmt(v: Any, digits: int = 3) -> str:
    if v is None or v == {}:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {fmt(x, digits)}" for k, x in v.items())
    return str(v)
