"""Bench stage: each drafter under real vLLM speculative decoding, against the target without
a drafter, in alternating rounds.

- :mod:`.measure`: one timed pass of a prompt set, acceptance from vLLM's spec-decode
  counters, the rounds protocol, and what else shares the machine while it measures;
- :mod:`.cache`: each prompt set's measurement kept under a fingerprint of what it depends on;
- :mod:`.verdict`: speedups with their spread and significance, and the verdict;
- :mod:`.stage`: the two jobs, ``bench`` (:func:`run`) and ``bench_baseline``
  (:func:`run_baseline`).
"""

from .measure import BenchError
from .stage import run, run_baseline

__all__ = ["BenchError", "run", "run_baseline"]
