"""An in-memory :class:`~extender.controllers.api.ControllerApi` for unit tests.

It keeps objects with resource versions and emulates what the controller relies on:
server-side apply to ``/status`` merges list-map entries by key (``admissionChecks`` by
``name``, ``conditions`` by ``type``) and leaves other managers' entries alone; an apply or
replace carrying a stale ``metadata.resourceVersion`` fails with 409; ``create`` of a
SliceReservation ignores ``status`` (status subresource); a PodGroup replace with a stale
resourceVersion fails with 409. Every apply body is recorded in
``applies``; ``fail_next(call, error)`` makes the next call of a method raise.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from extender.kube.api import ApiError, Conflict, NotFound

_Key = tuple[str, str, str]  # (plural, namespace, name)


class FakeControllerApi:
    def __init__(self) -> None:
        self._objects: dict[_Key, dict[str, Any]] = {}
        self._rv = 0
        self._failures: dict[str, list[BaseException]] = {}
        self.applies: list[tuple[str, str, str, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.calls: list[str] = []

    # -- test controls -------------------------------------------------------------------
    def put(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object as another client would (e.g. Kueue); returns it."""
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        key = (plural, str(meta.get("namespace", "")), str(meta["name"]))
        self._store(key, stored)
        return copy.deepcopy(stored)

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        got = self._objects.get((plural, namespace, name))
        return copy.deepcopy(got) if got is not None else None

    def objects(self, plural: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (p, _, _), o in sorted(self._objects.items()) if p == plural]

    def remove(self, plural: str, name: str, namespace: str = "") -> None:
        self._objects.pop((plural, namespace, name), None)

    def fail_next(self, call: str, error: BaseException) -> None:
        self._failures.setdefault(call, []).append(error)

    def applies_to(self, plural: str) -> list[dict[str, Any]]:
        return [body for p, _, _, body in self.applies if p == plural]

    # -- ControllerApi -------------------------------------------------------------------
    async def get_workload(self, namespace: str, name: str) -> dict[str, Any]:
        self._enter("get_workload")
        return self._require(("workloads", namespace, name))

    async def apply_workload_status(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._enter("apply_workload_status")
        return self._apply_status(("workloads", namespace, name), body, "admissionChecks", "name")

    async def list_admission_checks(self) -> list[dict[str, Any]]:
        self._enter("list_admission_checks")
        return self.objects("admissionchecks")

    async def get_resource_flavor(self, name: str) -> dict[str, Any]:
        self._enter("get_resource_flavor")
        return self._require(("resourceflavors", "", name))

    async def apply_admission_check_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("apply_admission_check_status")
        return self._apply_status(("admissionchecks", "", name), body, "conditions", "type")

    async def list_reservations(self) -> list[dict[str, Any]]:
        self._enter("list_reservations")
        return self.objects("slicereservations")

    async def get_reservation(self, namespace: str, name: str) -> dict[str, Any]:
        self._enter("get_reservation")
        return self._require(("slicereservations", namespace, name))

    async def create_reservation(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("create_reservation")
        meta = obj["metadata"]
        key = ("slicereservations", str(meta["namespace"]), str(meta["name"]))
        if key in self._objects:
            raise Conflict(409, f"slicereservations {key[1]}/{key[2]} already exists")
        stored = copy.deepcopy({k: v for k, v in obj.items() if k != "status"})
        self._store(key, stored)
        return copy.deepcopy(stored)

    async def apply_reservation_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self._enter("apply_reservation_status")
        self._apply_status(("slicereservations", namespace, name), body, "conditions", "type")

    async def delete_reservation(self, namespace: str, name: str) -> None:
        self._enter("delete_reservation")
        if self._objects.pop(("slicereservations", namespace, name), None) is None:
            raise NotFound(404, f"slicereservations {namespace}/{name} not found")

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self._enter("create_event")
        self.events.append({**copy.deepcopy(dict(event)), "namespace": namespace})

    #: Groups the fake API does not serve (tests of a cluster without Kueue or Volcano).
    unserved: frozenset[str] = frozenset()

    async def serves(self, group: str, version: str, plural: str) -> bool:
        self._enter("serves")
        return group not in self.unserved

    async def get_podgroup(self, namespace: str, name: str) -> dict[str, Any]:
        self._enter("get_podgroup")
        return self._require(("podgroups", namespace, name))

    async def replace_podgroup(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("replace_podgroup")
        key = ("podgroups", namespace, name)
        current = self._require(key)
        self._check_version(current, body)
        stored = copy.deepcopy(dict(body))
        self._store(key, stored)
        return copy.deepcopy(stored)

    async def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self._enter("patch_pod_annotations")
        key = ("pods", namespace, name)
        current = self._require(key)
        current["metadata"].setdefault("annotations", {}).update(annotations)
        self._store(key, current)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        self._enter("get_lease")
        return self._require(("leases", namespace, name))

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("create_lease")
        key = ("leases", namespace, str(body["metadata"]["name"]))
        if key in self._objects:
            raise Conflict(409, f"lease {namespace}/{key[2]} already exists")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["namespace"] = namespace
        self._store(key, stored)
        return copy.deepcopy(stored)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("replace_lease")
        key = ("leases", namespace, name)
        current = self._require(key)
        self._check_version(current, body)
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["namespace"] = namespace
        self._store(key, stored)
        return copy.deepcopy(stored)

    # -- internals -----------------------------------------------------------------------
    def _enter(self, call: str) -> None:
        self.calls.append(call)
        pending = self._failures.get(call)
        if pending:
            raise pending.pop(0)

    def _require(self, key: _Key) -> dict[str, Any]:
        got = self._objects.get(key)
        if got is None:
            raise NotFound(404, f"{key[0]} {key[1]}/{key[2]} not found")
        return copy.deepcopy(got)

    def _store(self, key: _Key, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self._objects[key] = obj

    @staticmethod
    def _check_version(current: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        have = current["metadata"].get("resourceVersion")
        if wanted is not None and wanted != have:
            raise Conflict(409, f"the object has been modified (resourceVersion {wanted} != {have})")

    def _apply_status(
        self, key: _Key, body: Mapping[str, Any], list_field: str, list_key: str
    ) -> dict[str, Any]:
        if not isinstance(body.get("apiVersion"), str) or not isinstance(body.get("kind"), str):
            raise ApiError(400, "apply body needs apiVersion and kind")
        current = self._require(key)
        self._check_version(current, body)
        self.applies.append((key[0], key[1], key[2], copy.deepcopy(dict(body))))
        status = current.setdefault("status", {})
        for field, value in (body.get("status") or {}).items():
            if field == list_field and isinstance(value, list):
                merged = {e[list_key]: e for e in status.get(field) or []}
                order = list(merged)
                for entry in value:
                    old = merged.get(entry[list_key], {})
                    merged[entry[list_key]] = {**old, **copy.deepcopy(entry)}
                    if entry[list_key] not in order:
                        order.append(entry[list_key])
                status[field] = [merged[k] for k in order]
            else:
                status[field] = copy.deepcopy(value)
        self._store(key, current)
        return copy.deepcopy(current)
