"""The train stage's error: a problem the user can act on (bad config, failed training)."""


class TrainError(RuntimeError):
    pass
