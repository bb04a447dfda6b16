"""Vocab stage: the draft vocabulary map (d2t/t2d) from the trained tokens' frequencies, and
its coverage (:mod:`.stage`)."""

from .stage import build

__all__ = ["build"]
