"""Running a reconciler natively under pytest, on the fixture files ``wasmop test`` reads.

::

    from wasmop_sdk.testing import Harness
    out = (Harness(Tenants)
           .primary_file("fixtures/cr.yaml")
           .observed_file("fixtures/observed/quota.yaml")
           .reconcile())
    assert len(out.children(k8s.NAMESPACE)) == 1

The harness hands the reconciler the request the host (and ``wasmop test``) would build: every
owned and related kind present, observed objects grouped by kind, an observed object of a kind
both owned and related counted as owned when it has a controller ownerReference. It checks what
the host's intent validation checks first: every child is of an owned kind and has a name. It
does not check against a cluster (RBAC, schemas, scope): ``wasmop test`` on the built component
and the end-to-end tests do more.

Needs PyYAML (natively only; the component never imports this module).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from . import log
from .errors import Error
from .kinds import Gvk
from .reconciler import Reconciler
from .request import Context, Operation, Request, Trigger, TriggerKind, ValidateRequest
from .response import Finalized, Response, Validation


def yaml_documents(text: str) -> list:
    """The non-empty YAML documents of ``text``, as plain dicts and lists."""
    import yaml

    return [d for d in yaml.safe_load_all(text) if d is not None]


def _read_one(path: Union[str, Path]) -> dict:
    docs = yaml_documents(Path(path).read_text())
    if len(docs) != 1:
        raise ValueError(f"{path}: expected one YAML document, found {len(docs)}")
    return docs[0]


def _controlled(obj: dict) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") is True for r in refs)


class Harness:
    """Builds a request for a ``Reconciler`` subclass and runs it natively."""

    def __init__(self, reconciler: type):
        self.reconciler: Reconciler = reconciler()
        self.meta = self.reconciler.metadata()
        self.primary_obj: Optional[dict] = None
        self.owned: list = [(k, []) for k in self.meta.owned]
        self.related: list = [(r.kind, []) for r in self.meta.related_kinds]
        self.context = Context(trigger=Trigger(TriggerKind.DRY_RUN))
        self.logs: list = []  # [(log.Level, str)]

    # The request.

    def primary(self, obj: dict) -> "Harness":
        """The primary object, as a dict."""
        kind = Gvk.of(obj)
        if kind != self.meta.primary_kind:
            raise ValueError(f"the object is a {kind}, but module {self.meta.name} reconciles {self.meta.primary_kind}")
        self.primary_obj = obj
        return self

    def primary_yaml(self, text: str) -> "Harness":
        """The primary object, as one YAML document."""
        docs = yaml_documents(text)
        if len(docs) != 1:
            raise ValueError(f"the primary fixture must be one YAML document, found {len(docs)}")
        return self.primary(docs[0])

    def primary_file(self, path: Union[str, Path]) -> "Harness":
        """The primary object, from a YAML file (``wasmop test --object``)."""
        return self.primary(_read_one(path))

    def observed(self, obj: dict) -> "Harness":
        """An observed owned child or related object, as a dict."""
        kind = Gvk.of(obj)
        related_too = any(k == kind for k, _ in self.related)
        groups = [g for g in self.owned if not related_too or _controlled(obj)] + self.related
        for k, objects in groups:
            if k == kind:
                objects.append(json.dumps(obj))
                return self
        raise ValueError(f"observed {kind} is neither owned nor related by module {self.meta.name}")

    def observed_yaml(self, text: str) -> "Harness":
        """Observed objects, as YAML (several documents allowed)."""
        for doc in yaml_documents(text):
            self.observed(doc)
        return self

    def observed_file(self, path: Union[str, Path]) -> "Harness":
        """Observed objects, from a YAML file (``wasmop test --observed``)."""
        return self.observed_yaml(Path(path).read_text())

    def config(self, config: Any) -> "Harness":
        """The WasmReconciler's config (any JSON value)."""
        self.context.config_json = json.dumps(config)
        return self

    def trigger(self, trigger: Trigger) -> "Harness":
        """Why the reconcile runs (default: dry-run, as in ``wasmop test``)."""
        self.context.trigger = trigger
        return self

    def now_unix_ms(self, now: int) -> "Harness":
        """The time the module sees."""
        self.context.now_unix_ms = now
        return self

    def request(self) -> Request:
        """The request the reconciler will be called with."""
        if self.primary_obj is None:
            raise ValueError("the harness has no primary object: call primary, primary_yaml or primary_file")
        return Request(json.dumps(self.primary_obj), self.owned, self.related, self.context)

    # Running.

    def _capture(self, call):
        log.set_sink(lambda level, message: self.logs.append((level, message)))
        try:
            return call()
        finally:
            log.set_sink(None)

    def reconcile(self) -> Response:
        """Runs reconcile; raises ``Error`` if it fails or asks for a child it may not own."""
        response = self._capture(lambda: self.reconciler.reconcile(self.request()))
        self._check_children(response)
        return response

    def finalize(self) -> Finalized:
        """Runs finalize; raises ``Error`` if it fails or returns children."""
        finalized = self._capture(lambda: self.reconciler.finalize(self.request()))
        if finalized.effects.child_sets:
            raise Error("finalize returned children; only actions, status, Events and requeue are allowed")
        return finalized

    def validate(self, new: dict, old: Optional[dict] = None) -> Validation:
        """Runs validate on the creation of ``new``, or with ``old`` on a change."""
        request = ValidateRequest(
            Operation.CREATE if old is None else Operation.UPDATE,
            None if old is None else json.dumps(old),
            json.dumps(new),
            self.context.config_json,
        )
        return self._capture(lambda: self.reconciler.validate(request))

    def _check_children(self, response: Response) -> None:
        for kind, objects in response.child_sets:
            if kind not in self.meta.owned:
                raise Error(f"a child of kind {kind}, which module {self.meta.name} does not own")
            for o in objects:
                if not (o.get("metadata") or {}).get("name"):
                    raise Error(f"a {kind} child has no metadata.name")
