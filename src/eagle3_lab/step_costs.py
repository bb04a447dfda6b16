"""What a speculative step costs, and the speedup a measured τ would give at a target's shape.

One speculative step at batch 1 drafts k tokens (k drafter steps), verifies them in one target
forward pass over k + 1 tokens, and emits τ tokens on average (τ: the acceptance length, the
accepted drafts plus the target's own token). Plain decoding emits one token per target step.
So, with t_target one decode step, t_verify(k+1) one forward pass over k + 1 new tokens on a
cached prefix and t_draft one drafter step:

    speedup = τ · t_target / (t_verify(k+1) + k · t_draft)

It ignores what a step costs beyond these (scheduling, the rejection sampler), which the
measured step costs of a real engine include where they were measured end to end.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path


def speculative_step(t_verify: float, t_draft: float, k: int) -> float:
    """Time of one speculative step: k drafter steps and one verification of k + 1 tokens."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return t_verify + k * t_draft


def projected_speedup(
    tau: float, t_target: float, t_verify: float, t_draft: float, k: int
) -> float:
    """τ · t_target / (t_verify(k+1) + k · t_draft): tokens per second with the drafter over
    tokens per second without it, at batch 1."""
    if not 1 <= tau <= k + 1:
        raise ValueError(f"τ must lie in [1, k + 1] = [1, {k + 1}], got {tau}")
    return tau * t_target / speculative_step(t_verify, t_draft, k)


def break_even_tau(t_target: float, t_verify: float, t_draft: float, k: int) -> float:
    """The τ at which the drafter neither gains nor loses (projected speedup 1)."""
    return speculative_step(t_verify, t_draft, k) / t_target


def per_step(t_long: float, t_short: float, n_long: int, n_short: int) -> float:
    """Time of one decode step from two generations of the same prompt that differ only in how
    many tokens they emit: prefill, request handling and start-up cancel in the difference."""
    if n_long <= n_short:
        raise ValueError(f"n_long ({n_long}) must exceed n_short ({n_short})")
    return (t_long - t_short) / (n_long - n_short)


def verify_step(t_decode: float, t_req_many: float, t_req_one: float) -> float:
    """One forward pass over k + 1 new tokens on a cached prefix: a decode step plus what the
    k extra query tokens add, measured as the difference between a 1-token request whose
    uncached suffix has k + 1 tokens and one whose suffix has 1 (same cached prefix)."""
    return t_decode + (t_req_many - t_req_one)


def draft_step(t_first_extra: float, t_layer_step: float, k: int) -> float:
    """Mean cost of one of the k drafter steps: each runs the drafter's layer and head
    (``t_layer_step``); the first also projects the target's hidden states through the fc
    layer (``t_first_extra``)."""
    return (t_first_extra + k * t_layer_step) / k


def extrapolate_layers(t_one: float, t_two: float, layers: int) -> float:
    """A step of the full ``layers``-layer model from the 1- and the 2-layer cut: what the cut
    costs beyond its layers (embedding, head, sampling, launch) plus ``layers`` times the
    marginal layer (t_two - t_one). Refused where the 2-layer cut is not the slower: the
    layer's cost is then below what the measurement resolves."""
    if t_two <= t_one:
        raise ValueError(
            f"the 2-layer cut ({t_two:.3f}) is not slower than the 1-layer one ({t_one:.3f}): "
            "the marginal layer is not resolved"
        )
    return t_one + (layers - 1) * (t_two - t_one)


def summary(samples: Sequence[float]) -> dict:
    """Median, min, max, count and spread ((max - min) / median) of repeated timings."""
    if not samples:
        raise ValueError("no samples")
    med = statistics.median(samples)
    return {
        "median": med,
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
        "spread": (max(samples) - min(samples)) / med if med else None,
    }


def measured_runs(
    metrics_path: str | Path, concurrency: int = 1, temperature: float = 0.0
) -> list[dict]:
    """The measured runs at ``concurrency`` and ``temperature`` of a bench stage's metrics.json
    (its ``runs``) or of ``lab/drafter_tau.py --speed`` (the same rows as ``results``): per
    prompt set, τ, the speedup (median over rounds, with its range), and the step costs they
    imply: t_target = 1 / baseline tokens per s and t_spec = τ / tokens per s with the
    drafter."""
    metrics = json.loads(Path(metrics_path).read_text())
    rows = []
    for run in metrics["runs"] if "runs" in metrics else metrics["results"]:
        if run["concurrency"] != concurrency or run["temperature"] != temperature:
            continue
        rows.append(
            {
                "prompt_set": run["prompt_set"],
                "k": run["k"],
                "tau": run["acceptance_length"],
                "speedup": run["speedup"],
                "speedup_range": run.get("speedup_range"),
                "t_target_ms": 1e3 / run["baseline_tokens_per_s"],
                "t_spec_ms": 1e3 * run["acceptance_length"] / run["tokens_per_s"],
            }
        )
    return rows


def projections_from_step(t_target: float, t_spec: float, taus: dict[str, float]) -> dict:
    """The projection from a whole speculative step measured as such (vLLM serving the target
    with the drafter): speedup τ · t_target / t_spec, break-even τ t_spec / t_target."""
    return {
        "t_spec_ms": t_spec,
        "break_even_tau": t_spec / t_target,
        "speedup": {name: tau * t_target / t_spec for name, tau in taus.items()},
    }


def projections(costs: dict, taus: dict[str, float], k: int) -> dict:
    """The projected speedup for each named τ at one shape's step costs (milliseconds:
    ``t_target_ms``, ``t_verify_ms``, ``t_draft_ms``), with the break-even τ."""
    t, v, d = costs["t_target_ms"], costs["t_verify_ms"], costs["t_draft_ms"]
    return {
        "t_spec_ms": speculative_step(v, d, k),
        "break_even_tau": break_even_tau(t, v, d, k),
        "speedup": {name: projected_speedup(tau, t, v, d, k) for name, tau in taus.items()},
    }
