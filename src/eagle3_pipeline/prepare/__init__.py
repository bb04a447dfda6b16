"""Prepare stage: training rows ``{input_ids, loss_mask}`` from the synth records, in the Arrow
format speculators reads (:mod:`.stage`)."""

from .stage import build_dataset, loop_start, read_batches

__all__ = ["build_dataset", "loop_start", "read_batches"]
