"""Synth stage: the target's own answers, with the exact token ids it saw and produced.

- :mod:`.stage`: the requests, their journal and resume, the synth output;
- :mod:`.check`: do a record's token ids say what its text fields say (the chat template and
  the reasoning parser's markers)?
"""

from .stage import SynthError, run

__all__ = ["SynthError", "run"]
