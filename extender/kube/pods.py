"""A pod as gangslice sees it: parsed once from the API object, never a raw dict past here.

Parsing is lenient: a pod the cache watches must never break the cache, so a value that
cannot be read (a gang size that is not a number, a GPU list that is not one) is recorded in
``problems`` and left unset; a decision about that pod reports the problem.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.kube import names
from extender.kube.api import as_map
from extender.kube.pod_needs import NeedsError, pod_needs
from extender.placement.request import PodNeeds, PodSet

#: Larger gangs are refused before any search (a typo such as ``gang-size: 1000000``).
MAX_GANG_SIZE = 100_000

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class PodError(ValueError):
    """A pod whose gangslice labels or annotations cannot be used; the message says which."""


#: ``terminationGracePeriodSeconds`` when a pod does not say (the API server's default).
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str = ""
    node: str | None = None
    phase: str = "Pending"
    gpus: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    problems: tuple[str, ...] = ()
    #: ``spec.schedulerName`` (the API server defaults it to ``default-scheduler``).
    scheduler: str = "default-scheduler"
    #: What the pod asks of its node besides GPUs (:mod:`extender.kube.pod_needs`).
    needs: PodNeeds = field(default_factory=PodNeeds)
    #: Why :attr:`needs` could not be read (then it is empty); a gang built from this pod
    #: reports it. The pod's own resource count on a node is then taken as zero.
    needs_problem: str | None = None
    #: Of :attr:`gpus`, those its pinned DRA claim holds (``gangslice.io/claim-gpus``); the
    #: rest its containers request from the device plugin.
    claimed_gpus: int = 0
    #: The upstream PodGroup ``spec.schedulingGroup.podGroupName`` names (:mod:`extender.kube.pod_groups`).
    pod_group: str | None = None
    #: ``spec.schedulingGates`` is not empty: no scheduler places the pod until they are lifted
    #: (Kueue lifts its gate in the update that writes the pod's podSetUpdates).
    gated: bool = False
    #: The ResourceClaims its ``spec.resourceClaims`` names by ``resourceClaimName``.
    claim_names: frozenset[str] = frozenset()
    #: The ``ownerReferences`` entry marked ``controller``: (apiVersion, kind, name, uid).
    controller: tuple[str, str, str, str] | None = None
    #: ``spec.terminationGracePeriodSeconds``: how long an evicted pod may take to stop (the
    #: API server's default, 30, when unset).
    grace_s: float = DEFAULT_GRACE_S

    @property
    def plugin_gpus(self) -> int:
        """The GPUs the pod's containers request from the device plugin: all a device-plugin
        node can have given it, whatever its annotations say."""
        return self.gpus - self.claimed_gpus

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def alone(self) -> PodSet:
        """The pod as a pod set of its own (a GPU pod outside any gang): its GPUs, levels and
        what it asks of its node."""
        plain = PodSet(
            name="pod",
            count=1,
            gpus_per_pod=self.gpus,
            required_level=self.required_level,
            preferred_level=self.preferred_level,
        )
        return self.needs.on(plain)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def holds_gpus(self) -> bool:
        """Bound to a node and not finished: its GPUs are taken."""
        return self.node is not None and not self.terminal

    def _value(self, key: str) -> str | None:
        got = self.labels.get(key)
        if got is None:
            got = self.annotations.get(key)
        return got or None

    @property
    def gang(self) -> str | None:
        """The plain gang key ``<namespace>/<gang>`` from the ``gangslice.io/gang`` label; a
        LeaderWorkerSet's pods (the label in its templates) get ``<gang>-<group index>``, one
        gang per replica group. Without the label, the upstream PodGroup the pod joins
        (``<namespace>/<podgroup>``) is its gang."""
        value = self.labels.get(names.GANG)
        if not value:
            return f"{self.namespace}/{self.pod_group}" if self.pod_group else None
        group = self.labels.get(names.LWS_GROUP_INDEX)
        return f"{self.namespace}/{value}-{group}" if group else f"{self.namespace}/{value}"

    @property
    def joins_pod_group(self) -> bool:
        """Whether the pod's gang is the upstream PodGroup it joins (no label names another)."""
        return self.pod_group is not None and not self.labels.get(names.GANG)

    @property
    def reservation_name(self) -> str | None:
        return self.annotations.get(names.RESERVATION) or None

    @property
    def gang_key(self) -> str | None:
        """The ledger key of the gang this pod belongs to, whoever formed it: the SliceReservation
        a Kueue pod set's ``gangslice.io/reservation`` names (gangslice's AdmissionCheck writes it;
        the reservation of Workload ``<ns>/<wl>`` is named ``<wl>``), else the plain gang, else
        the Volcano PodGroup. The one mapping from a pod to its gang."""
        if self.reservation_name:
            return f"{self.namespace}/{self.reservation_name}"
        return self.gang or self.volcano_group

    @property
    def volcano_group(self) -> str | None:
        value = self.annotations.get(names.VOLCANO_GROUP)
        return f"{self.namespace}/{value}" if value else None

    @property
    def pod_set(self) -> str | None:
        return (
            self._value(names.POD_SET)
            or self.labels.get(names.KUEUE_PODSET)
            or self._value(names.VOLCANO_TASK_SPEC)
            or None
        )

    @property
    def gang_size(self) -> int | None:
        """``gangslice.io/gang-size``; for a LeaderWorkerSet's pod without it, the group's size
        as the LWS controller writes it (so a change of ``size`` needs no other edit)."""
        own = self._count(names.GANG_SIZE)
        if own is None and self.labels.get(names.LWS_GROUP_INDEX) is not None:
            return self._count(names.LWS_SIZE)
        return own

    @property
    def pod_set_size(self) -> int | None:
        return self._count(names.POD_SET_SIZE)

    @property
    def colocate_with(self) -> str | None:
        return self._value(names.COLOCATE_WITH)

    def _count(self, key: str) -> int | None:
        raw = self.annotations.get(key)
        if raw is None:
            return None
        size = _int_or_none(raw)
        if size is None or not 1 <= size <= MAX_GANG_SIZE:
            raise PodError(
                f"pod {self.key}: annotation {key}={raw!r} is not a pod count between 1 and {MAX_GANG_SIZE}"
            )
        return size

    @property
    def required_level(self) -> str | None:
        return self._value(names.REQUIRED_LEVEL)

    @property
    def preferred_level(self) -> str | None:
        return self._value(names.PREFERRED_LEVEL)

    @property
    def comm(self) -> str | None:
        return self._value(names.COMM)

    @property
    def assigned_gpus(self) -> tuple[int, ...] | None:
        """The GPU indices written at bind (``gangslice.io/gpus``), None when absent or unreadable."""
        raw = self.annotations.get(names.GPUS)
        if raw is None:
            return None
        return parse_gpu_list(raw)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> PodInfo:
        meta = as_map(obj.get("metadata"))
        spec = as_map(obj.get("spec"))
        status = as_map(obj.get("status"))
        problems: list[str] = []
        gpus = claimed_gpus = 0
        annotations = _str_map(meta.get("annotations"))
        try:
            gpus = gpu_request(spec)
            claimed = annotations.get(names.CLAIM_GPUS)
            if claimed is not None:
                # A DRA gang pod: the GPUs of its pinned claim (written at its creation).
                claimed_gpus = quantity(claimed)
                gpus += claimed_gpus
        except PodError as exc:
            problems.append(str(exc))
        node = spec.get("nodeName")
        needs, needs_problem = PodNeeds(), None
        try:
            needs = pod_needs(spec)
        except NeedsError as exc:
            needs_problem = f"pod {_str(meta.get('namespace')) or 'default'}/{_str(meta.get('name'))}: {exc}"
        group = as_map(spec.get("schedulingGroup")).get("podGroupName")
        return cls(
            namespace=_str(meta.get("namespace")) or "default",
            name=_str(meta.get("name")),
            uid=_str(meta.get("uid")),
            node=node if isinstance(node, str) and node else None,
            phase=_str(status.get("phase")) or "Pending",
            gpus=gpus,
            labels=_str_map(meta.get("labels")),
            annotations=annotations,
            deleting=meta.get("deletionTimestamp") is not None,
            problems=tuple(problems),
            scheduler=_str(spec.get("schedulerName")) or "default-scheduler",
            needs=needs,
            needs_problem=needs_problem,
            claimed_gpus=claimed_gpus,
            pod_group=group if isinstance(group, str) and group else None,
            gated=bool(spec.get("schedulingGates")),
            claim_names=frozenset(
                str(name)
                for entry in spec.get("resourceClaims") or ()
                if isinstance(entry, Mapping) and (name := entry.get("resourceClaimName"))
            ),
            controller=controller_ref(meta),
            grace_s=_grace_s(spec.get("terminationGracePeriodSeconds")),
        )


def _grace_s(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0
        else DEFAULT_GRACE_S
    )


def controller_ref(meta: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """The ``ownerReferences`` entry of an object's ``metadata`` marked ``controller`` (there is at
    most one): (apiVersion, kind, name, uid)."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return (
                _str(ref.get("apiVersion")),
                _str(ref.get("kind")),
                _str(ref.get("name")),
                _str(ref.get("uid")),
            )
    return None


def digits(text: str) -> int | None:
    """A whole number written in ASCII digits only, else None: ``str.isdigit`` alone also
    takes full-width and Arabic-Indic digits, and ``int`` takes spaces, signs and underscores."""
    return int(text) if text.isascii() and text.isdigit() else None


def parse_gpu_list(raw: str) -> tuple[int, ...] | None:
    """``"0,1,2,3"`` -> (0, 1, 2, 3); None for anything else."""
    out: list[int] = []
    for part in raw.split(","):
        got = digits(part)
        if got is None:
            return None
        out.append(got)
    return tuple(out) if len(set(out)) == len(out) else None


def quantity(value: Any) -> int:
    """An extended-resource quantity as a whole count (``8``, ``"8"``, ``"8000m"``): ASCII
    digits, no sign, no spaces, no fraction. The one reader of GPU counts in API objects."""
    if isinstance(value, bool):
        raise PodError(f"quantity {value!r} is not a number")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        whole = digits(value)
        if whole is not None:
            return whole
        milli = digits(value[:-1]) if value.endswith("m") else None
        if milli is not None and milli % 1000 == 0:
            return milli // 1000
    if isinstance(value, int | float) and value < 0:
        raise PodError(f"quantity {value!r} is negative")
    raise PodError(f"quantity {value!r} is not a whole number in ASCII digits")


def milli_quantity(value: Any, where: str) -> int:
    """A count sent in milli-units as a JSON number (Volcano's ``ScalarResources``: 8 GPUs
    arrive as ``8000``), refused unless a whole, non-negative count; ``where`` names the field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PodError(f"{where}: {value!r} is not a number of milli-units")
    if not math.isfinite(value) or value < 0:
        raise PodError(f"{where}: {value!r} is negative or not finite")
    if value % 1000 != 0:
        raise PodError(f"{where}: {value!r} milli-units is not a whole count")
    return int(value) // 1000


def _container_gpus(container: Mapping[str, Any], where: str) -> int:
    resources = as_map(container.get("resources"))
    counts = [0]
    for part in ("limits", "requests"):
        got = as_map(resources.get(part)).get(names.GPU_RESOURCE)
        if got is not None:
            try:
                counts.append(quantity(got))
            except PodError as exc:
                raise PodError(f"{where}.resources.{part}[{names.GPU_RESOURCE}]: {exc}") from None
    return max(counts)


def gpu_request(spec: Mapping[str, Any]) -> int:
    """GPUs the pod needs: the sum over its containers, or the largest init container if
    more. Raises PodError naming the field (``spec.containers[NAME].resources.limits[...]``)."""
    counts: dict[str, list[int]] = {"containers": [], "initContainers": []}
    for kind, got in counts.items():
        for i, c in enumerate(_list(spec.get(kind))):
            if isinstance(c, Mapping):
                name = c.get("name") if isinstance(c.get("name"), str) and c.get("name") else i
                got.append(_container_gpus(c, f"spec.{kind}[{name}]"))
    return max(sum(counts["containers"]), max(counts["initContainers"], default=0))


def _int_or_none(raw: str) -> int | None:
    return digits(raw)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}
