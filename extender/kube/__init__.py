"""Kubernetes adapters: the cluster cache, watches, custom resources, the reservation store."""

from extender.kube.api import ALL_KINDS, ApiError, Conflict, Gone, Kind, KubeApi, NotFound
from extender.kube.cache import ClusterCache
from extender.kube.pods import PodError, PodInfo
from extender.kube.store import InMemoryReservationStore, KubeReservationStore, ReservationStore

__all__ = [
    "ALL_KINDS",
    "ApiError",
    "ClusterCache",
    "Conflict",
    "Gone",
    "InMemoryReservationStore",
    "Kind",
    "KubeApi",
    "KubeReservationStore",
    "NotFound",
    "PodError",
    "PodInfo",
    "ReservationStore",
]
