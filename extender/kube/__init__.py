"""Kubernetes adapters: the one API client, the cluster cache, watches, custom resources,
the reservation store and the binder."""

from extender.kube.api import (
    ALL_KINDS,
    Conflict,
    Forbidden,
    Gone,
    Kind,
    KubeClient,
    KubeError,
    NotFound,
    Resource,
    Unavailable,
)
from extender.kube.cache import ClusterCache
from extender.kube.pods import PodError, PodInfo
from extender.kube.store import InMemoryReservationStore, KubeReservationStore, ReservationStore

__all__ = [
    "ALL_KINDS",
    "ClusterCache",
    "Conflict",
    "Forbidden",
    "Gone",
    "InMemoryReservationStore",
    "Kind",
    "KubeClient",
    "KubeError",
    "KubeReservationStore",
    "NotFound",
    "PodError",
    "PodInfo",
    "ReservationStore",
    "Resource",
    "Unavailable",
]
