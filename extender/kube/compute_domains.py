"""ComputeDomains for gangs placed across a multi-node NVLink clique (GB200 NVL72, IMEX).

Multi-node NVLink needs an IMEX channel in each pod, which NVIDIA's DRA driver provides only
through a ComputeDomain (``resource.nvidia.com/v1beta1``, namespaced). For a gang whose slice
uses multi-node NVLink (the slice's ``mnnvlNodes``), the admission webhook points each of its
pods on such a node at the node's channel claim, and once the pod exists the claims
controller (:mod:`extender.controllers.claims.make`):

- creates the gang's ComputeDomain ``<reservation>-imex`` (owned by the SliceReservation, so it
  goes with the gang; ``numNodes: 0`` as the driver recommends with IMEX daemons named by DNS;
  its channel ResourceClaimTemplate is the driver's to create), or adopts the one the pod names
  in ``gangslice.io/compute-domain``;
- creates the node's channel claim ``<reservation>-imex-<node>`` with the ComputeDomain's UID
  as ``domainID``. One claim per node, not the ComputeDomain's template:
  a node advertises only ``channel-0``, so several pods of the gang on one node must share one
  claim (a template would give each pod a claim of its own, and the second could never be
  allocated).

The driver's constraints that placement keeps:

- a node belongs to one ComputeDomain at a time (the driver's kubelet plugin labels it
  :data:`NODE_LABEL` ``=<uid>`` when it prepares a channel there, refuses a channel of another
  domain while the label stays, and removes it once the node's workloads are unprepared). The
  solver models it as one IMEX channel per node held by one gang (``mnnvlNodes`` in the
  ledger), so a second gang on the same clique never shares a node with the first; and the
  cluster cache reads the label (:func:`label_holder`): a node labelled with a domain none of
  gangslice's channel claims names (a domain gangslice did not create, nor a gang adopted) is
  no fit for any gang's multi-node pod set (``NodeState.foreign_domain``). A gang that adopts
  a domain other workloads already run on cannot use those nodes either: each holds the
  node's only channel.
- room for the IMEX daemon pod the driver starts on each node of the domain
  (:data:`extender.placement.feasibility.IMEX_DAEMON`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from extender.kube import dra, names
from extender.kube.api import COMPUTE_DOMAINS, Conflict, KubeClient, as_map
from extender.placement import quantities
from extender.placement.feasibility import IMEX_DAEMON, Resources

API_VERSION = "resource.nvidia.com/v1beta1"
#: The DeviceClass of a ComputeDomain's IMEX channel (NVIDIA's chart).
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
#: The name of the channel claim in the pod's ``resourceClaims`` (and its containers' claims).
POD_CLAIM = "imex-channel"
#: The node label NVIDIA's driver sets to the UID of the ComputeDomain the node belongs to.
NODE_LABEL = names.COMPUTE_DOMAIN_NODE_LABEL


def _dns(raw: str, limit: int = 253) -> str:
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", raw.lower()).strip("-.")
    return cleaned[:limit].rstrip("-.")


def domain_name(reservation_name: str) -> str:
    return _dns(f"{reservation_name}-imex")


def channel_claim_name(reservation_name: str, node: str) -> str:
    return _dns(f"{reservation_name}-imex-{node}")


def _owner(reservation: Mapping[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": names.API_VERSION,
            "kind": "SliceReservation",
            "name": reservation["name"],
            "uid": reservation["uid"],
            "blockOwnerDeletion": True,
        }
    ]


def build_domain(namespace: str, reservation: Mapping[str, str]) -> dict[str, Any]:
    """The gang's ComputeDomain (``reservation``: name and uid of the SliceReservation)."""
    name = domain_name(reservation["name"])
    return {
        "apiVersion": API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                names.OWNER_KIND_LABEL: "SliceReservation",
                names.OWNER_NAME_LABEL: names.label_value(reservation["name"]),
            },
            "ownerReferences": _owner(reservation),
        },
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": _dns(f"{name}-channel")},
                "allocationMode": "Single",
            },
        },
    }


def build_channel_claim(
    namespace: str, node: str, domain_uid: str, reservation: Mapping[str, str]
) -> dict[str, Any]:
    """The claim every pod of the gang on ``node`` shares: one IMEX channel of the domain."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": channel_claim_name(reservation["name"], node),
            "namespace": namespace,
            "labels": {
                names.OWNER_KIND_LABEL: "SliceReservation",
                names.OWNER_NAME_LABEL: names.label_value(reservation["name"]),
            },
            "annotations": {names.SLOT_NODE: node},
            "ownerReferences": _owner(reservation),
        },
        "spec": {
            "devices": {
                "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
                "config": [
                    {
                        "requests": ["channel"],
                        "opaque": {
                            "driver": dra.COMPUTE_DOMAIN_DRIVER,
                            "parameters": {
                                "apiVersion": API_VERSION,
                                "kind": "ComputeDomainChannelConfig",
                                "domainID": domain_uid,
                                "allocationMode": "Single",
                            },
                        },
                    }
                ],
            }
        },
    }


class ComputeDomains:
    """The one writer of ComputeDomains (through the one client)."""

    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def ensure(self, domain: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``domain``, or return the one of that name already there."""
        meta = domain["metadata"]
        try:
            return await self._api.create(COMPUTE_DOMAINS, domain)
        except Conflict:
            return await self._api.get(COMPUTE_DOMAINS, meta["name"], meta["namespace"])


def channel_domain(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """(the ComputeDomain UID, the SliceReservation name) of one of gangslice's channel claims
    (:func:`build_channel_claim`), or None for any other claim."""
    meta = as_map(claim.get("metadata"))
    owner = next(
        (
            str(o.get("name"))
            for o in meta.get("ownerReferences") or ()
            if isinstance(o, Mapping) and o.get("kind") == "SliceReservation" and o.get("name")
        ),
        None,
    )
    if owner is None:
        return None
    for entry in as_map(as_map(claim.get("spec")).get("devices")).get("config") or ():
        opaque = as_map(as_map(entry).get("opaque"))
        params = as_map(opaque.get("parameters"))
        if opaque.get("driver") == dra.COMPUTE_DOMAIN_DRIVER and params.get("domainID"):
            return str(params["domainID"]), owner
    return None


def label_holder(uid: str) -> str:
    """A node's ComputeDomain no gang here holds, in words."""
    return f"ComputeDomain {uid} (node label {NODE_LABEL}), which no gang of gangslice's created or adopted"


def daemon_requests(text: str) -> Resources:
    """What the IMEX daemon pod takes of a node, from ``cpu=100m,memory=128Mi`` (the requests
    of the driver's ``controller.containers.computeDomain.resources``; empty: none), plus its
    pod slot."""
    got = {"cpu": 0, "memory": 0, "ephemeral-storage": 0}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in got:
            raise ValueError(f"{part!r}: expected cpu=, memory= or ephemeral-storage= with a quantity")
        try:
            got[key] = quantities.milli(value.strip()) if key == "cpu" else quantities.whole(value.strip())
        except quantities.QuantityError as exc:
            raise ValueError(f"{key}: {exc}") from None
    return Resources(got["cpu"], got["memory"], got["ephemeral-storage"], IMEX_DAEMON.pods)
