"""The error a module returns from reconcile or finalize."""


class Error(Exception):
    """A module's own failure.

    Raise it (or any exception) from ``reconcile`` or ``finalize``: the host records the message
    as a Warning Event on the primary and retries with backoff. Another exception is recorded by
    its type and where it was raised only: its text may carry values (Secret data).
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def context(self, what: str) -> "Error":
        """The same error, with what was being done in front: ``reading the spec: ...``."""
        return Error(f"{what}: {self.message}")
