"""An in-memory Kubernetes API for unit tests and the benchmark: objects, resource versions,
watch streams, a compactable history (to provoke ``410 Gone``) and injected failures.

Thread-safe: watches block in their own threads while a test changes objects.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from extender.kube.api import ApiError, Conflict, Gone, Kind, Listing, NotFound, WatchEvent

_NAMESPACED = {Kind.PODS, Kind.SLICE_RESERVATIONS}


def _key(kind: Kind, obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace", "default") if kind in _NAMESPACED else ""
    return ns, meta["name"]


class FakeKubeApi:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rv = 0
        self._objects: dict[Kind, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in Kind}
        self._history: list[tuple[int, Kind, WatchEvent]] = []
        self._compacted = 0
        self._failures: dict[str, list[ApiError]] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.closed = False

    # -- test controls -------------------------------------------------------------------
    def put(self, kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object (ADDED or MODIFIED event)."""
        with self._cond:
            stored = copy.deepcopy(dict(obj))
            key = _key(kind, stored)
            if kind in _NAMESPACED:
                stored["metadata"].setdefault("namespace", "default")
            kind_type = "MODIFIED" if key in self._objects[kind] else "ADDED"
            self._store(kind, key, stored, kind_type)
            return copy.deepcopy(stored)

    def remove(self, kind: Kind, name: str, namespace: str = "default") -> None:
        with self._cond:
            key = (namespace if kind in _NAMESPACED else "", name)
            obj = self._objects[kind].pop(key, None)
            if obj is None:
                raise NotFound(404, f"{kind.value} {name} not found")
            self._rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._history.append((self._rv, kind, WatchEvent("DELETED", obj)))
            self._cond.notify_all()

    def get(self, kind: Kind, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self._cond:
            got = self._objects[kind].get((namespace if kind in _NAMESPACED else "", name))
            return copy.deepcopy(got) if got is not None else None

    def objects(self, kind: Kind) -> list[dict[str, Any]]:
        with self._cond:
            return [copy.deepcopy(o) for o in self._objects[kind].values()]

    def compact(self) -> None:
        """Forget the event history: every watch from before now gets 410 Gone."""
        with self._cond:
            self._rv += 1  # the compaction's own revision: every open watch is now too old
            self._compacted = self._rv
            self._history.clear()
            self._cond.notify_all()

    def fail_next(self, call: str, error: ApiError) -> None:
        """Make the next call of method ``call`` (e.g. ``"bind_pod"``) raise ``error``."""
        with self._cond:
            self._failures.setdefault(call, []).append(error)

    def close(self) -> None:
        """Wake every watch so its thread can end."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    # -- KubeApi -------------------------------------------------------------------------
    def list(self, kind: Kind) -> Listing:
        with self._cond:
            self._enter("list", kind)
            return Listing([copy.deepcopy(o) for o in self._objects[kind].values()], str(self._rv))

    def watch(self, kind: Kind, resource_version: str, timeout_s: float) -> Iterator[WatchEvent]:
        with self._cond:
            self._enter("watch", kind)
        since = int(resource_version or 0)
        waited = 0.0
        while True:
            with self._cond:
                if since < self._compacted:
                    raise Gone(410, f"too old resource version: {since} ({self._compacted})")
                ready = [ev for rv, k, ev in self._history if k == kind and rv > since]
                if not ready:
                    if self.closed or waited >= timeout_s:
                        return
                    self._cond.wait(0.05)
                    waited += 0.05
                    continue
            for ev in ready:
                since = int(ev.resource_version or since)
                yield WatchEvent(ev.type, copy.deepcopy(ev.obj))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self._cond:
            self._enter("get_pod", namespace, name)
            got = self._objects[Kind.PODS].get((namespace, name))
            if got is None:
                raise NotFound(404, f"pod {namespace}/{name} not found")
            return copy.deepcopy(got)

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        with self._cond:
            self._enter("patch_pod_annotations", namespace, name, dict(annotations))
            pod = self._pod(namespace, name)
            pod["metadata"].setdefault("annotations", {}).update(annotations)
            self._store(Kind.PODS, (namespace, name), pod, "MODIFIED")

    def patch_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> None:
        with self._cond:
            self._enter("patch_pod_labels", namespace, name, dict(labels))
            pod = self._pod(namespace, name)
            pod["metadata"].setdefault("labels", {}).update(labels)
            self._store(Kind.PODS, (namespace, name), pod, "MODIFIED")

    def bind_pod(self, namespace: str, name: str, uid: str | None, node: str) -> None:
        with self._cond:
            self._enter("bind_pod", namespace, name, uid, node)
            pod = self._pod(namespace, name)
            if uid and pod["metadata"].get("uid") not in (None, uid):
                raise Conflict(409, f"pod {namespace}/{name}: uid precondition failed")
            if pod.get("spec", {}).get("nodeName"):
                raise Conflict(409, f"pod {namespace}/{name} is already assigned to a node")
            pod.setdefault("spec", {})["nodeName"] = node
            self._store(Kind.PODS, (namespace, name), pod, "MODIFIED")

    def create_reservation(self, obj: Mapping[str, Any]) -> None:
        with self._cond:
            self._enter("create_reservation", obj["metadata"]["namespace"], obj["metadata"]["name"])
            key = _key(Kind.SLICE_RESERVATIONS, obj)
            if key in self._objects[Kind.SLICE_RESERVATIONS]:
                raise Conflict(409, f"slicereservation {key[0]}/{key[1]} already exists")
            self._store(Kind.SLICE_RESERVATIONS, key, copy.deepcopy(dict(obj)), "ADDED")

    def patch_reservation_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        self._replace_reservation_part("patch_reservation_spec", namespace, name, "spec", spec)

    def patch_reservation_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._replace_reservation_part("patch_reservation_status", namespace, name, "status", status)

    def _replace_reservation_part(
        self, call: str, namespace: str, name: str, part: str, value: Mapping[str, Any]
    ) -> None:
        with self._cond:
            self._enter(call, namespace, name)
            got = self._objects[Kind.SLICE_RESERVATIONS].get((namespace, name))
            if got is None:
                raise NotFound(404, f"slicereservation {namespace}/{name} not found")
            got = copy.deepcopy(got)
            got[part] = copy.deepcopy(dict(value))
            self._store(Kind.SLICE_RESERVATIONS, (namespace, name), got, "MODIFIED")

    def delete_reservation(self, namespace: str, name: str) -> None:
        with self._cond:
            self._enter("delete_reservation", namespace, name)
        self.remove(Kind.SLICE_RESERVATIONS, name, namespace)

    # -- internals -----------------------------------------------------------------------
    def _enter(self, call: str, *args: Any) -> None:
        self.calls.append((call, args))
        pending = self._failures.get(call)
        if pending:
            raise pending.pop(0)

    def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        got = self._objects[Kind.PODS].get((namespace, name))
        if got is None:
            raise NotFound(404, f"pod {namespace}/{name} not found")
        return copy.deepcopy(got)

    def _store(self, kind: Kind, key: tuple[str, str], obj: dict[str, Any], event: str) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self._objects[kind][key] = obj
        self._history.append((self._rv, kind, WatchEvent(event, copy.deepcopy(obj))))
        self._cond.notify_all()
