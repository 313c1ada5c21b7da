"""Kinds, references and what a module says about itself (``Metadata``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping as TMapping, Optional, Union


@dataclass(frozen=True)
class Gvk:
    """A group/version/kind, as in an object's ``apiVersion`` and ``kind``."""

    api_version: str
    kind: str

    @staticmethod
    def of(obj: TMapping) -> "Gvk":
        """The kind of a Kubernetes object given as a dict.

        Raises ``ValueError`` if it has no ``apiVersion`` or ``kind``.
        """
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str) or not api_version or not kind:
            raise ValueError("an object has no apiVersion or kind")
        return Gvk(api_version, kind)

    def __str__(self) -> str:
        return f"{self.api_version}/{self.kind}"


@dataclass(frozen=True)
class ObjectRef:
    """A reference to one object. ``namespace`` is None for cluster-scoped objects (and, for a
    namespaced target of an intent, means the primary's namespace)."""

    api_version: str
    kind: str
    name: str
    namespace: Optional[str] = None

    @staticmethod
    def new(gvk: Gvk, name: str, namespace: Optional[str] = None) -> "ObjectRef":
        """A reference to the object ``name`` of kind ``gvk``."""
        return ObjectRef(gvk.api_version, gvk.kind, name, namespace)

    @staticmethod
    def from_object(obj: TMapping) -> "ObjectRef":
        """A reference to an object given as a dict (kind, name and namespace)."""
        gvk = Gvk.of(obj)
        meta = obj.get("metadata") or {}
        return ObjectRef(gvk.api_version, gvk.kind, str(meta.get("name", "")), meta.get("namespace"))

    def in_namespace(self, namespace: str) -> "ObjectRef":
        """The same reference in ``namespace``."""
        return ObjectRef(self.api_version, self.kind, self.name, namespace)

    def gvk(self) -> Gvk:
        """The referenced kind."""
        return Gvk(self.api_version, self.kind)


class SelectorOperator(Enum):
    """A label-selector operator."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True)
class SelectorRequirement:
    """``key in (a, b)``, ``key exists``, ..."""

    key: str
    operator: SelectorOperator
    values: tuple = ()


@dataclass(frozen=True)
class Selector:
    """A Kubernetes label selector. Empty selects everything."""

    match_labels: tuple = ()
    match_expressions: tuple = ()

    @staticmethod
    def everything() -> "Selector":
        """Selects every object."""
        return Selector()

    def label(self, key: str, value: str) -> "Selector":
        """Also requires ``key=value``."""
        return Selector(self.match_labels + ((key, value),), self.match_expressions)

    def requirement(self, key: str, operator: SelectorOperator, values: Iterable[str] = ()) -> "Selector":
        """Also requires an expression."""
        req = SelectorRequirement(key, operator, tuple(values))
        return Selector(self.match_labels, self.match_expressions + (req,))

    def matches(self, labels: TMapping[str, str]) -> bool:
        """Whether objects with these labels are selected."""
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for e in self.match_expressions:
            present = e.key in labels
            if e.operator is SelectorOperator.IN and not (present and labels[e.key] in e.values):
                return False
            if e.operator is SelectorOperator.NOT_IN and present and labels[e.key] in e.values:
                return False
            if e.operator is SelectorOperator.EXISTS and not present:
                return False
            if e.operator is SelectorOperator.DOES_NOT_EXIST and present:
                return False
        return True


class AllPrimaries:
    """An event on a related object re-reconciles every primary."""

    def __repr__(self) -> str:
        return "Mapping.ALL_PRIMARIES"


@dataclass(frozen=True)
class PrimaryNamedByLabel:
    """An event on a related object re-reconciles the primary named by this label's value."""

    label: str


class SameName:
    """An event on a related object re-reconciles the primary with its namespace and name."""

    def __repr__(self) -> str:
        return "Mapping.SAME_NAME"


class Mapping:
    """Which primaries an event on a related object re-reconciles."""

    ALL_PRIMARIES = AllPrimaries()
    SAME_NAME = SameName()

    @staticmethod
    def primary_named_by_label(label: str) -> PrimaryNamedByLabel:
        """The primary named by the value of ``label`` on the related object."""
        return PrimaryNamedByLabel(label)


MappingValue = Union[AllPrimaries, PrimaryNamedByLabel, SameName]


@dataclass(frozen=True)
class RelatedKind:
    """A kind the module reads but does not own, and how its objects map to primaries."""

    kind: Gvk
    selector: Selector = Selector()
    maps_to: MappingValue = Mapping.ALL_PRIMARIES

    def with_selector(self, selector: Selector) -> "RelatedKind":
        """Only objects matching ``selector`` are watched and handed over."""
        return RelatedKind(self.kind, selector, self.maps_to)

    def mapped(self, mapping: MappingValue) -> "RelatedKind":
        """Which primaries an event re-reconciles."""
        return RelatedKind(self.kind, self.selector, mapping)


@dataclass
class Metadata:
    """What a module says about itself: name, version, primary, owned and related kinds.

    Build it by chaining: ``Metadata("tenants", "0.1.0").primary(TENANT).owns(k8s.NAMESPACE)``.
    """

    name: str
    version: str
    primary_kind: Optional[Gvk] = None
    owned: list = field(default_factory=list)
    related_kinds: list = field(default_factory=list)
    finalizes_: bool = False
    validates_: bool = False

    def primary(self, kind: Gvk) -> "Metadata":
        """The kind this module reconciles."""
        self.primary_kind = kind
        return self

    def owns(self, *kinds: Gvk) -> "Metadata":
        """Kinds whose objects the module creates and owns (the host prunes them)."""
        for k in kinds:
            if k not in self.owned:
                self.owned.append(k)
        return self

    def related(self, related: RelatedKind) -> "Metadata":
        """A kind the module reads and reacts to."""
        self.related_kinds.append(related)
        return self

    def finalizes(self) -> "Metadata":
        """``finalize`` does work: the host keeps a finalizer on every primary."""
        self.finalizes_ = True
        return self

    def validates(self) -> "Metadata":
        """``validate`` does work: the host can serve it at admission."""
        self.validates_ = True
        return self
