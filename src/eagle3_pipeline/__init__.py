"""EAGLE-3 drafter pipeline: the library behind the Snakemake workflow.

Modules are split by concern and import heavy dependencies (torch, vllm, speculators) lazily,
so that planning a run and unit tests stay fast.
"""

__version__ = "0.1.0"
