"""Alternating rounds for the engine-efficiency benchmarks (benchmarks/synth_throughput.py,
benchmarks/extract_throughput.py), with what else was on the machine.

Each round runs every variant once; the order reverses every round (a b, b a, a b, ...), so a
drift of the machine lands on all variants alike, as in the bench stage
(:func:`.measure.round_order`). Each figure is kept per round with its spread (median,
min, max), and the machine's surroundings (:func:`.measure.surroundings`, plus GPU
utilization) are recorded before the first and after every round. A GPU that other
processes use is refused unless the caller allows it: their work would be in the figures.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from eagle3_pipeline.bench.measure import surroundings
from eagle3_pipeline.runtime.gpus import nvidia_smi_rows

# this process: its own GPU work (the extraction probe) is not another process
_ME = SimpleNamespace(proc=SimpleNamespace(pid=os.getpid()))


class SharedGpuError(RuntimeError):
    pass


def gpu_utilization() -> list[dict[str, Any]] | None:
    """Per GPU: utilization and memory in use (nvidia-smi), None without nvidia-smi."""
    try:
        rows = nvidia_smi_rows("gpu=index,utilization.gpu,memory.used,memory.total")
    except (OSError, subprocess.SubprocessError) as e:
        return [{"error": f"nvidia-smi failed: {e}"}]
    keys = ("index", "utilization_pct", "memory_used_mib", "memory_total_mib")
    return None if rows is None else [dict(zip(keys, r, strict=True)) for r in rows if len(r) == 4]


def machine(servers: Iterable = ()) -> dict[str, Any]:
    """What shares the machine now: other GPU processes (not ``servers``, not this process),
    GPU utilization, the 1-minute load average and the number of cores."""
    return {
        "time": round(time.time(), 1),
        **surroundings([*servers, _ME]),
        "gpu_utilization": gpu_utilization(),
    }


def refuse_shared_gpu(allow: bool) -> dict[str, Any]:
    """The surroundings before anything starts; raises SharedGpuError when other processes
    use a GPU, unless ``allow`` (then the figures say so through their surroundings)."""
    env = machine()
    others = env["other_gpu_processes"]
    if others and not allow:
        raise SharedGpuError(
            f"other processes use the GPU: {others}. Their work would be in the figures; "
            "wait for them to finish, or pass --allow-shared-gpu to measure anyway (the "
            "result records them)."
        )
    return env


def order(names: list[str], r: int) -> list[str]:
    """The variants' order in round ``r``: as given in even rounds, reversed in odd ones."""
    return list(names) if r % 2 == 0 else list(reversed(names))


def alternate(
    variants: dict[str, Callable[[], dict[str, Any]]],
    rounds: int,
    servers: Iterable = (),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every variant once per round, in :func:`order`; each returns its figures (a dict).
    Returns the rounds (order, figures per variant, surroundings after the round) and the
    surroundings before the first."""
    servers = list(servers)
    out: dict[str, Any] = {"before": machine(servers), "rounds": []}
    for r in range(rounds):
        names = order(list(variants), r)
        figures = {}
        for name in names:
            figures[name] = variants[name]()
            shown = {k: v for k, v in figures[name].items() if isinstance(v, (int, float))}
            log(f"round {r} {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
        out["rounds"].append({"order": names, **figures, "after": machine(servers)})
    return out


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Median, min and max of a figure over the rounds."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def figure(result: dict[str, Any], variant: str, key: str) -> list[float]:
    """One figure of one variant over the rounds of :func:`alternate`'s result."""
    return [r[variant][key] for r in result["rounds"] if variant in r]


def paired_ratios(result: dict[str, Any], num: str, den: str, key: str) -> list[float]:
    """Per round, ``num``'s figure over ``den``'s (both measured in that round)."""
    return [r[num][key] / r[den][key] for r in result["rounds"] if r[den][key]]
