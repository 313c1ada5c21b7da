"""Conversions between the SDK's types and componentize-py's generated bindings.

Imported only inside a component (``wit_world`` exists only there, generated from
``wit/reconciler.wit`` at build time).
"""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta

from componentize_py_types import Err
from wit_world.imports import types as wit

from .errors import Error
from .kinds import AllPrimaries, Gvk, ObjectRef, PrimaryNamedByLabel, SelectorOperator
from .reconciler import Reconciler
from .request import Context, Operation, Request, Trigger, TriggerKind, ValidateRequest
from .response import ActionKind, ConditionStatus, EventType, Propagation, Response, Status

_OPERATORS = {
    SelectorOperator.IN: wit.SelectorOperator.IN,
    SelectorOperator.NOT_IN: wit.SelectorOperator.NOT_IN,
    SelectorOperator.EXISTS: wit.SelectorOperator.EXISTS,
    SelectorOperator.DOES_NOT_EXIST: wit.SelectorOperator.DOES_NOT_EXIST,
}
_PROPAGATIONS = {
    Propagation.BACKGROUND: wit.Propagation.BACKGROUND,
    Propagation.FOREGROUND: wit.Propagation.FOREGROUND,
    Propagation.ORPHAN: wit.Propagation.ORPHAN,
}
_CONDITION_STATUSES = {
    ConditionStatus.TRUE: wit.ConditionStatus.TRUE,
    ConditionStatus.FALSE: wit.ConditionStatus.FALSE,
    ConditionStatus.UNKNOWN: wit.ConditionStatus.UNKNOWN,
}
_TRIGGERS = {
    wit.Trigger_PrimaryChanged: TriggerKind.PRIMARY_CHANGED,
    wit.Trigger_ChildChanged: TriggerKind.CHILD_CHANGED,
    wit.Trigger_RelatedChanged: TriggerKind.RELATED_CHANGED,
    wit.Trigger_Resync: TriggerKind.RESYNC,
    wit.Trigger_Requeue: TriggerKind.REQUEUE,
    wit.Trigger_Retry: TriggerKind.RETRY,
    wit.Trigger_ModuleChanged: TriggerKind.MODULE_CHANGED,
    wit.Trigger_DryRun: TriggerKind.DRY_RUN,
}


def _gvk_to(g: Gvk) -> "wit.Gvk":
    return wit.Gvk(api_version=g.api_version, kind=g.kind)


def _ref_to(r: ObjectRef) -> "wit.ObjectRef":
    return wit.ObjectRef(api_version=r.api_version, kind=r.kind, namespace=r.namespace, name=r.name)


def _ref_from(r: "wit.ObjectRef") -> ObjectRef:
    return ObjectRef(r.api_version, r.kind, r.name, r.namespace)


def metadata_to(r: Reconciler) -> "wit.ModuleMetadata":
    m = r.metadata()
    if m.primary_kind is None:
        raise Error(f"module {m.name}: the metadata names no primary kind")
    related = []
    for rk in m.related_kinds:
        if isinstance(rk.maps_to, AllPrimaries):
            maps_to = wit.RelatedMapping_AllPrimaries()
        elif isinstance(rk.maps_to, PrimaryNamedByLabel):
            maps_to = wit.RelatedMapping_PrimaryNamedByLabel(rk.maps_to.label)
        else:
            maps_to = wit.RelatedMapping_SameName()
        selector = wit.LabelSelector(
            match_labels=list(rk.selector.match_labels),
            match_expressions=[
                wit.SelectorRequirement(key=e.key, operator=_OPERATORS[e.operator], values=list(e.values))
                for e in rk.selector.match_expressions
            ],
        )
        related.append(wit.RelatedKind(kind=_gvk_to(rk.kind), selector=selector, maps_to=maps_to))
    return wit.ModuleMetadata(
        name=m.name,
        version=m.version,
        primary=_gvk_to(m.primary_kind),
        owns=[_gvk_to(k) for k in m.owned],
        related=related,
        finalizes=m.finalizes_,
        validates=m.validates_,
    )


def request_from(r: "wit.ReconcileRequest") -> Request:
    c = r.context
    obj = getattr(c.trigger, "value", None)
    trigger = Trigger(_TRIGGERS[type(c.trigger)], _ref_from(obj) if obj is not None else None)
    return Request(
        primary=r.primary,
        owned=[(Gvk(g.kind.api_version, g.kind.kind), list(g.objects)) for g in r.owned],
        related=[(Gvk(g.kind.api_version, g.kind.kind), list(g.objects)) for g in r.related],
        context=Context(c.reconciler, trigger, c.attempt, c.config, c.now_unix_ms),
    )


def _ms(d: timedelta | None) -> int | None:
    return None if d is None else max(0, int(d.total_seconds() * 1000))


def _actions_to(response: Response) -> list:
    out = []
    for a in response.actions:
        target = _ref_to(a.target)
        if a.kind is ActionKind.MERGE_PATCH:
            out.append(wit.Action_MergePatch(wit.Patch(target=target, body=json.dumps(a.patch))))
        elif a.kind is ActionKind.JSON_PATCH:
            out.append(wit.Action_JsonPatch(wit.Patch(target=target, body=json.dumps(a.patch))))
        else:
            out.append(wit.Action_Delete(wit.DeleteIntent(target=target, propagation=_PROPAGATIONS[a.propagation])))
    return out


def _status_to(s: Status | None) -> "wit.Status | None":
    if s is None:
        return None
    return wit.Status(
        fields=json.dumps(s.fields),
        conditions=[
            wit.Condition(type=c.type, status=_CONDITION_STATUSES[c.status], reason=c.reason, message=c.message)
            for c in s.conditions
        ],
    )


def _events_to(response: Response) -> list:
    return [
        wit.Event(
            type=wit.EventType.NORMAL if e.type is EventType.NORMAL else wit.EventType.WARNING,
            reason=e.reason,
            message=e.message,
            action=e.action,
            regarding=None if e.regarding is None else _ref_to(e.regarding),
        )
        for e in response.events
    ]


def response_to(response: Response) -> "wit.ReconcileResponse":
    return wit.ReconcileResponse(
        children=[
            wit.ChildSet(kind=_gvk_to(k), objects=[json.dumps(o) for o in objs]) for k, objs in response.child_sets
        ],
        actions=_actions_to(response),
        status=_status_to(response.status),
        events=_events_to(response),
        requeue_after_ms=_ms(response.requeue),
    )


def _failure(e: BaseException) -> Err:
    """The reconcile-error for ``e``: an ``Error``'s message; any other exception by its type and
    where it was raised, not its text, which often carries values (a Secret's data in a
    ``ValueError``) and would reach Events and logs."""
    message = e.message if isinstance(e, Error) else _described(e)
    return Err(wit.ReconcileError(message=message))


def _described(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return (
        f"{type(e).__name__}{where} (its text is not shown, it may carry values: "
        "raise wasmop_sdk.Error to say more)"
    )


def export(reconciler: type) -> type:
    """The class componentize-py looks for (``Guest``) for this ``Reconciler`` subclass."""
    from wit_world.exports import Guest

    instance = reconciler()

    class Exported(Guest):
        def metadata(self):
            return metadata_to(instance)

        def reconcile(self, request):
            try:
                return response_to(instance.reconcile(request_from(request)))
            except Exception as e:  # a module's failure becomes reconcile-error, not a trap
                raise _failure(e) from None

        def finalize(self, request):
            try:
                f = instance.finalize(request_from(request))
                r = f.effects
                if r.child_sets:
                    raise Error("finalize returned children; only actions, status, Events and requeue are allowed")
                return wit.FinalizeResponse(
                    done=f.done,
                    actions=_actions_to(r),
                    status=_status_to(r.status),
                    events=_events_to(r),
                    requeue_after_ms=_ms(r.requeue),
                )
            except Exception as e:
                raise _failure(e) from None

        def validate(self, request):
            req = ValidateRequest(
                Operation.CREATE if request.operation == wit.Operation.CREATE else Operation.UPDATE,
                request.old,
                request.new,
                request.config,
            )
            v = instance.validate(req)
            if v.allowed:
                return wit.ValidateResponse_Allowed(list(v.warnings))
            return wit.ValidateResponse_Denied(wit.Denial(message=v.message, field=v.field))

    Exported.__name__ = "Guest"
    return Exported
