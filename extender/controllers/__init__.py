"""Every reconcile loop of gangslice, each in its own sub-package, and the one runner of them.

- ``kueue/``: the Kueue AdmissionCheck that holds a Workload until its slice is reserved;
- ``podgroups/``: Volcano PodGroups as gangs (and ``gangslice hypernodes``);
- ``plain_gangs/``: tells the pods of a plain gang that can never fit;
- ``claims/``: DRA slots whose pinned devices someone else took are re-planned;
- ``topology_status/``: the ``Accepted`` / ``DevicesMatched`` conditions of NodeTopologies;
- ``mismatch/``: pods the kubelet gave other GPUs than promised, told or evicted;
- ``webhook_ca/``: the DRA webhook's caBundle.

``runner.py`` runs them all: the Lease election (:mod:`.leader`), kopf's watches of Workloads,
AdmissionChecks and PodGroups (:mod:`.handlers`), the pod events of the cluster cache's own
watch (:mod:`.pods`) and the leader's periodic pass (:mod:`.housekeeping`). Joint gangs
(:mod:`.joint`), owned reservations (:mod:`.owned`, :mod:`.objects`) and what ``gangslice
explain`` says (:mod:`.explain`) are shared; no reconciler imports another (``make lint``).
"""
