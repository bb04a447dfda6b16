"""The error every layer may raise for a config that cannot work: most are found when the
workflow is parsed (:mod:`eagle3_pipeline.config`), a few only once a stage has read what it
needs, e.g. the target's attention heads (:func:`eagle3_pipeline.engine.spec.spec_for_target`)."""


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem, one per line."""
