"""Decoding replies the way the Go side does, for the conformance tests.

``encoding/json`` matches an object key to a struct field by exact name first and then
case-insensitively (the last matching key wins), ignores unknown keys, turns ``null`` into
the zero value (nil for pointers, maps and slices), and refuses a value of the wrong JSON
type (a string for an int64, ``10.5`` for an int64, ...). This module does the same for the
few struct shapes the extender protocols use, and then applies what kube-scheduler and
Volcano do with the decoded result (``pkg/scheduler/extender.go`` and
``pkg/scheduler/plugins/extender/extender.go``, as summarised in the reference notes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class GoDecodeError(ValueError):
    pass


Decoder = Callable[[Any], Any]


def string(v: Any) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise GoDecodeError(f"cannot unmarshal {type(v).__name__} into string")
    return v


def int64(v: Any) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise GoDecodeError(f"cannot unmarshal {v!r} into int64")
    return v


def float64(v: Any) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise GoDecodeError(f"cannot unmarshal {v!r} into float64")
    return float(v)


def pointer(inner: Decoder) -> Decoder:
    return lambda v: None if v is None else inner(v)


def slice_of(inner: Decoder) -> Decoder:
    def decode(v: Any) -> list[Any] | None:
        if v is None:
            return None
        if not isinstance(v, list):
            raise GoDecodeError(f"cannot unmarshal {type(v).__name__} into a slice")
        return [inner(x) for x in v]

    return decode


def map_of(inner: Decoder) -> Decoder:
    def decode(v: Any) -> dict[str, Any] | None:
        if v is None:
            return None
        if not isinstance(v, dict):
            raise GoDecodeError(f"cannot unmarshal {type(v).__name__} into a map")
        return {k: inner(x) for k, x in v.items()}

    return decode


def raw_object(v: Any) -> Any:
    if v is not None and not isinstance(v, dict):
        raise GoDecodeError(f"cannot unmarshal {type(v).__name__} into a struct")
    return v


def struct(fields: Mapping[str, Decoder]) -> Decoder:
    """A Go struct whose JSON keys are ``fields`` (Go names or json tags)."""

    def decode(v: Any) -> dict[str, Any]:
        if v is None:
            return {name: dec(None) for name, dec in fields.items()}
        if not isinstance(v, dict):
            raise GoDecodeError(f"cannot unmarshal {type(v).__name__} into a struct")
        out = {name: dec(None) for name, dec in fields.items()}
        for key, value in v.items():
            match = key if key in fields else next((f for f in fields if f.lower() == key.lower()), None)
            if match is not None:
                out[match] = fields[match](value)
        return out

    return decode


# k8s.io/kube-scheduler/extender/v1
NODE_LIST = struct({"metadata": raw_object, "items": slice_of(raw_object)})
FILTER_RESULT = struct(
    {
        "Nodes": pointer(NODE_LIST),
        "NodeNames": pointer(slice_of(string)),
        "FailedNodes": map_of(string),
        "FailedAndUnresolvableNodes": map_of(string),
        "Error": string,
    }
)
HOST_PRIORITY_LIST = slice_of(struct({"Host": string, "Score": int64}))
BINDING_RESULT = struct({"Error": string})
META_VICTIMS = struct({"Pods": slice_of(pointer(struct({"UID": string}))), "NumPDBViolations": int64})
PREEMPTION_RESULT = struct({"NodeNameToMetaVictims": map_of(pointer(META_VICTIMS))})

# volcano pkg/scheduler/plugins/extender/argument.go
PREDICATE_RESPONSE = struct({"status": string, "code": int64})
PRIORITIZE_RESPONSE = struct({"nodeScore": map_of(float64), "errorMessage": string})
JOB_ENQUEUEABLE_RESPONSE = struct({"status": int64})
EVENT_HANDLER_RESPONSE = struct({"errorMessage": string})


class SchedulerError(Exception):
    """What kube-scheduler would report as the extender's error."""


def scheduler_filter(reply: Any, input_names: list[str], node_cache_capable: bool) -> list[str]:
    """The feasible nodes kube-scheduler takes from a filter reply (HTTPExtender.Filter)."""
    result = FILTER_RESULT(reply)
    if result["Error"]:
        raise SchedulerError(result["Error"])
    if node_cache_capable and result["NodeNames"] is not None:
        known = set(input_names)
        for name in result["NodeNames"]:
            if name not in known:
                raise SchedulerError(
                    f"extender claims a filtered node {name} not found in the input node list"
                )
        return list(result["NodeNames"])
    if result["Nodes"] is not None:
        return [item["metadata"]["name"] for item in result["Nodes"]["items"] or []]
    return []


def scheduler_scores(reply: Any, input_names: list[str], weight: int) -> dict[str, int]:
    """What an extender adds to each node's score (prioritizeNodes): Score x weight x 10."""
    out = dict.fromkeys(input_names, 0)
    for hp in HOST_PRIORITY_LIST(reply) or []:
        if hp["Host"] in out:
            out[hp["Host"]] += hp["Score"] * weight * 10
    return out
