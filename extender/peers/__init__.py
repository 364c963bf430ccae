"""What peer schedulers would decide for the same gang on the same snapshot, side by side.

Each policy is re-implemented from the peers' documented behaviour (shared/reference:
peers.md, kueue-admission-checks.md section 7, kube-scheduler-extender-and-volcano.md
section 2c) and from a reading of the peers' code, none of it copied: Kueue's v0.19.2,
Volcano's v1.14.1 and KAI's (each module cites the upstream files). All of them:

- are all-or-nothing, like the gangslice solver: pods are placed one by one on a working
  copy of the free GPUs, and if any pod finds no room the gang is :class:`Unplaceable`;
- choose nodes only. The exact GPUs are what the node hands out once the node is fixed: on a
  device-plugin node, the stock NVIDIA device plugin's ``GetPreferredAllocation``
  (go-gpuallocator's best-effort policy, predicted by :mod:`extender.placement.choice`),
  which no scheduler can steer; where the plugin has no usable answer, and on DRA nodes
  (the peers write no claim that names devices), the kubelet's or driver's *first free*
  (the lowest free GPU indices);
- never book a GPU that is taken, unhealthy or reserved, nor one GPU twice (the capacity
  rules). They may break gangslice's topology rules (a TP group across a socket, a pod set
  across leaves): :func:`extender.placement.scoring.violations` reports that, and
  :func:`~extender.placement.scoring.gang_micros` prices it with the same yardstick;
- know nothing of multi-node NVLink (IMEX) channels, nor of the kubelet's Topology Manager:
  they choose a node its kubelet then refuses at admission (``TopologyAffinityError``, see
  :mod:`extender.placement.numa_fit`), and such a gang does not run. The GPUs a pod gets
  there are the first free ones of the NUMA nodes the kubelet aligns it to;
- keep kube-scheduler's NodeUnschedulable, TaintToleration, NodeAffinity and NodeResourcesFit
  filters for every pod (:mod:`extender.placement.feasibility`), as kube-scheduler itself,
  Kueue TAS (``fillLeafCounts`` counts the pods whose requests fit each node that passes the
  pod's node selector, affinity and tolerations) and Volcano's predicates plugin do.

Ties that the real schedulers break at random are broken here by snapshot order, so a
comparison is repeatable; KAI breaks its own ties, by node name and domain id, and keeps them.
"""

from __future__ import annotations

from extender.peers.common import Policy
from extender.peers.kai import kai
from extender.peers.kube_scheduler import binpack, spread
from extender.peers.kueue import kueue_tas
from extender.peers.volcano import volcano
from extender.placement import solver

#: Every policy ``gangslice place --policy``, the simulator and the benchmarks know, gangslice first.
POLICIES: dict[str, Policy] = {
    "gangslice": solver.place,
    "spread": spread,
    "binpack": binpack,
    "kueue-tas": kueue_tas,
    "volcano": volcano,
    "kai": kai,
}

__all__ = ["POLICIES", "Policy", "binpack", "kai", "kueue_tas", "spread", "volcano"]
