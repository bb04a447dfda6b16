"""Diagnostics of a drafter, used by no rule (lab/ runs them).

Drafter replay: the acceptance a drafter reaches when it is served exactly as it was trained.

The benchmark's acceptance length is what vLLM's drafter reaches on the target's own greedy
outputs; validation predicts another number. When the two disagree, either the prompts differ
(distribution) or vLLM computes something else than speculators trained (a train/serve
mismatch). The replay separates them: it takes the baseline's greedy outputs (T=0), computes
the target's hidden states for prompt + output with transformers (as extraction stores them),
runs the trained drafter on them with speculators' own model code, and simulates greedy
speculative decoding over those outputs:

* :func:`.walk.walk` (pure) is greedy speculative decoding at T=0 on one sequence: the first output
  token comes from prefill; from there on the drafter proposes k tokens from the current anchor
  (the last token produced), the longest prefix equal to the greedy output is accepted and the
  anchor moves by accepted + 1. Counted as vLLM's Prometheus counters count (one draft per
  verification step; a request stops when its outputs are complete, and the accepted length
  of its last step may reach past the end: the target verifies the drafts beyond EOS or
  ``max_tokens`` before the output is cut, see :func:`walk`).
* :func:`.walk.uniform` is what validation measures: the accepted run of a draft started at *every*
  position, averaged. speculators' DFlash ``eal`` and EAGLE-3's
  ``1 + sum_i prod_j cond_acc_j`` are this quantity on validation rows. The walk does not start
  drafts everywhere: after a long accepted run it skips the positions it accepted, so positions
  where drafts fail weigh more in the walk than in the uniform average, and the served
  acceptance length sits below the uniform one on the same text whenever easy and hard spans
  alternate. Replay numbers, side by side: uniform vs prediction = the prompts' distribution;
  walk vs uniform = how speculative decoding visits anchors; served vs walk = train/serve
  mismatch (and numerics).
* DFlash's ``proposals`` (:mod:`eagle3_pipeline.methods.dflash`) calls
  ``DFlashDraftModel._backbone_forward`` (the training forward) with an anchor at every
  output position: query block = anchor token + mask tokens at positions anchor..anchor+B-1,
  context = the fc-projected aux hidden states of the positions
  before the anchor. ``block`` is the trained block size (what training saw) or ``k + 1``
  (what vLLM builds: the bonus token and k mask tokens, ``copy_and_expand_dflash_inputs``).
* EAGLE-3's ``proposals`` (:mod:`eagle3_pipeline.methods.eagle3`) runs the TTT recurrence of
  ``Eagle3DraftModel.forward`` with the model's own modules and masks, feeding each step the
  previous step's prediction (mapped to the target vocabulary), as vLLM's proposer does;
  ``feed="teacher"`` reproduces speculators' forward exactly (teacher forcing: the
  ground-truth token), which gives the same acceptance.
* :func:`.replay.replay_run` does it for a finished run directory (``lab/drafter_replay.py``).

Heavy imports (torch, transformers, speculators) stay inside functions.
"""

from .walk import ReplayError, combine, compare_proposals, uniform, walk

__all__ = ["ReplayError", "combine", "compare_proposals", "uniform", "walk"]
