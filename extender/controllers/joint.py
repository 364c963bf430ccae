"""Gangs that span several objects (prefill + decode): the rules (no I/O).

Two or more Workloads (or two or more PodGroups) in one namespace that carry the same label
``gangslice.io/gang: NAME`` and the annotation ``gangslice.io/gang-members: N`` form one
joint gang, key ``<namespace>/NAME``. (Plain gang pods with one ``gangslice.io/gang`` label
are one gang already, its pod sets sized by ``gangslice.io/pod-set-size``: see
:mod:`extender.kube.gangs`.) Nothing is placed until all N members are present;
then the members' requests are placed as ONE gang request whose pod sets are the members'
pod sets named ``<member>.<pod set>``. A member may ask to sit next to another with
``gangslice.io/colocate-with: <member or pod set>[@level]`` (level default: the finest
hierarchy level), so a KV transfer from prefill to decode stays on NVLink.

The joint slice is then cut back into one slice per member (its pod sets under their own
names), so each member's reservation is keyed and pinned as for a lone gang; the
controllers create all of them in one pass, or none.

Both controllers (Kueue Workloads, Volcano PodGroups) take a joint gang through the same
steps here: find its members (:func:`members`), wait for the missing ones up to a limit
(:class:`MemberWait`), build the one request (:func:`joint_request`) and cut the slice
(:func:`splitter`); what each writes on its objects is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from extender.kube import names
from extender.kube.pods import digits
from extender.placement.request import Colocation, GangRequest, PodSet, split_colocation
from extender.placement.scoring import resolve_level
from extender.placement.slice import PodSlot, Slice
from extender.topology.hierarchy import Hierarchy

#: Between a member's name and its pod set's in the joint request.
SEP = "."

T = TypeVar("T")


class JointError(ValueError):
    """A joint gang that cannot be formed; the message says why."""


@dataclass(frozen=True, slots=True)
class Membership:
    """What an object declares: the joint gang's label and how many objects make it."""

    gang: str
    members: int
    colocate_with: str | None = None


def membership(labels: Mapping[str, str], annotations: Mapping[str, str]) -> Membership | None:
    """The joint gang an object belongs to, or None when it is a lone gang. Raises JointError
    for a member count that is not a number of at least 2."""
    gang = labels.get(names.GANG)
    raw = annotations.get(names.GANG_MEMBERS)
    if not gang or raw is None:
        return None
    count = digits(raw)
    if count is None or count < 2:
        raise JointError(f"{names.GANG_MEMBERS}={raw!r} is not a member count of at least 2")
    return Membership(gang, count, annotations.get(names.COLOCATE_WITH) or None)


def expected_members(declared: Sequence[Membership]) -> int:
    counts = {m.members for m in declared}
    if len(counts) > 1:
        raise JointError(f"members declare different {names.GANG_MEMBERS} counts: {sorted(counts)}")
    return counts.pop()


def parse_colocate(text: str) -> tuple[str, str | None]:
    """``decode@clique`` -> (``decode``, ``clique``); ``decode`` -> (``decode``, None)."""
    try:
        return split_colocation(text)
    except ValueError:
        raise JointError(f"{names.COLOCATE_WITH}={text!r} names no member or pod set") from None


def members(
    objects: Iterable[T], gang: str, declared: Callable[[T], Membership | None]
) -> list[tuple[T, Membership]]:
    """The objects that declare themselves members of joint gang ``gang`` (``objects`` of one
    namespace). One whose declaration does not read is left out: its own reconcile says why."""
    out = []
    for obj in objects:
        try:
            m = declared(obj)
        except JointError:
            continue
        if m is not None and m.gang == gang:
            out.append((obj, m))
    return out


@dataclass(frozen=True, slots=True)
class Short:
    """A joint gang short of members: which are missing, in words, and whether the members
    present have waited for them longer than they may."""

    absent: str
    timed_out: bool


@dataclass
class MemberWait:
    """When each joint gang (by joint key) was first seen short of members."""

    since: dict[str, float] = field(default_factory=dict)

    def short(
        self, jkey: str, declared: Mapping[str, Membership], expected: int, now: float, wait_s: float
    ) -> Short | None:
        """None once every member is there (the wait is forgotten), else what is missing."""
        if len(declared) >= expected:
            self.since.pop(jkey, None)
            return None
        since = self.since.setdefault(jkey, now)
        return Short(missing(declared, expected), now - since >= wait_s)

    def forget(self, jkey: str) -> None:
        """Start the wait afresh next time (the members gave up and will come again)."""
        self.since.pop(jkey, None)


def referenced(declared: Mapping[str, Membership]) -> set[str]:
    """Member names the present members colocate with (``member`` or ``member.podset``)."""
    out = set()
    for m in declared.values():
        if m.colocate_with:
            target, _ = parse_colocate(m.colocate_with)
            out.add(target.split(SEP, 1)[0])
    return out


def missing(declared: Mapping[str, Membership], expected: int) -> str:
    """Which members are missing, in words: those named by a colocate-with, then a count."""
    named = sorted(referenced(declared) - set(declared))
    unnamed = expected - len(declared) - len(named)
    parts = list(named)
    if unnamed > 0:
        parts.append(f"{unnamed} unnamed member(s)")
    return ", ".join(parts) if parts else "none"


def _target_pod_set(target: str, requests: Mapping[str, GangRequest], member: str) -> str:
    if target in requests:
        return f"{target}{SEP}{requests[target].pod_sets[0].name}"
    head, _, tail = target.partition(SEP)
    if tail and head in requests and any(ps.name == tail for ps in requests[head].pod_sets):
        return target
    owners = [m for m, r in requests.items() if m != member and any(ps.name == target for ps in r.pod_sets)]
    if len(owners) == 1:
        return f"{owners[0]}{SEP}{target}"
    if len(owners) > 1:
        raise JointError(
            f"member {member}: {names.COLOCATE_WITH} {target!r} is a pod set of {sorted(owners)}"
        )
    raise JointError(
        f"member {member}: {names.COLOCATE_WITH} {target!r} names no member or pod set of the gang"
    )


def joint_request(
    key: str, requests: Mapping[str, GangRequest], colocate: Mapping[str, str], h: Hierarchy
) -> GangRequest:
    """One request for all members (``requests`` by member name); ``colocate`` holds each
    member's ``gangslice.io/colocate-with`` value, applied to its pod sets that name none."""
    finest = h.levels[-1].name if h.levels else "node"
    pod_sets: list[PodSet] = []
    for member in sorted(requests):
        if SEP in member:
            raise JointError(f"member name {member!r} contains {SEP!r}")
        wish: Colocation | None = None
        if member in colocate:
            target, level = parse_colocate(colocate[member])
            try:
                resolve_level(level or finest, h)
            except ValueError as exc:
                raise JointError(f"member {member}: {names.COLOCATE_WITH}: {exc}") from None
            wish = Colocation(_target_pod_set(target, requests, member), level or finest)
        for ps in requests[member].pod_sets:
            own = ps.colocate_with
            if own is not None:
                own = Colocation(f"{member}{SEP}{own.pod_set}", own.level)
            pod_sets.append(replace(ps, name=f"{member}{SEP}{ps.name}", colocate_with=own or wish))
    try:
        return GangRequest(name=key, pod_sets=tuple(pod_sets))
    except ValueError as exc:
        raise JointError(str(exc)) from None


def splitter(member_keys: Mapping[str, str]) -> Callable[[Slice], dict[str, Slice]]:
    """:func:`split` as the reserve path takes it: the parts keyed by member gang key."""
    return lambda sl: {member_keys[m]: part for m, part in split(sl, member_keys).items()}


def split(sl: Slice, member_keys: Mapping[str, str]) -> dict[str, Slice]:
    """The joint slice cut into one slice per member (``member_keys``: member -> gang key),
    pod sets under their own names. A node's multi-node NVLink channel goes to the first
    member (by name) with a pod there, so the ledger sees no two reservations share it."""
    by_member: dict[str, list[PodSlot]] = {m: [] for m in member_keys}
    for s in sl.slots:
        member, _, own = s.pod_set.partition(SEP)
        by_member[member].append(replace(s, pod_set=own))
    claimed: set[str] = set()
    out: dict[str, Slice] = {}
    for member in sorted(member_keys):
        slots = by_member[member]
        nodes = {s.node for s in slots}
        mnnvl = tuple(n for n in sl.mnnvl_nodes if n in nodes and n not in claimed)
        claimed.update(mnnvl)
        prefix = f"{member}{SEP}"
        out[member] = Slice(
            gang=member_keys[member],
            slots=tuple(slots),
            pod_set_micros={
                k[len(prefix) :]: v for k, v in sl.pod_set_micros.items() if k.startswith(prefix)
            },
            score=sl.score,
            domains={k[len(prefix) :]: v for k, v in sl.domains.items() if k.startswith(prefix)},
            notes=sl.notes,
            mnnvl_nodes=mnnvl,
        )
    return out
