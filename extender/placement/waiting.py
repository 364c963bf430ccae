"""The gangs known to wait, and whether one of them needs a multi-node NVLink clique.

The objective keeps whole cliques (GB200 NVL72 racks) for the gangs that span nodes over
them (:func:`~extender.placement.scoring.fabric_waste`). Kept while nobody needs them, a
rack sits idle while small replicas queue for the nodes outside it. So the rule applies
while a gang that needs a clique waits: the one reserve path notes every gang the solver
refuses and forgets it once placed; a decision's snapshot carries
:attr:`~extender.placement.snapshot.ClusterSnapshot.clique_demand`, read from here.

What is not known is treated as demand: for the first :data:`WAITING_TTL_S` after start
(gangs refused before a restart are not known yet) every decision keeps the cliques, as a
``place`` on a cluster file does. :attr:`KeepCliques.ALWAYS` (``serve --keep-cliques always``)
keeps them whatever waits: for fleets whose NVL72 gangs arrive in bursts and must find a
whole rack at once, at the price of racks left idle while only small replicas wait.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from extender.placement.request import GangRequest
from extender.placement.snapshot import ClusterSnapshot

#: Seconds a refused gang counts as waiting after its last refusal. kube-scheduler moves a
#: pod left unschedulable back to its active queue after at most
#: ``podMaxInUnschedulablePodsDuration`` (5 minutes by default), so a gang still waiting is
#: refused again within that time; one not seen for longer was deleted or placed elsewhere.
WAITING_TTL_S = 300.0
#: At most this many waiting gangs are remembered (the oldest refusals go first).
MAX_WAITING = 10_000


class KeepCliques(StrEnum):
    """When placement keeps whole multi-node NVLink cliques for the gangs that ask for one."""

    WHILE_WAITING = "while-waiting"
    ALWAYS = "always"


def with_demand(snap: ClusterSnapshot, waiting: Iterable[GangRequest] | None) -> ClusterSnapshot:
    """``snap`` with :attr:`~ClusterSnapshot.clique_demand` set: whether one of the waiting
    gangs needs a clique (:func:`needs_clique`; None: not known, the snapshot keeps cliques)."""
    if waiting is None or not snap.has_cliques:
        return snap.with_clique_demand(None)
    return snap.with_clique_demand(any(needs_clique(snap, g) for g in waiting))


def needs_clique(snap: ClusterSnapshot, gang: GangRequest) -> bool:
    """Whether the gang asks for a multi-node NVLink clique of ``snap``: a pod set names a
    fabric level (required, preferred, or the level of its colocateWith). A gang that only
    could span a clique (a multi-node gang some clique nodes admit) does not: it runs
    elsewhere too, and counting it would keep the racks idle whenever such a gang waits."""
    fabric = {lv.name for lv in snap.hierarchy.levels if lv.fabric}
    return any(
        ps.required_level in fabric
        or ps.preferred_level in fabric
        or (ps.colocate_with is not None and ps.colocate_with.level in fabric)
        for ps in gang.pod_sets
    )


@dataclass
class WaitingGangs:
    """The gangs the solver refused and that were not placed since, with when they were
    last refused (the time of the caller's clock)."""

    started_at: float
    keep: KeepCliques = KeepCliques.WHILE_WAITING
    ttl_s: float = WAITING_TTL_S
    limit: int = MAX_WAITING
    _gangs: OrderedDict[str, tuple[GangRequest, float]] = field(default_factory=OrderedDict)

    def refused(self, request: GangRequest, now: float) -> None:
        self._gangs.pop(request.name, None)
        self._gangs[request.name] = (request, now)
        while len(self._gangs) > self.limit:
            self._gangs.popitem(last=False)

    def placed(self, gang: str) -> None:
        self._gangs.pop(gang, None)

    def requests(self, now: float, exclude: Iterable[str] = ()) -> list[GangRequest] | None:
        """The gangs waiting at ``now`` but those in ``exclude`` (the ones being placed);
        None (cliques kept whatever waits) under :attr:`KeepCliques.ALWAYS` and while the
        process has run for less than the TTL (not known yet)."""
        while self._gangs:
            _, (_, at) = next(iter(self._gangs.items()))
            if now - at <= self.ttl_s:
                break
            self._gangs.popitem(last=False)
        if self.keep is KeepCliques.ALWAYS or now - self.started_at < self.ttl_s:
            return None
        skip = set(exclude)
        return [r for name, (r, _) in self._gangs.items() if name not in skip]

    def __len__(self) -> int:
        return len(self._gangs)
