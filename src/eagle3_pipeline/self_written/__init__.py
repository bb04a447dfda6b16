"""Prompts the target writes itself: a ``prompts.train`` source ``self_written``.

Given its chat template up to a user turn's header, an aligned model writes a user turn
(Magpie, Xu et al. 2024): the prompts a team without traffic logs lacks, as many as it asks
for, in the model's own distribution.

- :mod:`.template`: where a user turn begins and ends, read off the target's chat template;
- :mod:`.conversations`: the conversations to write (system prompts or topics seed them; more
  turns continue them after the target's own answers), how far each came, its rows;
- :mod:`.filters`: which written turns are kept (unfinished, empty, too short, template markup,
  reasoning, an answer instead of a request, loops, not text);
- :mod:`.client`: the requests (a completion of the prefix's token ids, a chat answer);
- :mod:`.stage`: the parts (``prompts_write``) and their gather (``prompts_write_gather``).

Duplicates, near-duplicates and benchmark prompts are removed with every other source's, in the
training pool (:mod:`eagle3_pipeline.prompts.pool`).
"""

from .stage import ANSWER_KEYS, WRITE_KEYS, fingerprint, gather, run_part

__all__ = ["ANSWER_KEYS", "WRITE_KEYS", "fingerprint", "gather", "run_part"]
