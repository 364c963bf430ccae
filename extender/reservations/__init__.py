"""Reservations: the one home of a reservation's life.

:mod:`~extender.reservations.book` holds the ledger and every lifecycle step (hold, bind,
unbind, a pod gone or bound, expire, follow the kubelet, move a slot, rebuild after a
restart), :mod:`~extender.reservations.reserve` places a gang and holds its slice,
:mod:`~extender.reservations.store` writes each change (the only writer of SliceReservation
objects), :mod:`~extender.controllers.claims.sync` re-plans slots whose claimed devices were
taken. :mod:`~extender.reservations.cluster` joins the book to the informer
(:mod:`extender.kube.cache`), which only observes.
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
