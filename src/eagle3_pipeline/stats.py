"""Summary statistics of measured values, one way for every stage (sequence lengths, latencies,
step times): percentiles by numpy's linear interpolation, plus the mean."""

from __future__ import annotations

from collections.abc import Iterable


def percentiles(values: Iterable[float], qs: Iterable[float] = (50, 90, 99, 100)) -> dict:
    """``{"p<q>": value, ..., "mean": value}``; ``{}`` when there are no values."""
    import numpy as np

    v = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=np.float64)
    v = v.astype(np.float64, copy=False)
    if v.size == 0:
        return {}
    qs = list(qs)
    return {f"p{q}": float(x) for q, x in zip(qs, np.percentile(v, qs), strict=True)} | {
        "mean": float(v.mean())
    }


def median(values: Iterable[float]) -> float | None:
    return percentiles(values, (50,)).get("p50")
