"""The default kube-scheduler, pod by pod: ``spread`` (LeastAllocated) and ``binpack``
(MostAllocated)."""

from __future__ import annotations

from extender.peers.common import Core, Fail, Work, admitted, place_by_score, run_policy
from extender.placement.request import GangRequest
from extender.placement.slice import Placement
from extender.placement.snapshot import ClusterSnapshot


def _per_pod(most: bool) -> Core:
    def core(snap: ClusterSnapshot, gang: GangRequest, work: Work) -> Fail | None:
        for ps in gang.pod_sets:
            fail = place_by_score(work, ps, admitted(snap, ps, range(len(snap.nodes))), most)
            if fail is not None:
                return fail
        return None

    return core


def spread(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """The default kube-scheduler, pod by pod (pkg/scheduler: Filter ``NodeResourcesFit`` ->
    Score ``NodeResourcesFit`` with the ``LeastAllocated`` strategy + ``BalancedAllocation`` ->
    selectHost).

    Scored over GPUs as if ``nvidia.com/gpu`` were a scoring resource (the stock profile scores
    cpu and memory only; we know only GPUs, which stand in for requests that scale with them).
    With a single resource ``BalancedAllocation`` is the same for every node, so it drops out.
    All feasible nodes are scored (``percentageOfNodesToScore`` 100); the default soft
    PodTopologySpread is not modelled (it would only spread more). GPUs: as the node hands them out.
    """
    return run_policy(snapshot, gang, _per_pod(most=False), "spread")


def binpack(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """kube-scheduler with ``NodeResourcesFit`` scoring strategy ``MostAllocated`` (the usual
    bin-packing profile for GPU clusters); otherwise exactly :func:`spread`."""
    return run_policy(snapshot, gang, _per_pod(most=True), "binpack")
