"""The exceptions a script may catch, kept free of native code so that every
module (and a script's own `except` clauses) can import them cheaply."""


class UsageError(RuntimeError):
    """A call made out of order or from the wrong thread: a bug in the script."""


class UnsupportedError(TypeError):
    """A model, optimizer or tensor troupe cannot train (wrong device, dtype,
    layout); raised up front so that nothing fails halfway through a step."""


class StateError(RuntimeError):
    """State that cannot be checkpointed; the message names the path of the
    offending leaf so the script's author can find it in their own tree."""


class Stopped(SystemExit):
    """The job ended for a reason other than reaching its last step.

    A SystemExit so that a script that does not catch it exits with the
    job's code instead of printing a traceback."""

    def __init__(self, code, reason):
        super().__init__(code)
        self.code = code
        self.reason = reason

    def __str__(self):
        return f"{self.reason} (exit {self.code})"
