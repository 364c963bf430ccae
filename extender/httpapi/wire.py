"""Wire types of ``k8s.io/kube-scheduler/extender/v1``: one pydantic model per Go struct
the extender reads. Replies are built directly as dicts or bytes by the routes (hot paths
encode them by hand); ``tests/conformance/gowire.py`` decodes them as the Go side does.

The Go structs carry no json tags, so the JSON keys are the capitalised Go field names
(``Pod``, ``NodeNames``, ``FailedNodes``, ``Host``, ``Score``...). We emit exactly those.
Go's ``encoding/json`` matches keys case-insensitively on input, and so do we
(:class:`GoModel`); ``null`` stands for an absent pointer or map. Embedded Kubernetes
objects (the Pod, Node items, victim Pods) stay plain dicts in their API shape; they are
parsed further by :class:`~extender.kube.pods.PodInfo`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10


_FOLDS: dict[type[BaseModel], dict[str, str]] = {}


def _fold_map(cls: type[BaseModel]) -> dict[str, str]:
    """Lower-cased key -> the key as the Go field is named, per model class."""
    got = _FOLDS.get(cls)
    if got is None:
        got = _FOLDS[cls] = {
            (info.alias or name).lower(): info.alias or name for name, info in cls.model_fields.items()
        }
    return got


class GoModel(BaseModel):
    """A Go struct without json tags: keys are the field names, matched in any case."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _fold_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fold = _fold_map(cls)
        out: dict[str, Any] = {}
        for k, v in data.items():
            canonical = fold.get(k.lower()) if isinstance(k, str) else None
            if canonical is not None:
                out[canonical] = v  # like encoding/json: the last matching key wins
        return out


def _names_as_decoded(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A list of plain strings (what JSON decoding gives) is taken as it is, without a
    per-name pass; anything else gets the full validation and its error messages."""
    if type(value) is list:
        try:
            "".join(value)  # a TypeError unless every item is a string; 4x faster than a type pass
        except TypeError:
            pass
        else:
            return value
    return handler(value)


def _objects_as_decoded(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A list of plain dicts with string keys is taken as it is (Node objects are large;
    validation would copy every one); anything else gets the full validation."""
    if (
        type(value) is list
        and (not value or set(map(type, value)) == {dict})
        and all(type(k) is str for item in value for k in item)
    ):
        return value
    return handler(value)


#: 5,000 node names per request are the common case: see :func:`_names_as_decoded`.
NodeNames = Annotated[list[str], WrapValidator(_names_as_decoded)]
#: Node objects stay plain dicts in their API shape: see :func:`_objects_as_decoded`.
Objects = Annotated[list[dict[str, Any]], WrapValidator(_objects_as_decoded)]


class NodeList(GoModel):
    """core/v1 NodeList (its own json tags are lowerCamel: ``metadata``, ``items``)."""

    metadata: dict[str, Any] | None = None
    items: Objects | None = None


class ExtenderArgs(GoModel):
    """Filter and prioritize request: ``Nodes`` when not nodeCacheCapable, else ``NodeNames``."""

    pod: dict[str, Any] = Field(alias="Pod")
    nodes: NodeList | None = Field(None, alias="Nodes")
    node_names: NodeNames | None = Field(None, alias="NodeNames")


class ExtenderBindingArgs(GoModel):
    pod_name: str = Field(alias="PodName")
    pod_namespace: str = Field("", alias="PodNamespace")
    pod_uid: str = Field("", alias="PodUID")
    node: str = Field(alias="Node")


class MetaPod(GoModel):
    uid: str = Field(alias="UID")


class MetaVictims(GoModel):
    pods: list[MetaPod] | None = Field(None, alias="Pods")
    num_pdb_violations: int = Field(0, alias="NumPDBViolations")


class Victims(GoModel):
    pods: list[dict[str, Any]] | None = Field(None, alias="Pods")
    num_pdb_violations: int = Field(0, alias="NumPDBViolations")


class ExtenderPreemptionArgs(GoModel):
    """``NodeNameToMetaVictims`` when nodeCacheCapable (UIDs), else ``NodeNameToVictims`` (Pods)."""

    pod: dict[str, Any] = Field(alias="Pod")
    node_name_to_victims: dict[str, Victims] | None = Field(None, alias="NodeNameToVictims")
    node_name_to_meta_victims: dict[str, MetaVictims] | None = Field(None, alias="NodeNameToMetaVictims")
