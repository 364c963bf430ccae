"""The in-memory :class:`~extender.kube.api.KubeClient` of every unit test (and the
benchmarks): objects with resource versions, watch streams with a compactable history (to
provoke ``410 Gone``), injected failures, and a record of every call with the module that
made it, so a test can prove which code writes an object.

What it emulates of the API server, because the code relies on it:

- server-side apply: the fields in the body are set, list-map entries (``conditions`` by
  ``type``, ``admissionChecks`` by ``name``, ``metadata.ownerReferences`` by ``uid``) merge
  by key, and what an earlier apply set but
  this one leaves out is removed (one field manager: ours); other writers' entries stay;
  an apply of the main resource creates a missing object; a stale ``resourceVersion`` in the
  body is a 409;
- the status subresource: ``status`` is ignored on create, replace and apply of the main
  resource of a kind that has one, and only ``status`` is taken from an apply to it;
- ``pods/binding``: sets ``spec.nodeName`` and copies the Binding's ``metadata.annotations``
  onto the pod in the same write (as the API server's BindingREST does); 409 when the pod is
  bound already or its UID differs;
- ``generateName``; ``replace`` guarded by ``metadata.resourceVersion``;
- ``pods/eviction`` (:meth:`FakeKube.evict`, recorded as ``create pods/eviction``): deletes
  the pod, or 429 while a test says its PodDisruptionBudget allows no disruption
  (:attr:`FakeKube.budget_blocks`); 409 when the UID differs.
"""

from __future__ import annotations

import asyncio
import copy
import sys
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.kube import api as kube_api
from extender.kube.api import (
    Conflict,
    Gone,
    Kind,
    KubeError,
    Listing,
    NotFound,
    Resource,
    Throttled,
    WatchEvent,
    name_of,
    namespace_of,
)


def _plural(res: Resource) -> str:
    """What the fake files ``res`` under: its plural, qualified by its group where two groups
    share it (Volcano's and the Workload API's ``podgroups``)."""
    return f"{res.plural}.{res.group}" if res in _QUALIFIED else res.plural


_QUALIFIED = frozenset({kube_api.WORKLOAD_POD_GROUPS})
_BY_PLURAL = {
    _plural(r): r
    for r in (
        kube_api.NODES,
        kube_api.PODS,
        kube_api.EVENTS,
        kube_api.LEASES,
        kube_api.NODE_TOPOLOGIES,
        kube_api.SLICE_RESERVATIONS,
        kube_api.WORKLOADS,
        kube_api.ADMISSION_CHECKS,
        kube_api.RESOURCE_FLAVORS,
        kube_api.PODGROUPS,
        kube_api.WORKLOAD_POD_GROUPS,
        kube_api.RESOURCE_SLICES,
        kube_api.DEVICE_CLASSES,
        kube_api.RESOURCE_CLAIMS,
        kube_api.RESOURCE_CLAIM_TEMPLATES,
        kube_api.COMPUTE_DOMAINS,
    )
}
#: Kinds with a status subresource (PodGroup has none).
_HAS_STATUS = {
    "slicereservations",
    "nodetopologies",
    "workloads",
    "admissionchecks",
    "pods",
    "nodes",
    "resourceclaims",
}
#: List fields that server-side apply merges by a key (``+listType=map``).
_LIST_MAPS = {"conditions": "type", "admissionChecks": "name"}
_WRITES = {"create", "replace", "patch", "apply", "delete"}

_Key = tuple[str, str, str]  # (plural, namespace, name)
_Entries = list[Any]
Ref = Resource | Kind | str


def resource(ref: Ref) -> Resource:
    if isinstance(ref, Resource):
        return ref
    if isinstance(ref, Kind):
        return ref.resource
    return _BY_PLURAL[ref]


@dataclass(frozen=True, slots=True)
class Call:
    """One call: ``verb`` (get, list, watch, create, replace, patch, apply, delete, serves),
    what it addressed, and ``caller``, the module (outside this one) that made it."""

    verb: str
    plural: str
    namespace: str
    name: str
    subresource: str
    caller: str

    @property
    def write(self) -> bool:
        return self.verb in _WRITES

    @property
    def label(self) -> str:
        """``"<verb> <plural>[/<subresource>]"``, as :meth:`FakeKube.fail_next` takes it."""
        return f"{self.verb} {self.plural}" + (f"/{self.subresource}" if self.subresource else "")


#: Modules a call passes through on its way in (the fault injector wraps this fake).
_TRANSPARENT = {__name__, "contextlib", "extender.testing.faults"}


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module not in _TRANSPARENT and not module.startswith("asyncio"):
            return module
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class FakeKube:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rv = 0
        self._objects: dict[_Key, dict[str, Any]] = {}
        #: What our applies set, per object: top-level field -> value, for removal on the next.
        self._applied: dict[tuple[_Key, str], dict[str, Any]] = {}
        self._history: list[tuple[int, str, WatchEvent]] = []
        self._compacted = 0
        self._failures: dict[str, list[BaseException]] = {}
        self._names = 0
        self.calls: list[Call] = []
        #: Every server-side apply body, as (plural, namespace, name, body).
        self.applies: list[tuple[str, str, str, dict[str, Any]]] = []
        #: Every Event created (with its namespace).
        self.events: list[dict[str, Any]] = []
        #: API groups this fake does not serve (a cluster without Kueue or Volcano).
        self.unserved: set[str] = set()
        #: Pods (``namespace/name``) whose PodDisruptionBudget allows no eviction now.
        self.budget_blocks: set[str] = set()
        self.closed = False

    # -- test controls -------------------------------------------------------------------
    def put(self, ref: Ref, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object as another client would (Kueue, the kubelet); returns it."""
        res = resource(ref)
        with self._lock:
            stored = copy.deepcopy(dict(obj))
            meta = stored.setdefault("metadata", {})
            if res.namespaced:
                meta.setdefault("namespace", "default")
            key = self._key(res, meta.get("namespace", ""), meta["name"])
            self._store(key, stored, "MODIFIED" if key in self._objects else "ADDED")
            return copy.deepcopy(stored)

    def peek(self, ref: Ref, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """The stored object (a copy), or None; records no call."""
        with self._lock:
            got = self._objects.get(self._key(resource(ref), namespace, name))
            return copy.deepcopy(got) if got is not None else None

    def objects(self, ref: Ref) -> list[dict[str, Any]]:
        plural = _plural(resource(ref))
        with self._lock:
            return [copy.deepcopy(o) for (p, _, _), o in sorted(self._objects.items()) if p == plural]

    def remove(self, ref: Ref, name: str, namespace: str = "default") -> None:
        """Delete an object as another client would (DELETED event); NotFound when absent."""
        with self._lock:
            self._remove(self._key(resource(ref), namespace, name))

    def compact(self) -> None:
        """Forget the event history: every watch from before now gets 410 Gone."""
        with self._lock:
            self._rv += 1
            self._compacted = self._rv
            self._history.clear()

    def fail_next(self, call: str, error: BaseException) -> None:
        """Make the next call matching ``call`` raise ``error``: a verb (``"create"``), or a
        :attr:`Call.label` (``"apply slicereservations"`` for the object,
        ``"apply workloads/status"``, ``"create pods/binding"``)."""
        with self._lock:
            self._failures.setdefault(call, []).append(error)

    def close(self) -> None:
        """End every watch."""
        self.closed = True

    def writes(self, ref: Ref | None = None) -> list[Call]:
        plural = _plural(resource(ref)) if ref is not None else None
        return [c for c in self.calls if c.write and (plural is None or c.plural == plural)]

    def labels(self) -> list[str]:
        return [c.label for c in self.calls]

    def applies_to(self, ref: Ref) -> list[dict[str, Any]]:
        plural = _plural(resource(ref))
        return [body for p, _, _, body in self.applies if p == plural]

    # -- KubeClient ----------------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str = "") -> dict[str, Any]:
        with self._lock:
            self._enter("get", res, namespace, name)
            return copy.deepcopy(self._require(self._key(res, namespace, name)))

    async def list(self, res: Resource, namespace: str = "") -> Listing:
        with self._lock:
            self._enter("list", res, namespace)
            self._served(res)
            items = [
                copy.deepcopy(o)
                for (p, ns, _), o in sorted(self._objects.items())
                if p == _plural(res) and (not namespace or not res.namespaced or ns == namespace)
            ]
            return Listing(items, str(self._rv))

    async def watch(
        self, res: Resource, resource_version: str, timeout_s: float
    ) -> AsyncIterator[WatchEvent]:
        with self._lock:
            self._enter("watch", res)
            self._served(res)
        since = int(resource_version or 0)
        waited = 0.0
        while True:
            with self._lock:
                if since < self._compacted:
                    raise Gone(410, f"too old resource version: {since} ({self._compacted})")
                ready = [ev for rv, p, ev in self._history if p == _plural(res) and rv > since]
            if not ready:
                if self.closed or waited >= timeout_s:
                    return
                await asyncio.sleep(0.01)
                waited += 0.01
                continue
            for ev in ready:
                since = int(ev.resource_version or since)
                yield WatchEvent(ev.type, copy.deepcopy(ev.obj))

    async def create(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> dict[str, Any]:
        with self._lock:
            ns = namespace_of(obj) if res.namespaced else ""
            if subresource == "binding" and res.plural == "pods":
                self._enter("create", res, ns, name_of(obj), subresource)
                return self._bind(ns, obj)
            body = copy.deepcopy(dict(obj))
            meta = body.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                self._names += 1
                meta["name"] = f"{meta['generateName']}{self._names:05d}"
            self._enter("create", res, ns, str(meta.get("name", "")), subresource)
            if res.plural == "events":
                self.events.append({**copy.deepcopy(body), "namespace": ns})
            key = self._key(res, ns, str(meta["name"]))
            if key in self._objects:
                raise Conflict(409, f"{_plural(res)} {ns}/{meta['name']} already exists")
            if res.plural in _HAS_STATUS:
                body.pop("status", None)
            meta.setdefault("uid", f"uid-{_plural(res)}-{ns}-{meta['name']}")
            self._store(key, body, "ADDED")
            return copy.deepcopy(body)

    async def replace(self, res: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            ns, name = (namespace_of(obj) if res.namespaced else ""), name_of(obj)
            self._enter("replace", res, ns, name)
            key = self._key(res, ns, name)
            current = self._require(key)
            self._check_version(current, obj)
            body = copy.deepcopy(dict(obj))
            if res.plural in _HAS_STATUS and "status" in current:
                body["status"] = copy.deepcopy(current["status"])
            self._store(key, body, "MODIFIED")
            return copy.deepcopy(body)

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str = "",
        subresource: str = "",
        patch_type: str = kube_api.MERGE_PATCH,
    ) -> dict[str, Any]:
        with self._lock:
            ns = namespace if res.namespaced else ""
            self._enter("patch", res, ns, name, subresource)
            key = self._key(res, ns, name)
            current = copy.deepcopy(self._require(key))
            if patch_type == kube_api.JSON_PATCH:
                for op in body:
                    if op.get("op") not in ("add", "replace") or op["path"].count("/") != 1:
                        raise KubeError(422, f"unsupported JSON patch op {op!r}")
                    current[op["path"][1:]] = copy.deepcopy(op["value"])
            else:
                _merge(current, body)
            self._store(key, current, "MODIFIED")
            return copy.deepcopy(current)

    async def apply(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> dict[str, Any]:
        with self._lock:
            ns, name = (namespace_of(obj) if res.namespaced else ""), name_of(obj)
            self._enter("apply", res, ns, name, subresource)
            if not isinstance(obj.get("apiVersion"), str) or not isinstance(obj.get("kind"), str):
                raise KubeError(400, "apply body needs apiVersion and kind")
            key = self._key(res, ns, name)
            existing = self._objects.get(key)
            if existing is None and subresource:
                raise NotFound(404, f"{_plural(res)} {ns}/{name} not found")
            current = copy.deepcopy(existing) if existing is not None else {}
            if existing is not None:
                self._check_version(existing, obj)
            self.applies.append((_plural(res), ns, name, copy.deepcopy(dict(obj))))
            if subresource == "status":
                parts = ["status"]
            else:
                parts = [k for k in obj if k not in ("apiVersion", "kind", "metadata", "status")]
                if res.plural not in _HAS_STATUS and "status" in obj:
                    parts.append("status")
                current["apiVersion"], current["kind"] = obj["apiVersion"], obj["kind"]
                meta = current.setdefault("metadata", {})
                for field, value in (obj.get("metadata") or {}).items():
                    if field in ("labels", "annotations") and isinstance(value, Mapping):
                        meta.setdefault(field, {}).update(copy.deepcopy(dict(value)))
                    elif field == "ownerReferences" and isinstance(value, list):
                        meta[field] = self._owner_refs(key, meta.get(field) or [], value)
                    elif field != "resourceVersion":
                        meta[field] = copy.deepcopy(value)
                meta.setdefault("uid", f"uid-{_plural(res)}-{ns}-{name}")
                meta.setdefault("generation", 1)
            for part in parts:
                self._apply_part(key, current, part, obj.get(part))
            self._store(key, current, "MODIFIED" if existing is not None else "ADDED")
            return copy.deepcopy(current)

    async def delete(self, res: Resource, name: str, namespace: str = "") -> None:
        with self._lock:
            ns = namespace if res.namespaced else ""
            self._enter("delete", res, ns, name)
            self._remove(self._key(res, ns, name))

    async def evict(self, namespace: str, name: str, uid: str = "", *, dry_run: bool = False) -> None:
        with self._lock:
            self._enter("create", kube_api.PODS, namespace, name, "eviction")
            key = self._key(kube_api.PODS, namespace, name)
            pod = self._require(key)
            if uid and pod["metadata"].get("uid") not in (None, uid):
                raise Conflict(409, f"pod {namespace}/{name}: uid precondition failed")
            if f"{namespace}/{name}" in self.budget_blocks:
                raise Throttled(429, "Cannot evict pod as it would violate the pod's disruption budget.")
            if not dry_run:
                self._remove(key)

    async def serves(self, res: Resource) -> bool:
        with self._lock:
            self._enter("serves", res)
            return res.group not in self.unserved

    # -- internals -----------------------------------------------------------------------
    def _served(self, res: Resource) -> None:
        if res.group in self.unserved:
            raise NotFound(404, f"the server could not find the requested resource ({_plural(res)})")

    @staticmethod
    def _key(res: Resource, namespace: str, name: str) -> _Key:
        return _plural(res), namespace if res.namespaced else "", name

    def _enter(self, verb: str, res: Resource, namespace: str = "", name: str = "", sub: str = "") -> None:
        call = Call(verb, _plural(res), namespace, name, sub, _caller())
        self.calls.append(call)
        for label in (call.label, verb):
            pending = self._failures.get(label)
            if pending:
                raise pending.pop(0)

    def _require(self, key: _Key) -> dict[str, Any]:
        got = self._objects.get(key)
        if got is None:
            raise NotFound(404, f"{key[0]} {key[1]}/{key[2]} not found".replace(" /", " "))
        return got

    def _store(self, key: _Key, obj: dict[str, Any], event: str) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self._history.append((self._rv, key[0], WatchEvent(event, copy.deepcopy(obj))))

    def _remove(self, key: _Key) -> None:
        obj = self._objects.pop(key, None)
        if obj is None:
            raise NotFound(404, f"{key[0]} {key[1]}/{key[2]} not found".replace(" /", " "))
        for k in [k for k in self._applied if k[0] == key]:
            del self._applied[k]
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, key[0], WatchEvent("DELETED", obj)))

    @staticmethod
    def _check_version(current: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        have = current["metadata"].get("resourceVersion")
        if wanted is not None and wanted != have:
            raise Conflict(409, f"the object has been modified (resourceVersion {wanted} != {have})")

    def _apply_part(self, key: _Key, current: dict[str, Any], part: str, value: Any) -> None:
        """Apply one top-level member (``spec``, ``status``): fields of ours left out since
        the last apply go, list-map entries merge by key."""
        before = self._applied.get((key, part), {})
        mine: dict[str, Any] = dict(copy.deepcopy(value)) if isinstance(value, Mapping) else {}
        target = current.setdefault(part, {})
        if not isinstance(value, Mapping):
            current[part] = copy.deepcopy(value)
            return
        for field in before:
            if field not in mine:
                target.pop(field, None)
        for field, v in mine.items():
            list_key = _LIST_MAPS.get(field)
            if list_key and isinstance(v, list):
                ours_before = {e.get(list_key) for e in before.get(field) or () if isinstance(e, Mapping)}
                ours_now = {e.get(list_key) for e in v if isinstance(e, Mapping)}
                entries = [
                    e
                    for e in target.get(field) or []
                    if not (e.get(list_key) in ours_before and e.get(list_key) not in ours_now)
                ]
                merged = {e[list_key]: e for e in entries}
                order = list(merged)
                for entry in v:
                    merged[entry[list_key]] = {**merged.get(entry[list_key], {}), **copy.deepcopy(entry)}
                    if entry[list_key] not in order:
                        order.append(entry[list_key])
                target[field] = [merged[k] for k in order]
            else:
                target[field] = copy.deepcopy(v)
        self._applied[(key, part)] = mine

    def _owner_refs(self, key: _Key, current: Iterable[Any], ours: Iterable[Any]) -> _Entries:
        """``ownerReferences`` is a list-map keyed by ``uid``: an entry another writer set
        stays; one our last apply set and this one leaves out goes."""
        before = self._applied.get((key, "ownerReferences"), {})
        now = {str(o.get("uid")): copy.deepcopy(o) for o in ours}
        kept = [o for o in current if str(o.get("uid")) not in before and str(o.get("uid")) not in now]
        self._applied[(key, "ownerReferences")] = now
        return kept + list(now.values())

    def _bind(self, namespace: str, binding: Mapping[str, Any]) -> dict[str, Any]:
        meta = binding.get("metadata") or {}
        key = ("pods", namespace, str(meta.get("name", "")))
        pod = copy.deepcopy(self._require(key))
        uid = meta.get("uid")
        if uid and pod["metadata"].get("uid") not in (None, uid):
            raise Conflict(409, f"pod {namespace}/{key[2]}: uid precondition failed")
        if (pod.get("spec") or {}).get("nodeName"):
            raise Conflict(409, f"pod {namespace}/{key[2]} is already assigned to a node")
        pod.setdefault("spec", {})["nodeName"] = str((binding.get("target") or {}).get("name", ""))
        annotations = meta.get("annotations") or {}
        if annotations:
            pod["metadata"].setdefault("annotations", {}).update(copy.deepcopy(dict(annotations)))
        self._store(key, pod, "MODIFIED")
        return {"kind": "Status", "status": "Success"}


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """A JSON merge patch (RFC 7386): None deletes, maps merge, anything else replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v) if not isinstance(v, Mapping) else _fresh(v)


def _fresh(v: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _merge(out, v)
    return out


#: The one module that may write each object through the client (see extender/reservations/store.py,
#: extender/kube/binder.py, extender/agent/publish.py, extender/kube/slot_claims.py,
#: extender/kube/compute_domains.py, extender/controllers/webhook_ca/sync.py): what
#: tests/conftest.py checks after every test on every fake API server the test made.
WRITERS = {
    "slicereservations": "extender.reservations.store",
    "nodetopologies": "extender.agent.publish",
    "resourceclaims": "extender.kube.slot_claims",
    "computedomains": "extender.kube.compute_domains",
    "mutatingwebhookconfigurations": "extender.controllers.webhook_ca.sync",
}
BINDER = "extender.kube.binder"
#: The one module that evicts pods (for a device mismatch, or a migration).
EVICTOR = "extender.kube.evictions"
#: The one part of a NodeTopology the agent does not write: the controller's ``Accepted``
#: condition on its status (extender/controllers/topology_status/reporter.py).
SUBRESOURCE_WRITERS = {("nodetopologies", "status"): "extender.controllers.topology_status.reporter"}


def foreign_writes(api: FakeKube) -> list[str]:
    """Writes to an object by code other than its one writer (``"<label> by <module>"``)."""
    bad = []
    for call in api.writes():
        owner = WRITERS.get(call.plural)
        if call.plural == "nodetopologies" and call.caller == SUBRESOURCE_WRITERS.get(
            (call.plural, call.subresource)
        ):
            owner = call.caller
        if call.subresource == "binding":
            owner = BINDER
        if call.subresource == "eviction":
            owner = EVICTOR
        if owner is not None and call.caller != owner:
            bad.append(f"{call.label} {call.namespace}/{call.name} by {call.caller}")
    return bad
