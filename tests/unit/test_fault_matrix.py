"""Fault injection on every write (issue: every crash window proven): each API call of
bind, reserve, save, release and the leader hand-over fails, or the process dies just
before it or is killed right after it, for each gang source (plain gangs, Volcano
PodGroups, Kueue Workloads, joint gangs of either); the process (or a fresh one, after a
death) carries on. After each: no GPU booked twice, no reservation leaked, every gang
placed or waiting with a reason; once the gangs end, nothing is left. The harness is
extender/testing/faults.py.

The matrix, as a table (points x sources, and how many cells are green):
``.venv/bin/pytest -q -s tests/unit/test_fault_matrix.py -k summary``."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from extender.kube import names
from extender.placement.files import load_cluster
from extender.testing.extender import gang_pod
from extender.testing.faults import ARRIVE, BIND, FINISH, LEAD, Fault, Point, Verdict, World, matrix_line
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube

REPO = Path(__file__).resolve().parents[2]
VOLCANO = REPO / "tests" / "fixtures" / "volcano"
GB200 = load_cluster(VOLCANO / "gb200.yaml")  # 3 free trays of 4 GPUs (c1-0 is taken)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the gang sources -----------------------------------------------------------------------
class PlainGangs:
    """Two plain gangs (pods labelled gangslice.io/gang): 2 pods and 1 pod of 4 GPUs, the
    cluster's 12 free GPUs all told, through kube-scheduler's filter and bind."""

    name = "plain"
    PODS = (("a-0", "a", 2), ("a-1", "a", 2), ("b-0", "b", 1))

    def setup(self, kube: FakeKube) -> None:
        for pod, gang, size in self.PODS:
            kube.put("pods", gang_pod(pod, gang, size, 4))

    def arrived(self, kube: FakeKube) -> None:
        pass

    def gangs(self, kube: FakeKube) -> dict[str, str]:
        out: dict[str, str] = {}
        for pod in kube.objects("pods"):
            gang = f"{pod['metadata']['namespace']}/{pod['metadata']['labels'][names.GANG]}"
            if not pod["spec"].get("nodeName"):
                out[gang] = "pending"
            else:
                out.setdefault(gang, "")
        return out

    def finish(self, kube: FakeKube) -> None:
        for pod in kube.objects("pods"):
            kube.remove("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])


class PodGroups:
    """Two Volcano PodGroups of one 4-GPU pod each, through the PodGroup controller and
    Volcano's predicate and allocate (Volcano binds the pod itself)."""

    name = "podgroup"
    joint = False

    def setup(self, kube: FakeKube) -> None:
        for group in ("podgroup-prefill.yaml", "podgroup-decode.yaml"):
            pg = copy.deepcopy(load_fixture(f"volcano/{group}"))
            if not self.joint:
                pg["metadata"]["labels"].pop(names.GANG, None)
                for key in ("gangslice.io/gang-members", "gangslice.io/colocate-with"):
                    pg["metadata"]["annotations"].pop(key, None)
            kube.put("podgroups", pg)
        for pod in load_fixture("volcano/pods-disagg.yaml"):
            kube.put("pods", pod)

    def arrived(self, kube: FakeKube) -> None:
        pass

    def gangs(self, kube: FakeKube) -> dict[str, str]:
        out = {}
        bound = {
            (p["metadata"].get("annotations") or {}).get(names.VOLCANO_GROUP)
            for p in kube.objects("pods")
            if p["spec"].get("nodeName")
        }
        for pg in kube.objects("podgroups"):
            if (pg.get("status") or {}).get("phase") == "Completed":
                continue
            name = pg["metadata"]["name"]
            status = (pg["metadata"].get("annotations") or {}).get(names.STATUS, "")
            out[f"{pg['metadata']['namespace']}/{name}"] = "" if name in bound else (status or "?")
        return out

    def finish(self, kube: FakeKube) -> None:
        for pg in kube.objects("podgroups"):
            pg.setdefault("status", {})["phase"] = "Completed"
            kube.put("podgroups", pg)


class JointPodGroups(PodGroups):
    """A joint gang: the prefill and decode PodGroups of one gang, placed together."""

    name = "joint-pg"
    joint = True


def _workload(name: str, uid: str) -> dict[str, Any]:
    """The recorded LWS Workload reshaped as one 4-GPU pod on the GB200 flavor."""
    wl: dict[str, Any] = copy.deepcopy(load_fixture("kueue/workload-lws.yaml"))
    wl["metadata"].update(name=name, uid=uid)
    ps = wl["spec"]["podSets"][1]
    ps.update(count=1)
    ps.pop("topologyRequest", None)
    ps["template"]["spec"]["containers"][0]["resources"] = {"limits": {names.GPU_RESOURCE: "4"}}
    wl["spec"]["podSets"] = [ps]
    psa = wl["status"]["admission"]["podSetAssignments"][1]
    psa.update(count=1, flavors={names.GPU_RESOURCE: "gb200"}, resourceUsage={names.GPU_RESOURCE: "4"})
    wl["status"]["admission"]["podSetAssignments"] = [psa]
    wl["status"]["admissionChecks"] = [e for e in wl["status"]["admissionChecks"] if e["name"] == "gangslice"]
    return wl


def _finished(wl: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Finished" for c in wl["status"].get("conditions") or [])


class Workloads:
    """Two Kueue Workloads of one 4-GPU pod each, through the AdmissionCheck; Kueue's job
    controller makes the pods of a Ready Workload (with its podSetUpdates), kube-scheduler
    filters and binds them."""

    name = "kueue"

    def setup(self, kube: FakeKube) -> None:
        kube.put("admissionchecks", load_fixture("kueue/admissioncheck.yaml"))
        for i in range(2):
            kube.put("workloads", _workload(f"wl-{i}", f"11111111-2222-4333-8444-55555555550{i}"))

    def _entry(self, wl: Mapping[str, Any]) -> dict[str, Any]:
        got = [e for e in wl["status"].get("admissionChecks") or [] if e["name"] == "gangslice"]
        return dict(got[0]) if got else {}

    def arrived(self, kube: FakeKube) -> None:
        for wl in kube.objects("workloads"):
            entry = self._entry(wl)
            name = f"{wl['metadata']['name']}-0"
            if entry.get("state") != "Ready" or _finished(wl):
                continue
            if kube.peek("pods", name, wl["metadata"]["namespace"]):
                continue
            update = (entry.get("podSetUpdates") or [{}])[0]
            tmpl = wl["spec"]["podSets"][0]["template"]
            pod = {
                "metadata": {
                    "name": name,
                    "namespace": wl["metadata"]["namespace"],
                    "uid": f"uid-{name}",
                    "labels": {**(tmpl["metadata"].get("labels") or {}), **(update.get("labels") or {})},
                    "annotations": {
                        **(tmpl["metadata"].get("annotations") or {}),
                        **(update.get("annotations") or {}),
                    },
                },
                "spec": {
                    **copy.deepcopy(tmpl["spec"]),
                    "schedulerName": "gangslice-scheduler",
                    "nodeSelector": dict(update.get("nodeSelector") or {}),
                },
                "status": {"phase": "Pending"},
            }
            kube.put("pods", pod)

    def gangs(self, kube: FakeKube) -> dict[str, str]:
        out = {}
        for wl in kube.objects("workloads"):
            if _finished(wl):
                continue
            key = f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"
            pod = kube.peek("pods", f"{wl['metadata']['name']}-0", wl["metadata"]["namespace"])
            entry = self._entry(wl)
            placed = pod is not None and pod["spec"].get("nodeName")
            out[key] = "" if placed else f"{entry.get('state')}: {entry.get('message') or '?'}"
        return out

    def finish(self, kube: FakeKube) -> None:
        for wl in kube.objects("workloads"):
            wl["status"].setdefault("conditions", []).append(
                {
                    "type": "Finished",
                    "status": "True",
                    "reason": "Succeeded",
                    "message": "done",
                    "lastTransitionTime": _now(),
                }
            )
            kube.put("workloads", wl)
        for pod in kube.objects("pods"):
            kube.remove("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])


class JointWorkloads(Workloads):
    """A joint gang of two Kueue Workloads (prefill, and decode colocated with it in one
    NVLink clique), Ready together."""

    name = "joint-kueue"

    def setup(self, kube: FakeKube) -> None:
        kube.put("admissionchecks", load_fixture("kueue/admissioncheck.yaml"))
        for i, role in enumerate(("prefill", "decode")):
            wl = _workload(f"disagg-{role}", f"11111111-2222-4333-8444-55555555551{i}")
            meta = wl["metadata"]
            meta["labels"][names.GANG] = "disagg"
            meta["annotations"]["gangslice.io/gang-members"] = "2"
            if role == "decode":
                meta["annotations"]["gangslice.io/colocate-with"] = "disagg-prefill@clique"
            kube.put("workloads", wl)


SOURCES = {s.name: s for s in (PlainGangs(), PodGroups(), Workloads(), JointPodGroups(), JointWorkloads())}

#: The points: every write of the reserve, save, bind and release paths, and the hand-over.
POINTS = (
    Point("reserve", "apply slicereservations", ARRIVE),
    Point("save", "apply slicereservations/status", ARRIVE),
    Point("bind", "create pods/binding", BIND),
    Point("bind-save", "apply slicereservations", BIND),
    Point("bind-status", "apply slicereservations/status", BIND),
    Point("owner-status", "apply workloads/status|replace podgroups", ARRIVE),
    Point("event", "create events", ARRIVE),
    Point("release", "delete slicereservations", FINISH),
    Point("handover", "list slicereservations", LEAD),
)
#: Which points each source's path makes (Volcano binds its pods itself).
NOT_MADE = {
    ("podgroup", "bind"),
    ("joint-pg", "bind"),  # Volcano binds its pods itself
    # A plain gang has no owner object, and its reporter writes only for a gang that
    # can never fit (tests/unit/test_plain_gangs.py).
    ("plain", "owner-status"),
    ("plain", "event"),
    # Joint Workloads say Ready on the Workloads' status alone (no SliceReserved Event).
    ("joint-kueue", "event"),
    # The reserving filter awaits only the object (the promise); its status is written
    # behind, with the gang's binds (bind-status), or before the bind when the background
    # writer comes first (test_plain_status_written_behind_before_the_bind).
    ("plain", "save"),
}
FAULTS = [Fault(p, mode) for p in POINTS for mode in ("fail", "die", "kill")]
CELLS = [(s, f) for s in SOURCES for f in FAULTS if (s, f.point.name) not in NOT_MADE]
RESULTS: dict[tuple[str, str], Verdict] = {}


def run_cell(source: str, fault: Fault | None) -> Verdict:
    world = World(SOURCES[source], GB200)
    verdict = asyncio.run(world.run(fault))
    if fault is not None:
        RESULTS[(source, fault.id)] = verdict
    return verdict


@pytest.mark.parametrize("source", list(SOURCES))
def test_without_faults_every_gang_is_placed_and_nothing_is_left(source: str) -> None:
    v = run_cell(source, None)
    assert v.placed.ok and not v.placed.waiting, v.log
    assert v.placed.placed, v.log
    assert v.finished.ok and not v.finished.placed and not v.finished.waiting, v.log


@pytest.mark.parametrize(("source", "fault"), CELLS, ids=[f"{s}-x-{f.id}" for s, f in CELLS])
def test_matrix(source: str, fault: Fault) -> None:
    v = run_cell(source, fault)
    print("\n" + matrix_line(source, fault.id, v))
    assert v.fired is not None, f"the path never made {fault.point.label} in {fault.point.phase}"
    assert not v.placed.double_booked and not v.finished.double_booked, v.placed.double_booked
    assert not v.placed.leaked and not v.finished.leaked, (v.placed.leaked, v.finished.leaked, v.log)
    assert not v.placed.unexplained, (v.placed.waiting, v.log)
    assert not v.broken, (v.broken, v.log)
    # After a fault and its repair every gang is placed (the cluster has room for all).
    assert not v.placed.waiting, (v.placed.waiting, v.log)
    assert not v.finished.placed and not v.finished.waiting


def test_matrix_summary() -> None:
    """Prints the matrix (points x sources); runs the cells this pytest run has not."""
    for s, f in CELLS:
        if (s, f.id) not in RESULTS:
            run_cell(s, f)
    sources = list(SOURCES)
    faults = [f.id for f in FAULTS]
    lines = ["fault".ljust(18) + "".join(s.ljust(12) for s in sources)]
    for f in faults:
        row = f.ljust(18)
        for s in sources:
            v = RESULTS.get((s, f))
            cell = "n/a" if v is None else "ok" if v.ok else "BAD"
            row += cell.ljust(12)
        lines.append(row)
    ok = sum(v.ok for v in RESULTS.values())
    lines.append(f"{len(RESULTS)} cells, {ok} green")
    print("\n" + "\n".join(lines))
    assert ok == len(RESULTS)


@pytest.mark.parametrize("mode", ["fail", "die", "kill"])
def test_plain_status_written_behind_before_the_bind(mode: str) -> None:
    """A plain gang's status write-behind comes between the reserving filter's reply and the
    bind (the other order is the matrix's bind-status cells): it fails, or the process dies
    before it or right after it; the promise (the object) is already saved, so after a
    restart nothing is booked twice or lost, and every gang is placed."""
    world = World(SOURCES["plain"], GB200, write_behind_first=True)
    v = asyncio.run(world.run(Fault(Point("save", "apply slicereservations/status", ARRIVE), mode)))
    assert v.ok, (matrix_line("plain", f"save-{mode}", v), v.log)
    assert not v.placed.waiting, v.log


def test_a_filter_whose_reservation_cannot_be_saved_answers_unschedulable_and_holds_nothing() -> None:
    fault = Fault(POINTS[0], "fail")
    world = World(SOURCES["plain"], GB200)
    v = asyncio.run(world.run(fault))
    first = v.log[0]
    assert first.startswith("a-0: filter: gang llm/a: the reservation could not be saved (503: injected")
    assert first.endswith("nothing is held, will retry")
    # The next member's filter placed the gang afresh and saved it; a-0 bound on a retry.
    assert v.log[1] == "a-1: bind c2-0: ok" and any(line.startswith("a-0: bind") for line in v.log[2:])
    assert not v.broken and not v.placed.waiting, v.log
