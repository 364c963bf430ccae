"""What a pod spec asks of its node: node selector, node affinity, tolerations, requests.

Read from a Pod, a Kueue Workload's pod template or a PodGroup member, into the pure core's
:class:`~extender.placement.request.PodNeeds`, which the filters of
:mod:`extender.placement.feasibility` judge. The rules follow upstream:

- requests: k8s.io/component-helpers/resource ``PodRequests``: the containers' requests
  summed; each init container's at most (a restartable one, a sidecar, adds to the
  containers it runs beside); the pod's ``overhead`` added; pod-level ``spec.resources``
  (PodLevelResources) wins where it sets cpu or memory. A container's limit stands in for
  a missing request, as the API server defaults a Pod's requests from its limits (and Kueue
  does for pod templates, ``UseLimitsAsMissingRequestsInPod``);
- QoS: pkg/apis/core/helper/qos ``GetPodQOS``: Guaranteed when every container sets cpu and
  memory limits and its requests equal them.

A value that cannot be read raises :class:`NeedsError` naming the field
(``spec.tolerations[0].operator``).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from extender.placement import quantities
from extender.placement.request import (
    NodeRequirement,
    NodeTerm,
    PodNeeds,
    PodRequests,
    PreferredTerm,
    Toleration,
)

#: The resources NodeResourcesFit counts besides extended ones, as named in a pod spec.
_COUNTED = ("cpu", "memory", "ephemeral-storage")


class NeedsError(ValueError):
    """A pod spec field gangslice cannot read; the message names the field."""


def pod_needs(spec: Mapping[str, Any], where: str = "spec") -> PodNeeds:
    """Everything ``spec`` (a PodSpec) asks of a node. Raises :class:`NeedsError`."""
    return PodNeeds(
        node_selector=_node_selector(spec.get("nodeSelector"), f"{where}.nodeSelector"),
        affinity=_required_terms(spec, where),
        preferred=_preferred_terms(spec, where),
        tolerations=tolerations(spec.get("tolerations"), f"{where}.tolerations"),
        requests=pod_requests(spec, where),
    )


def _node_selector(raw: Any, where: str) -> tuple[NodeRequirement, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise NeedsError(f"{where}: expected a map of label to value")
    out = []
    for k, v in sorted(raw.items()):
        if not isinstance(v, str):
            raise NeedsError(f"{where}[{k}]: {v!r} is not a string")
        out.append(NodeRequirement(str(k), "In", (v,)))
    return tuple(out)


def _node_affinity(spec: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    affinity = spec.get("affinity")
    if affinity is None:
        return {}
    if not isinstance(affinity, Mapping):
        raise NeedsError(f"{where}.affinity: expected an object")
    got = affinity.get("nodeAffinity")
    if got is None:
        return {}
    if not isinstance(got, Mapping):
        raise NeedsError(f"{where}.affinity.nodeAffinity: expected an object")
    return got


def _required_terms(spec: Mapping[str, Any], where: str) -> tuple[NodeTerm, ...]:
    at = f"{where}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _node_affinity(spec, where).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return ()
    if not isinstance(required, Mapping):
        raise NeedsError(f"{at}: expected an object")
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        raise NeedsError(f"{at}.nodeSelectorTerms: must hold at least one term")
    return tuple(_term(t, f"{at}.nodeSelectorTerms[{i}]") for i, t in enumerate(terms))


def _preferred_terms(spec: Mapping[str, Any], where: str) -> tuple[PreferredTerm, ...]:
    at = f"{where}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    raw = _node_affinity(spec, where).get("preferredDuringSchedulingIgnoredDuringExecution")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise NeedsError(f"{at}: expected a list")
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, Mapping):
            raise NeedsError(f"{at}[{i}]: expected an object")
        weight = p.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise NeedsError(f"{at}[{i}].weight: {weight!r} is not a number from 1 to 100")
        try:
            out.append(PreferredTerm(weight, _term(p.get("preference"), f"{at}[{i}].preference")))
        except ValueError as exc:
            if isinstance(exc, NeedsError):
                raise
            raise NeedsError(f"{at}[{i}].weight: {exc}") from None
    return tuple(out)


def _term(raw: Any, where: str) -> NodeTerm:
    if not isinstance(raw, Mapping):
        raise NeedsError(f"{where}: expected an object")
    parts: dict[str, tuple[NodeRequirement, ...]] = {}
    for field in ("matchExpressions", "matchFields"):
        reqs = raw.get(field) or []
        if not isinstance(reqs, list):
            raise NeedsError(f"{where}.{field}: expected a list")
        parts[field] = tuple(_requirement(r, f"{where}.{field}[{i}]") for i, r in enumerate(reqs))
    try:
        return NodeTerm(parts["matchExpressions"], parts["matchFields"])
    except ValueError as exc:
        raise NeedsError(f"{where}.matchFields: {exc}") from None


def _requirement(raw: Any, where: str) -> NodeRequirement:
    if not isinstance(raw, Mapping):
        raise NeedsError(f"{where}: expected an object")
    key, op, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
    if not isinstance(key, str) or not key:
        raise NeedsError(f"{where}.key: {key!r} is not a label key")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise NeedsError(f"{where}.values: expected a list of strings")
    try:
        return NodeRequirement(key, str(op), tuple(values))
    except ValueError as exc:
        raise NeedsError(f"{where}: {exc}") from None


def tolerations(raw: Any, where: str) -> tuple[Toleration, ...]:
    """A ``tolerations`` list (a pod's, or a Kueue ResourceFlavor's ``spec.tolerations``)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise NeedsError(f"{where}: expected a list")
    out = []
    for i, t in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(t, Mapping):
            raise NeedsError(f"{at}: expected an object")
        fields = {f: t.get(f) or "" for f in ("key", "operator", "value", "effect")}
        for f, v in fields.items():
            if not isinstance(v, str):
                raise NeedsError(f"{at}.{f}: {v!r} is not a string")
        # The API server defaults an empty operator to Equal.
        op = fields["operator"] or "Equal"
        try:
            out.append(Toleration(fields["key"], op, fields["value"], fields["effect"]))
        except ValueError as exc:
            field = "effect" if "effect" in str(exc) else "operator" if "operator" in str(exc) else "key"
            raise NeedsError(f"{at}.{field}: {exc}") from None
    return tuple(out)


# -- requests ---------------------------------------------------------------------------


Amounts = dict[str, Fraction]


def _amounts(raw: Any, where: str) -> Amounts:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise NeedsError(f"{where}: expected a map of resource to quantity")
    out: Amounts = {}
    for name in _COUNTED:
        if name in raw:
            try:
                value = quantities.parse(raw[name])
            except quantities.QuantityError as exc:
                raise NeedsError(f"{where}[{name}]: {exc}") from None
            if value < 0:
                raise NeedsError(f"{where}[{name}]: {raw[name]!r} is negative")
            out[name] = value
    return out


def _container(c: Any, where: str) -> tuple[Amounts, Amounts]:
    """(requests with limits standing in for missing ones, limits) of one container."""
    resources = c.get("resources") if isinstance(c, Mapping) else None
    if resources is None:
        return {}, {}
    if not isinstance(resources, Mapping):
        raise NeedsError(f"{where}.resources: expected an object")
    limits = _amounts(resources.get("limits"), f"{where}.resources.limits")
    requests = _amounts(resources.get("requests"), f"{where}.resources.requests")
    return {**limits, **requests}, limits


def _add(a: Amounts, b: Amounts) -> Amounts:
    return {k: a.get(k, Fraction(0)) + b.get(k, Fraction(0)) for k in {*a, *b}}


def _max(a: Amounts, b: Amounts) -> Amounts:
    return {k: max(a.get(k, Fraction(0)), b.get(k, Fraction(0))) for k in {*a, *b}}


def _named(c: Any, kind: str, i: int) -> str:
    name = c.get("name") if isinstance(c, Mapping) else None
    return f"{kind}[{name if isinstance(name, str) and name else i}]"


def pod_requests(spec: Mapping[str, Any], where: str = "spec") -> PodRequests:
    """What the pod requests of a node (NodeResourcesFit's count), and its QoS."""
    containers = spec.get("containers") or []
    inits = spec.get("initContainers") or []
    if not isinstance(containers, list) or not isinstance(inits, list):
        raise NeedsError(f"{where}: containers and initContainers must be lists")
    total: Amounts = {}
    guaranteed = bool(containers)
    for i, c in enumerate(containers):
        req, lim = _container(c, f"{where}.{_named(c, 'containers', i)}")
        total = _add(total, req)
        guaranteed &= _guaranteed(req, lim)
    sidecars: Amounts = {}
    init_peak: Amounts = {}
    for i, c in enumerate(inits):
        req, lim = _container(c, f"{where}.{_named(c, 'initContainers', i)}")
        guaranteed &= _guaranteed(req, lim)
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            total = _add(total, req)
            sidecars = _add(sidecars, req)
            req = sidecars
        else:
            req = _add(req, sidecars)
        init_peak = _max(init_peak, req)
    total = _max(total, init_peak)
    pod_level = spec.get("resources")
    if isinstance(pod_level, Mapping):
        lim = _amounts(pod_level.get("limits"), f"{where}.resources.limits")
        req = {**lim, **_amounts(pod_level.get("requests"), f"{where}.resources.requests")}
        for name in ("cpu", "memory"):
            if name in req:
                total[name] = req[name]
        if "cpu" in lim or "memory" in lim:
            guaranteed = _guaranteed(req, lim)
    total = _add(total, _amounts(spec.get("overhead"), f"{where}.overhead"))
    return PodRequests(
        cpu_millis=quantities.milli(total.get("cpu", 0)),
        memory_bytes=quantities.whole(total.get("memory", 0)),
        ephemeral_bytes=quantities.whole(total.get("ephemeral-storage", 0)),
        guaranteed=guaranteed,
    )


def _guaranteed(requests: Amounts, limits: Amounts) -> bool:
    return all(r in limits and requests.get(r) == limits[r] for r in ("cpu", "memory"))
