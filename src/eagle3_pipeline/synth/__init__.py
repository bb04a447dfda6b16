"""Synth stage: the target's own answers, with the exact token ids it saw and produced.

- :mod:`.stage`: one part of the prompts per job (``synth``), the parts' answers merged and
  checked (``synth_gather``);
- :mod:`.client`: how a part asks: its endpoints, its requests, each answer journaled;
- :mod:`.records`: which answer counts for each prompt, the merged records and their stats;
- :mod:`.answers`: where answers live between jobs (journals keyed by prompt), which prompts a
  part answers;
- :mod:`.conversations`: with ``synth.context: on_policy``, a conversation's turns and the
  context each is asked with (the target's own earlier answers);
- :mod:`.check`: do a record's token ids say what its text fields say (the chat template and
  the reasoning parser's markers)?
"""

from .answers import part_of
from .client import generate, generate_on_policy
from .errors import SynthError
from .stage import gather, run, run_part

__all__ = [
    "SynthError",
    "gather",
    "generate",
    "generate_on_policy",
    "part_of",
    "run",
    "run_part",
]
