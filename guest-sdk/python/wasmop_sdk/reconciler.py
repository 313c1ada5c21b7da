"""The ``Reconciler`` base class a module implements."""

from __future__ import annotations

from .kinds import Metadata
from .request import Request, ValidateRequest
from .response import Finalized, Response, Validation


class Reconciler:
    """A reconcile module: what it is (``metadata``) and what it does.

    Every method is a pure function of its arguments: the host calls them in a fresh sandbox
    each time, with no memory of earlier calls, and may call them again at any time.
    """

    def metadata(self) -> Metadata:
        """The module's name and version, the primary kind, the owned and related kinds."""
        raise NotImplementedError("a Reconciler must define metadata()")

    def reconcile(self, request: Request) -> Response:
        """The intents that bring the actual state to the desired state.

        Raise ``wasmop_sdk.Error`` (or any exception) to fail: the host shows the message as a
        Warning Event on the primary and retries with backoff.
        """
        raise NotImplementedError("a Reconciler must define reconcile()")

    def finalize(self, request: Request) -> Finalized:
        """Clean-up while the primary is being deleted (if the metadata says ``finalizes``)."""
        return Finalized.finished()

    def validate(self, request: ValidateRequest) -> Validation:
        """Judges a proposed change of a primary (if the metadata says ``validates``)."""
        return Validation.allow()
