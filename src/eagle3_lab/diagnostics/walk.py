"""The walk, the uniform-anchor acceptance and a comparison of proposals (pure): see the
package docstring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ReplayError(RuntimeError):
    pass


# ---- the walk (pure) ---------------------------------------------------------------------------


def walk(
    proposals: Sequence[Sequence[int]],
    outputs: Sequence[int],
    k: int,
    continuation: Sequence[int] = (),
) -> dict[str, Any]:
    """Greedy speculative decoding at T=0 over one request's ``outputs`` with ``k`` drafts.

    ``proposals[i]`` are the drafter's proposals (target token ids, at least ``k``) from the
    anchor ``outputs[i]``: they guess ``outputs[i + 1 : i + 1 + k]``. ``outputs[0]`` comes from
    prefill; a step verifies k drafts from the current anchor, accepts the longest prefix equal
    to the output, emits it plus one token, and is counted as one draft (vLLM's scheduler counts
    every verification step whose request is still running; the drafter's proposal after the
    last token is never verified). The accepted length is counted before the output is cut at
    EOS or ``max_tokens`` (vLLM counts the rejection sampler's output, then truncates), so a
    last step can accept drafts beyond ``outputs``: ``continuation`` is what the target's greedy
    decoding produces after ``outputs`` (k tokens suffice). Without it, drafts that would be
    judged against tokens past the end count as rejected and ``beyond_end`` says how many steps
    that concerned.

    Returns the counts of vLLM's spec-decode counters (``drafts``, ``draft_tokens``,
    ``accepted``, ``accepted_per_pos``), ``steps`` [(anchor, accepted)] and ``beyond_end``.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    truth = list(outputs) + list(continuation)
    m = len(outputs)
    drafts = accepted = beyond_end = 0
    per_pos = [0] * k
    steps: list[tuple[int, int]] = []
    i = 0
    while i + 1 < m:  # outputs[: i + 1] are produced; the request is still running
        d = list(proposals[i])[:k]
        if len(d) < k:
            raise ValueError(f"anchor {i}: {len(d)} proposals, k = {k}")
        a = 0
        while a < k and i + 1 + a < len(truth) and d[a] == truth[i + 1 + a]:
            a += 1
        if a < k and i + 1 + a >= len(truth):
            beyond_end += 1  # every known draft matched; the rest cannot be judged
        drafts += 1
        accepted += a
        for j in range(a):
            per_pos[j] += 1
        steps.append((i, a))
        i += a + 1
    return {
        "drafts": drafts,
        "draft_tokens": drafts * k,
        "accepted": accepted,
        "accepted_per_pos": per_pos,
        "steps": steps,
        "beyond_end": beyond_end,
    }


def uniform(proposals: Sequence[Sequence[int]], outputs: Sequence[int], k: int) -> dict[str, Any]:
    """What validation measures, on these outputs: a draft of ``k`` from *every* anchor whose k
    targets are all known (``i + k < len(outputs)``, as validation leaves out blocks past the
    end of a row), its accepted run counted. ``accepted_per_pos[j]``: anchors whose first j + 1
    drafts are right; ``correct_per_pos[j]``: anchors whose draft j is right whatever came
    before (DFlash's ``position_acc``)."""
    anchors = accepted = 0
    per_pos = [0] * k
    correct = [0] * k
    for i in range(len(outputs) - k):
        d = list(proposals[i])[:k]
        run = True
        for j in range(k):
            hit = d[j] == outputs[i + 1 + j]
            correct[j] += hit
            run = run and hit
            if run:
                per_pos[j] += 1
                accepted += 1
        anchors += 1
    return {
        "anchors": anchors,
        "accepted": accepted,
        "accepted_per_pos": per_pos,
        "correct_per_pos": correct,
    }


def combine(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts of several sequences (:func:`walk` or :func:`uniform` results) summed, as the
    Prometheus counters sum over a prompt set, with the acceptance length and per-position
    rates they give: tau = 1 + accepted / drafts (or anchors), per position = accepted at that
    position / drafts."""
    if not parts:
        return {"acceptance_length": None, "per_position": []}
    n_key = "drafts" if "drafts" in parts[0] else "anchors"
    n = sum(p[n_key] for p in parts)
    out: dict[str, Any] = {n_key: n, "accepted": sum(p["accepted"] for p in parts)}
    for key in ("draft_tokens", "beyond_end"):
        if key in parts[0]:
            out[key] = sum(p[key] for p in parts)
    k = len(parts[0]["accepted_per_pos"])
    per_pos = [sum(p["accepted_per_pos"][j] for p in parts) for j in range(k)]
    out["acceptance_length"] = 1 + out["accepted"] / n if n else None
    out["per_position"] = [c / n for c in per_pos] if n else [None] * k
    if "correct_per_pos" in parts[0]:
        correct = [sum(p["correct_per_pos"][j] for p in parts) for j in range(k)]
        out["position_accuracy"] = [c / n for c in correct] if n else [None] * k
    return out


def compare_proposals(
    served: Sequence[tuple[int, Sequence[int]]],
    replayed: Sequence[Sequence[int]],
    outputs: Sequence[int],
    k: int,
) -> dict[str, Any]:
    """vLLM's proposals of one request, step by step, against the replay's at the same anchor.

    ``served``: per proposal of vLLM's drafter, (the anchor token it drafted from, its k
    drafts), in order (the proposal after the last token, never verified, may be included).
    The anchors are reconstructed from the served drafts and ``outputs`` as the walk moves (so
    a disagreement does not shift the comparison): the first at ``outputs[0]``, each next one
    accepted + 1 further. A served anchor token that is not the output token there means the
    two decoded different sequences (``anchor_mismatch``). Returns the proposals compared, how
    many agree in full and per position, and the first disagreements."""
    i = 0
    steps = same = anchor_mismatch = 0
    same_per_pos = [0] * k
    examples: list[dict[str, Any]] = []
    for anchor_token, drafts in served:
        if i >= len(outputs):  # vLLM also proposes after the last token; nothing left after
            break
        d = list(drafts)[:k]
        r = list(replayed[i])[:k]
        if anchor_token != outputs[i]:
            anchor_mismatch += 1
        steps += 1
        same += d == r
        for j in range(k):
            same_per_pos[j] += d[j] == r[j]
        if d != r and len(examples) < 5:
            examples.append({"anchor": i, "served": d, "replay": r})
        a = 0
        while a < k and i + 1 + a < len(outputs) and d[a] == outputs[i + 1 + a]:
            a += 1
        i += a + 1
    return {
        "steps": steps,
        "identical": same,
        "identical_per_pos": same_per_pos,
        "anchor_mismatch": anchor_mismatch,
        "examples": examples,
    }


# ---- the target: prompt ids, hidden states, greedy continuation --------------------------------
