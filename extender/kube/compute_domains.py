"""ComputeDomains for gangs placed across a multi-node NVLink clique (GB200 NVL72, IMEX).

Multi-node NVLink needs an IMEX channel in each pod, which NVIDIA's DRA driver provides only
through a ComputeDomain (``resource.nvidia.com/v1beta1``, namespaced). For a gang whose slice
uses multi-node NVLink (the slice's ``mnnvlNodes``) gangslice, at the admission of each of its
pods on such a node:

- creates the gang's ComputeDomain ``<reservation>-imex`` (owned by the SliceReservation, so it
  goes with the gang; ``numNodes: 0`` as the driver recommends with IMEX daemons named by DNS;
  its channel ResourceClaimTemplate is the driver's to create), or adopts the one the pod names
  in ``gangslice.io/compute-domain``;
- points the pod at the node's channel claim ``<reservation>-imex-<node>``, created here with
  the ComputeDomain's UID as ``domainID``. One claim per node, not the ComputeDomain's template:
  a node advertises only ``channel-0``, so several pods of the gang on one node must share one
  claim (a template would give each pod a claim of its own, and the second could never be
  allocated).

The driver's constraints that placement already keeps: a node belongs to one ComputeDomain at
a time (the driver labels it ``resource.nvidia.com/computeDomain=<uid>`` and refuses a second),
which the solver models as one IMEX channel per node held by one gang (``mnnvlNodes`` in the
ledger); so a second gang on the same clique never shares a node with the first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from extender.kube import dra, names
from extender.kube.api import COMPUTE_DOMAINS, Conflict, KubeClient

API_VERSION = "resource.nvidia.com/v1beta1"
#: The DeviceClass of a ComputeDomain's IMEX channel (NVIDIA's chart).
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
#: The name of the channel claim in the pod's ``resourceClaims`` (and its containers' claims).
POD_CLAIM = "imex-channel"


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
                names.OWNER_NAME_LABEL: reservation["name"][:63],
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
                names.OWNER_NAME_LABEL: reservation["name"][:63],
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
