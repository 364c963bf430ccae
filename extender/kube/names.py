"""Label, annotation and API names gangslice reads and writes on Kubernetes objects."""

from __future__ import annotations

GROUP = "gangslice.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
NODE_TOPOLOGIES = "nodetopologies"
SLICE_RESERVATIONS = "slicereservations"

#: Pod label ``"true"``: the pod is a restartable replica gangslice may move to drain a domain
#: for a gang that waits (:mod:`extender.controllers.migration`).
MOVABLE = "gangslice.io/movable"
#: Pod annotation: seconds a moved replica takes to serve again (its model load; default 120).
RESTART_SECONDS = "gangslice.io/restart-seconds"
#: Pod label: the plain gang this pod belongs to (gang key ``<namespace>/<value>``).
GANG = "gangslice.io/gang"
#: Pod annotation: how many pods the plain gang has (lets the extender place it on first sight).
GANG_SIZE = "gangslice.io/gang-size"
REQUIRED_LEVEL = "gangslice.io/required-level"
PREFERRED_LEVEL = "gangslice.io/preferred-level"
COMM = "gangslice.io/comm"
#: Workload, PodGroup or plain gang object annotation: how many objects (members) carry the
#: same gang label and form one joint gang.
GANG_MEMBERS = "gangslice.io/gang-members"
#: Pod template annotation: ``<pod set>[@level]`` (or ``<member>[@level]`` in a joint gang) to
#: keep this pod set in one domain with.
COLOCATE_WITH = "gangslice.io/colocate-with"
#: Pod label or annotation: which pod set of the gang this pod is.
POD_SET = "gangslice.io/pod-set"
#: Pod annotation: how many pods this pod's pod set has, in a plain gang of several pod sets
#: (prefill + decode, leader + workers); the sizes add up to ``gang-size``.
POD_SET_SIZE = "gangslice.io/pod-set-size"
#: Pod annotation: the SliceReservation (same namespace) that holds this pod's slot (Kueue path).
RESERVATION = "gangslice.io/reservation"
#: Pod label ``"true"``: gangslice pins this pod's GPU claim (DRA) at creation, so the admission
#: webhook that does it is called with ``failurePolicy: Fail``. gangslice's Kueue admission
#: check adds it to the pod sets that ask for GPUs through a claim; a Volcano job's task
#: templates carry it by hand. Plain gang pods are selected by ``gangslice.io/gang`` instead.
MANAGED = "gangslice.io/managed"
#: Pod annotations written at bind: the GPU indices and NUMA node(s) the pod was given.
GPUS = "gangslice.io/gpus"
NUMA_NODE = "gangslice.io/numa-node"
#: Pod annotation written at bind: the UUIDs of those GPUs (comma-separated, as NVML names
#: them), so ``gangslice preflight`` catches a swap that indices and NUMA nodes cannot show.
GPU_UUIDS = "gangslice.io/gpu-uuids"
#: Pod annotations written at bind: the RDMA NICs next to those GPUs (each GPU's nearest NIC on
#: its NUMA node, comma-separated), and the same NICs spelled as NCCL's ``NCCL_IB_HCA`` (``=``:
#: exact names, so ``mlx5_1`` never matches ``mlx5_10``) and UCX's ``UCX_NET_DEVICES`` (port 1)
#: take them, for a container's environment through the downward API (examples/k8s/llm-d).
NICS = "gangslice.io/nics"
NCCL_IB_HCA = "gangslice.io/nccl-ib-hca"
UCX_NET_DEVICES = "gangslice.io/ucx-net-devices"
#: DRA (written at pod creation by the admission webhook): pod annotation, the slot the pod
#: got (``<pod set>/<index>``; on its ResourceClaim, a label ``<pod set>-<index>``); pod
#: annotation, how many GPUs its claim asks for (the pod requests no ``nvidia.com/gpu``);
#: claim annotation, the node of the slot.
SLOT = "gangslice.io/slot"
CLAIM_GPUS = "gangslice.io/claim-gpus"
SLOT_NODE = "gangslice.io/node"
#: Pod annotation (DRA, written at creation with the slot): the ResourceClaimTemplate the
#: pod's GPU claim is made from, once the pod exists (:mod:`extender.controllers.claims.make`).
CLAIM_TEMPLATE = "gangslice.io/claim-template"
#: Pod annotation (DRA, GB200): the ComputeDomain (same namespace) the gang joins instead of
#: the one gangslice creates for it.
COMPUTE_DOMAIN = "gangslice.io/compute-domain"
#: PodGroup (and plain gang pod) annotation: gangslice's state for the gang (a PodGroup has no
#: status subresource gangslice may write).
STATUS = "gangslice.io/status"
#: SliceReservation labels: the kind and name of the object the reservation is for.
OWNER_KIND_LABEL = "gangslice.io/owner-kind"
OWNER_NAME_LABEL = "gangslice.io/owner-name"
#: Labels on the Volcano HyperNodes ``gangslice hypernodes`` renders: the source (Volcano's
#: discovery uses the same key with its own source name) and the gangslice level.
HYPERNODE_SOURCE_LABEL = "volcano.sh/network-topology-source"
HYPERNODE_LEVEL_LABEL = "gangslice.io/level"
#: The Kueue AdmissionCheck ``controllerName`` gangslice answers to.
CHECK_CONTROLLER = "gangslice.io/topology"
#: Events' ``reportingComponent`` on objects other than Workloads.
EVENT_COMPONENT = "gangslice.io/controller"

GPU_RESOURCE = "nvidia.com/gpu"
#: GPU Feature Discovery node labels.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"

#: Volcano: the PodGroup a pod belongs to (same namespace).
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
#: Volcano: a task's role (label or annotation); the pod set of a PodGroup gang.
VOLCANO_TASK_SPEC = "volcano.sh/task-spec"
#: LeaderWorkerSet: the replica group a pod belongs to (a plain gang per group).
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
#: LeaderWorkerSet: on every pod of one, from its templates (the group index comes later, from
#: the LWS pod webhook, for a leader).
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
#: LeaderWorkerSet: the group's pod count (its ``size``), which the LWS controller writes on each
#: of the group's pods: a plain gang's size when the pod carries no ``gangslice.io/gang-size``.
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
#: What the deployment controller writes on each ReplicaSet of a Deployment: its ``replicas``,
#: ``replicas + maxSurge``, and which revision the ReplicaSet is (:mod:`extender.kube.owners`).
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
REVISION = "deployment.kubernetes.io/revision"
#: NVIDIA's DRA driver: the node label its compute-domain kubelet plugin sets to the UID of the
#: ComputeDomain the node belongs to (``computeDomainLabelKey`` in the driver's code).
COMPUTE_DOMAIN_NODE_LABEL = "resource.nvidia.com/computeDomain"
#: Kueue: the pod set a pod was admitted as.
KUEUE_PODSET = "kueue.x-k8s.io/podset"
#: Kueue TAS pod template annotations: the required and preferred topology (node label keys)
#: and the pod set group (leader + workers placed together).
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_PODSET_GROUP_NAME = "kueue.x-k8s.io/podset-group-name"

#: On the controller pod that holds the leader lease: "true". The Service selects it, so
#: kube-scheduler and Volcano reach the one replica that decides.
LEADER_LABEL = "gangslice.io/leader"

#: Reservation meta: the kind of object that owns it (written by the controllers). Holds
#: owned by these kinds live as long as their owner, not for a TTL.
META_OWNER_KIND = "ownerKind"
META_OWNER_NAME = "ownerName"
META_OWNER_UID = "ownerUid"
META_OWNER_API_VERSION = "ownerApiVersion"
#: Reservation meta: "true" when its slots are pinned by per-slot ResourceClaims (DRA nodes).
META_SLOT_CLAIMS = "slotClaims"
#: Reservation meta: whom a hold is kept for when it is nobody's own reservation yet (a
#: migration's, :mod:`extender.reservations.handover`): ``gang:<key>`` or ``owner:<uid>``.
META_HELD_FOR = "heldFor"
OWNER_MANAGED_KINDS = frozenset({"Workload", "PodGroup"})
#: The MutatingWebhookConfiguration of the DRA pinning webhook (manifests/dra/webhook.yaml).
WEBHOOK_CONFIGURATION = "gangslice-dra"


def label_value(text: str) -> str:
    """A label value: at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:63]
    return cleaned.strip("._-")
