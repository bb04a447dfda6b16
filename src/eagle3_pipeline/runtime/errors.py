"""The error of a config that cannot work: most are found when the workflow is parsed
(:mod:`eagle3_pipeline.config`), a few only once a job has read what it needs, e.g. the
target's attention heads (:func:`eagle3_pipeline.engine.spec.check_tensor_parallel`)."""


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem, one per line."""
