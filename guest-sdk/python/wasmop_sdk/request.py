"""What a module is called with: the primary, its owned children, related objects, context."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from .errors import Error
from .kinds import Gvk, ObjectRef


class Object(dict):
    """A Kubernetes object: the plain dict of its JSON, with shortcuts for what every module
    reads (``name``, ``namespace``, ``labels``, ``spec``, ``status``)."""

    @property
    def metadata(self) -> dict:
        """``metadata`` (empty when absent)."""
        meta = self.get("metadata")
        return meta if isinstance(meta, dict) else {}

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> Optional[str]:
        """``metadata.namespace`` (None for cluster-scoped objects)."""
        return self.metadata.get("namespace")

    @property
    def uid(self) -> Optional[str]:
        """``metadata.uid``."""
        return self.metadata.get("uid")

    @property
    def generation(self) -> Optional[int]:
        """``metadata.generation``."""
        return self.metadata.get("generation")

    @property
    def labels(self) -> dict:
        """``metadata.labels`` (empty when absent)."""
        return self.metadata.get("labels") or {}

    @property
    def annotations(self) -> dict:
        """``metadata.annotations`` (empty when absent)."""
        return self.metadata.get("annotations") or {}

    @property
    def spec(self) -> dict:
        """``spec`` (empty when absent)."""
        spec = self.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def status(self) -> dict:
        """``status`` (empty when absent)."""
        status = self.get("status")
        return status if isinstance(status, dict) else {}

    def gvk(self) -> Gvk:
        """The object's kind."""
        return Gvk.of(self)

    def ref(self) -> ObjectRef:
        """A reference to this object."""
        return ObjectRef.from_object(self)


def parse_object(text: str, what: str) -> Object:
    """Parses JSON text from the host into an ``Object``; raises ``Error`` naming ``what``."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise Error(f"{what} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise Error(f"{what} is not a JSON object")
    return Object(value)


class TriggerKind(Enum):
    """Why a reconcile runs (see the WIT ``trigger``)."""

    PRIMARY_CHANGED = "primary-changed"
    CHILD_CHANGED = "child-changed"
    RELATED_CHANGED = "related-changed"
    RESYNC = "resync"
    REQUEUE = "requeue"
    RETRY = "retry"
    MODULE_CHANGED = "module-changed"
    DRY_RUN = "dry-run"


@dataclass(frozen=True)
class Trigger:
    """Why a reconcile runs; ``object`` names the child or related object that changed."""

    kind: TriggerKind = TriggerKind.PRIMARY_CHANGED
    object: Optional[ObjectRef] = None


@dataclass
class Context:
    """Facts about this call."""

    reconciler: str = "test"
    trigger: Trigger = field(default_factory=Trigger)
    attempt: int = 1
    config_json: str = "{}"
    now_unix_ms: int = 0

    def config(self) -> Any:
        """The WasmReconciler's config, parsed from JSON (``{}`` when none)."""
        try:
            return json.loads(self.config_json)
        except ValueError as e:
            raise Error(f"the reconciler config is not JSON: {e}") from None


class Request:
    """A reconcile or finalize request: the primary (desired state) and the observed children
    and related objects (actual state), grouped by kind."""

    def __init__(self, primary: str, owned: list, related: list, context: Context):
        self._primary = primary
        self._owned = owned  # [(Gvk, [json text])]
        self._related = related
        self.context = context

    @property
    def primary(self) -> Object:
        """The primary object, whole (metadata, spec, status)."""
        return parse_object(self._primary, "the primary")

    def primary_json(self) -> str:
        """The primary object as JSON text."""
        return self._primary

    def owned_kinds(self) -> list:
        """Every owned kind, in the order of the metadata."""
        return [k for k, _ in self._owned]

    def owned(self, kind: Gvk) -> list:
        """The observed children of ``kind`` (those the primary controls)."""
        return [parse_object(o, f"an observed {kind}") for k, objs in self._owned if k == kind for o in objs]

    def related(self, kind: Gvk) -> list:
        """The related objects of ``kind`` that the selector matches."""
        return [parse_object(o, f"a related {kind}") for k, objs in self._related if k == kind for o in objs]

    def config(self) -> Any:
        """The WasmReconciler's config (parsed JSON)."""
        return self.context.config()


class Operation(Enum):
    """The kind of change judged by ``validate``."""

    CREATE = "create"
    UPDATE = "update"


class ValidateRequest:
    """A proposed change of a primary, at admission or in ``wasmop test --validate``."""

    def __init__(self, operation: Operation, old: Optional[str], new: str, config: str = "{}"):
        self.operation = operation
        self._old = old
        self._new = new
        self._config = config

    @property
    def old(self) -> Optional[Object]:
        """The object before the change (None on create)."""
        return None if self._old is None else parse_object(self._old, "the old object")

    @property
    def new(self) -> Object:
        """The object after the change."""
        return parse_object(self._new, "the new object")

    def config(self) -> Any:
        """The WasmReconciler's config (parsed JSON)."""
        return Context(config_json=self._config).config()
