"""Synth stage: the target's own answers, with the exact token ids it saw and produced.

- :mod:`.stage`: the requests; one part of the prompts per job (``synth``), the parts' answers
  merged and checked (``synth_gather``);
- :mod:`.answers`: where answers live between jobs (journals keyed by prompt), which prompts a
  part answers;
- :mod:`.conversations`: with ``synth.context: on_policy``, a conversation's turns and the
  context each is asked with (the target's own earlier answers);
- :mod:`.check`: do a record's token ids say what its text fields say (the chat template and
  the reasoning parser's markers)?
"""

from .answers import part_of
from .stage import SynthError, gather, generate, generate_on_policy, run, run_part

__all__ = [
    "SynthError",
    "gather",
    "generate",
    "generate_on_policy",
    "part_of",
    "run",
    "run_part",
]
