"""The instruments of benchmarks/ and lab/, outside the pipeline.

- :mod:`.rounds`: alternating rounds of the engine-efficiency benchmarks, with what else was
  on the machine;
- :mod:`.step_costs`: what a speculative step costs at real targets' shapes, and the speedup
  a measured acceptance length would give there;
- :mod:`.dummy_models`: model folders of real targets' shapes for vLLM's dummy loader;
- :mod:`.diagnostics`: the drafter replay (speculators' model run on the target's states).

No stage imports this package (``eagle3_pipeline.staleness.code`` refuses a stage that does):
nothing here changes what a stage computes, and an edit here re-runs nothing.
"""
