"""Kubernetes adapters: the one API client, the informer, watches, custom resources and the
binder. Reservations live in :mod:`extender.reservations`."""

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
from extender.kube.cache import ClusterInformer
from extender.kube.pods import PodError, PodInfo

__all__ = [
    "ALL_KINDS",
    "ClusterInformer",
    "Conflict",
    "Forbidden",
    "Gone",
    "Kind",
    "KubeClient",
    "KubeError",
    "NotFound",
    "PodError",
    "PodInfo",
    "Resource",
    "Unavailable",
]
