"""The rounds protocol of the engine-efficiency benchmarks (eagle3_lab.rounds)."""

from __future__ import annotations

import os

import pytest

from eagle3_lab import rounds
from eagle3_pipeline.bench import measure


def test_rounds_reverse_the_order_and_keep_every_figure():
    calls = []

    def variant(name):
        def run():
            calls.append(name)
            return {"tokens_per_s": 10.0 * (len(calls))}

        return run

    result = rounds.alternate(
        {"a": variant("a"), "b": variant("b"), "c": variant("c")}, 3, log=lambda _: None
    )
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert [r["order"] for r in result["rounds"]] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["a", "b", "c"],
    ]
    assert rounds.figure(result, "a", "tokens_per_s") == [10.0, 60.0, 70.0]
    assert rounds.spread([10.0, 60.0, 70.0]) == {"n": 3, "median": 60.0, "min": 10.0, "max": 70.0}
    assert rounds.paired_ratios(result, "c", "a", "tokens_per_s") == [3.0, 40 / 60, 90 / 70]
    for r in [result["before"], *(r["after"] for r in result["rounds"])]:
        assert {"other_gpu_processes", "loadavg_1m", "gpu_utilization"} <= set(r)


def test_a_gpu_other_processes_use_is_refused_unless_allowed(monkeypatch):
    own = {"pid": os.getpid(), "name": "python", "memory_mib": "500"}
    foreign = {"pid": 1, "name": "another-job", "memory_mib": "9000"}
    monkeypatch.setattr(measure, "_gpu_processes", lambda: [own])
    assert rounds.refuse_shared_gpu(False)["other_gpu_processes"] == []  # its own probe is fine
    monkeypatch.setattr(measure, "_gpu_processes", lambda: [own, foreign])
    with pytest.raises(rounds.SharedGpuError, match="another-job"):
        rounds.refuse_shared_gpu(False)
    assert rounds.refuse_shared_gpu(True)["other_gpu_processes"] == [foreign]
