"""Bench stage: each drafter under real vLLM speculative decoding, against the target without
a drafter, in alternating rounds.

- :mod:`.measure`: one timed pass of a prompt set, acceptance from vLLM's spec-decode
  counters, the rounds protocol, and what else shares the machine while it measures;
- :mod:`.cache`: each prompt set's measurement kept under a fingerprint of what it depends on;
- :mod:`.verdict`: speedups with their spread and significance, and the verdict;
- :mod:`.stage`: the two jobs, ``bench`` (:func:`run`) and ``bench_baseline``
  (:func:`run_baseline`).

The names below are the stage's public API: the jobs, and the parts benchmarks/ and lab/
measure drafters with (a server as the stage starts it, a timed pass, the rounds protocol,
acceptance from vLLM's counters).
"""

from . import cache
from .measure import (
    BASELINE,
    DRAFTER,
    BenchError,
    acceptance,
    bench_rounds,
    counter_delta,
    measure_alternating,
    measure_rounds,
    request_body,
    scrape,
)
from .stage import drafter_rows, run, run_baseline, speculative_config, start_server
from .verdict import best_val, spread_text

__all__ = [
    "BASELINE",
    "DRAFTER",
    "BenchError",
    "acceptance",
    "bench_rounds",
    "best_val",
    "cache",
    "counter_delta",
    "drafter_rows",
    "measure_alternating",
    "measure_rounds",
    "request_body",
    "run",
    "run_baseline",
    "scrape",
    "speculative_config",
    "spread_text",
    "start_server",
]
