"""Reservations: the one home of a reservation's life.

:mod:`~extender.reservations.book` holds the ledger and every lifecycle step (hold, bind,
unbind, a pod gone or bound, expire, follow the kubelet, move a slot, rebuild after a
restart), :mod:`~extender.reservations.reserve` places a gang and holds its slice,
:mod:`~extender.reservations.store` writes each change (the only writer of SliceReservation
objects). :mod:`~extender.reservations.cluster` joins the book to the informer
(:mod:`extender.kube.cache`), which only observes. The reconcilers that drive a step (the
DRA claim re-plan, for one) live in :mod:`extender.controllers` and call the book.
"""

from extender.reservations.book import ReservationBook
from extender.reservations.cluster import ClusterCache
from extender.reservations.store import (
    InMemoryReservationStore,
    KubeReservationStore,
    ReservationRef,
    ReservationStore,
)

__all__ = [
    "ClusterCache",
    "InMemoryReservationStore",
    "KubeReservationStore",
    "ReservationBook",
    "ReservationRef",
    "ReservationStore",
]
