"""What a module answers: intents (children, actions, status, Events, requeue) and verdicts."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any, Optional, Union

from .errors import Error
from .kinds import Gvk, ObjectRef
from .request import Object, Request


class Propagation(Enum):
    """How a delete propagates to the object's dependents."""

    BACKGROUND = "background"
    FOREGROUND = "foreground"
    ORPHAN = "orphan"


class ActionKind(Enum):
    """The kind of an imperative intent."""

    MERGE_PATCH = "merge-patch"
    JSON_PATCH = "json-patch"
    DELETE = "delete"


@dataclass(frozen=True)
class Action:
    """An imperative intent, applied in order after the children: a merge patch (a dict), a
    JSON patch (a list of operations) or a delete."""

    kind: ActionKind
    target: ObjectRef
    patch: Any = None
    propagation: Propagation = Propagation.BACKGROUND


class ConditionStatus(Enum):
    """A condition's status."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Condition:
    """A status condition; the host adds ``lastTransitionTime`` and ``observedGeneration``.

    ``Condition.new("Ready", True).with_reason("Provisioned").with_message("...")``.
    """

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""

    @staticmethod
    def new(type_: str, status: bool) -> "Condition":
        """A condition that is true or false."""
        return Condition(type_, ConditionStatus.TRUE if status else ConditionStatus.FALSE)

    @staticmethod
    def unknown(type_: str) -> "Condition":
        """A condition whose status is Unknown."""
        return Condition(type_, ConditionStatus.UNKNOWN)

    def with_reason(self, reason: str) -> "Condition":
        """Sets the CamelCase reason."""
        return Condition(self.type, self.status, reason, self.message)

    def with_message(self, message: str) -> "Condition":
        """Sets the message."""
        return Condition(self.type, self.status, self.reason, message)


class EventType(Enum):
    """Normal or Warning."""

    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event (repeats are counted by the host, not duplicated)."""

    type: EventType
    reason: str
    message: str
    action: str = ""
    regarding: Optional[ObjectRef] = None

    @staticmethod
    def normal(reason: str, message: str) -> "Event":
        """A Normal event about the primary."""
        return Event(EventType.NORMAL, reason, message)

    @staticmethod
    def warning(reason: str, message: str) -> "Event":
        """A Warning event about the primary."""
        return Event(EventType.WARNING, reason, message)

    def with_action(self, action: str) -> "Event":
        """Sets the CamelCase action (``Reconcile`` when empty)."""
        return Event(self.type, self.reason, self.message, action, self.regarding)

    def about(self, obj: ObjectRef) -> "Event":
        """About another object than the primary."""
        return Event(self.type, self.reason, self.message, self.action, obj)


@dataclass
class Status:
    """The whole status of the primary: fields (a dict) and conditions."""

    fields: dict = field(default_factory=dict)
    conditions: list = field(default_factory=list)


class Response:
    """The intents of one reconcile. Build it by chaining; every method returns the response.

    ``Response.complete(request)`` declares every owned kind a complete set: each existing child
    not added with ``child`` is pruned. ``Response()`` leaves kinds not mentioned alone.
    """

    def __init__(self) -> None:
        self.child_sets: list = []  # [(Gvk, [dict])]
        self.actions: list = []
        self.status: Optional[Status] = None
        self.events: list = []
        self.requeue: Optional[timedelta] = None

    @staticmethod
    def complete(request: Request) -> "Response":
        """A declarative response: every owned kind is a complete set, initially empty."""
        r = Response()
        for kind in request.owned_kinds():
            r._set_of(kind)
        return r

    def _set_of(self, kind: Gvk) -> list:
        for k, objects in self.child_sets:
            if k == kind:
                return objects
        objects: list = []
        self.child_sets.append((kind, objects))
        return objects

    def none_of(self, kind: Gvk) -> "Response":
        """Declares the complete set of children of ``kind`` empty unless children are added."""
        self._set_of(kind)
        return self

    def child(self, obj: dict) -> "Response":
        """Adds a desired child: a dict with ``apiVersion``, ``kind`` and ``metadata.name``
        (a namespaced child's namespace defaults to the primary's)."""
        try:
            kind = Gvk.of(obj)
        except ValueError as e:
            raise Error(f"a child: {e}") from None
        self._set_of(kind).append(copy.deepcopy(dict(obj)))
        return self

    def merge_patch(self, target: ObjectRef, patch: dict) -> "Response":
        """Adds an RFC 7386 merge patch of ``target``."""
        self.actions.append(Action(ActionKind.MERGE_PATCH, target, patch))
        return self

    def json_patch(self, target: ObjectRef, operations: list) -> "Response":
        """Adds an RFC 6902 JSON patch of ``target``."""
        self.actions.append(Action(ActionKind.JSON_PATCH, target, operations))
        return self

    def delete(self, target: ObjectRef, propagation: Propagation = Propagation.BACKGROUND) -> "Response":
        """Deletes ``target``."""
        self.actions.append(Action(ActionKind.DELETE, target, None, propagation))
        return self

    def _status(self) -> Status:
        if self.status is None:
            self.status = Status()
        return self.status

    def with_status(self, fields: dict) -> "Response":
        """Sets the status fields (other than conditions and observedGeneration)."""
        if not isinstance(fields, dict):
            raise Error("the status must be a dict (a JSON object)")
        self._status().fields = copy.deepcopy(fields)
        return self

    def condition(self, condition: Condition) -> "Response":
        """Adds (or replaces, by type) a status condition."""
        s = self._status()
        s.conditions = [c for c in s.conditions if c.type != condition.type] + [condition]
        return self

    def event(self, event: Event) -> "Response":
        """Records an Event."""
        self.events.append(event)
        return self

    def requeue_after(self, after: Union[timedelta, float]) -> "Response":
        """Asks to be reconciled again after ``after`` (a timedelta, or seconds)."""
        self.requeue = after if isinstance(after, timedelta) else timedelta(seconds=after)
        return self

    # For tests.

    def children(self, kind: Gvk) -> list:
        """The desired children of ``kind`` (as ``Object``s)."""
        return [Object(o) for k, objs in self.child_sets if k == kind for o in objs]

    def condition_of(self, type_: str) -> Optional[Condition]:
        """The status condition of this type, if set."""
        if self.status is None:
            return None
        return next((c for c in self.status.conditions if c.type == type_), None)


class Finalized:
    """The result of a finalize: done, or pending (called again later), with side effects
    (actions, status, Events, requeue; no children)."""

    def __init__(self, done: bool, effects: Optional[Response] = None):
        self.done = done
        self.effects = effects if effects is not None else Response()

    @staticmethod
    def finished() -> "Finalized":
        """Clean-up is complete: the host removes its finalizer."""
        return Finalized(True)

    @staticmethod
    def pending() -> "Finalized":
        """Clean-up is not complete; finalize runs again."""
        return Finalized(False)

    def with_effects(self, effects: Response) -> "Finalized":
        """With these actions, status, Events and requeue delay."""
        self.effects = effects
        return self


class Validation:
    """The verdict on a proposed change: allowed (with warnings) or denied (with a message and
    maybe the offending field)."""

    def __init__(self, allowed: bool, warnings: Optional[list] = None, message: str = "", field: Optional[str] = None):
        self.allowed = allowed
        self.warnings = warnings or []
        self.message = message
        self.field = field

    @staticmethod
    def allow() -> "Validation":
        """Allowed."""
        return Validation(True)

    def warn(self, warning: str) -> "Validation":
        """Adds a warning (to an allowed verdict)."""
        if self.allowed:
            self.warnings.append(warning)
        return self

    @staticmethod
    def deny(message: str, field: Optional[str] = None) -> "Validation":
        """Refused, because of ``field`` (a JSON path such as ``spec.quota.cpu``) if given."""
        return Validation(False, message=message, field=field)

    def __repr__(self) -> str:
        if self.allowed:
            return f"Validation.allow(warnings={self.warnings!r})"
        return f"Validation.deny({self.message!r}, field={self.field!r})"
