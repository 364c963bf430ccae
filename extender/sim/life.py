"""What a workload's owner does over its life: how it rolls to a new revision, and how long a
replica takes to load its model before it serves.

A template (or an inline gang of a trace) may say, beside its gang-file content::

    owner: LeaderWorkerSet     # Deployment (default) or LeaderWorkerSet
    maxSurge: 0                # replicas (or groups) above the desired count during a rollout
    maxUnavailable: 1          # replicas (or groups) below it; a number or a percentage
    loadSeconds: 420           # from placement to serving: pull, load weights, warm up

Rollout defaults are the owners' own: a Deployment's RollingUpdate strategy defaults to
maxSurge 25 % and maxUnavailable 25 % (k8s.io/api apps/v1 ``DeploymentStrategy``; surge rounds
up, unavailable down, and when both come to 0 unavailable is 1, as the deployment
controller's ``ResolveFenceposts`` does); a LeaderWorkerSet's rolling update defaults to
maxUnavailable 1 and maxSurge 0 groups (sigs.k8s.io/lws ``RollingUpdateConfiguration``).

Model load time, when not given: :data:`ENGINE_START_S` of engine start (CUDA graphs,
warm-up) plus each pod's share of the weights read at :data:`LOAD_GBPS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.cost import Comm
from extender.placement.reading import shown
from extender.placement.request import GangRequest

DEPLOYMENT = "Deployment"
LEADER_WORKER_SET = "LeaderWorkerSet"
OWNERS = (DEPLOYMENT, LEADER_WORKER_SET)
#: The keys a template may carry beside its gang-file content.
LIFE_KEYS = ("owner", "maxSurge", "maxUnavailable", "loadSeconds")

#: Bounds of a trace file's values (:data:`extender.sim.trace.LIMITS` lists them all): a
#: number of replicas, and seconds of simulated time (a year).
MAX_AMOUNT = 10_000
MAX_SECONDS = 86_400 * 365

ENGINE_START_S = 60.0
#: Pod sets whose pods each hold a share of the weights (the others hold all of them).
_SHARDED = (Comm.ALLREDUCE, Comm.ALLTOALL, Comm.PIPELINE)
#: Weights read per pod per second from the node's cache (local NVMe), GB/s.
LOAD_GBPS = 2.0


class LifeError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Life:
    owner: str = DEPLOYMENT
    #: A number of replicas, or a percentage of the desired count (``"25%"``); None: the owner's default.
    max_surge: int | str | None = None
    max_unavailable: int | str | None = None
    #: Seconds from placement until a replica serves; None: estimated from the model.
    load_s: float | None = None

    def fenceposts(self, replicas: int) -> tuple[int, int]:
        """(max surge, max unavailable) for this many desired replicas."""
        default = ("25%", "25%") if self.owner == DEPLOYMENT else (0, 1)
        surge = _resolve(self.max_surge if self.max_surge is not None else default[0], replicas, up=True)
        unavailable = _resolve(
            self.max_unavailable if self.max_unavailable is not None else default[1], replicas, up=False
        )
        if surge == 0 and unavailable == 0:
            unavailable = 1
        return surge, unavailable

    def load_seconds(self, gang: GangRequest) -> float:
        if self.load_s is not None:
            return self.load_s
        per_pod = max(
            (
                ps.model.weight_bytes / (ps.count if ps.comm in _SHARDED else 1)
                for ps in gang.pod_sets
                if ps.gpus_per_pod
            ),
            default=0.0,
        )
        return ENGINE_START_S + per_pod / (LOAD_GBPS * 1e9)

    def to_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.owner != DEPLOYMENT:
            out["owner"] = self.owner
        if self.max_surge is not None:
            out["maxSurge"] = self.max_surge
        if self.max_unavailable is not None:
            out["maxUnavailable"] = self.max_unavailable
        if self.load_s is not None:
            out["loadSeconds"] = self.load_s
        return out


def _resolve(value: int | str, replicas: int, up: bool) -> int:
    if isinstance(value, int):
        return value
    share = float(value.rstrip("%")) / 100 * replicas
    return math.ceil(share) if up else math.floor(share)


def _amount(value: Any, where: str) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_AMOUNT:
        return value
    if isinstance(value, str) and value.endswith("%") and len(value) <= 32:
        try:
            if 0 <= float(value[:-1]) <= 100:
                return value
        except ValueError:
            pass
    raise LifeError(
        f"{where}: expected a whole number from 0 to {MAX_AMOUNT} or a percentage like '25%', "
        f"got {shown(value)}"
    )


def split_life(spec: Mapping[str, Any], where: str) -> tuple[dict[str, Any], Life]:
    """A template's gang-file content and its :class:`Life` (the keys of :data:`LIFE_KEYS`)."""
    gang = {k: v for k, v in spec.items() if k not in LIFE_KEYS}
    owner = spec.get("owner", DEPLOYMENT)
    if owner not in OWNERS:
        raise LifeError(f"{where}owner: expected one of {', '.join(OWNERS)}, got {shown(owner)}")
    surge = _amount(spec["maxSurge"], f"{where}maxSurge") if "maxSurge" in spec else None
    unavailable = (
        _amount(spec["maxUnavailable"], f"{where}maxUnavailable") if "maxUnavailable" in spec else None
    )
    load = spec.get("loadSeconds")
    if load is not None and (
        not isinstance(load, int | float) or isinstance(load, bool) or not 0 <= load <= MAX_SECONDS
    ):
        raise LifeError(
            f"{where}loadSeconds: expected a number of seconds from 0 to {MAX_SECONDS}, got {shown(load)}"
        )
    return gang, Life(owner, surge, unavailable, None if load is None else float(load))
