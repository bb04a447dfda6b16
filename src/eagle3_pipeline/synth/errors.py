"""The synth stage's error: a problem the user can act on (a server down, too many prompts
without an answer, a template check that fails); the answers so far are kept."""


class SynthError(RuntimeError):
    pass
