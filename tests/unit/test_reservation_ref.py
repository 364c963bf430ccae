"""ReservationRef: who a reservation is for, read once from the meta kept with it."""

from __future__ import annotations

import dataclasses

from extender.kube import names
from extender.placement.ledger import Reservation
from extender.placement.slice import Slice
from extender.reservations import ClusterCache, ReservationRef

EMPTY = Slice.from_dict({"gang": "g", "pods": [], "nodes": [], "predictedPerLayerMicros": 0.0})


def test_a_plain_gang_s_ref_comes_from_its_key() -> None:
    ref = ReservationRef.parse("llm/Big_Gang", None)
    assert (ref.namespace, ref.name, ref.owner_kind, ref.slot_claims) == ("llm", "big-gang", "", False)
    assert not ref.owner_managed
    assert ref.label == "reservation llm/big-gang (gang llm/Big_Gang)"
    assert str(ref) == "llm/big-gang"


def test_an_owned_reservation_s_ref_names_its_object_and_owner() -> None:
    meta = {
        "namespace": "team",
        "name": "wl-1",
        names.META_OWNER_KIND: "Workload",
        names.META_OWNER_NAME: "wl",
        names.META_OWNER_UID: "u-1",
        names.META_OWNER_API_VERSION: "kueue.x-k8s.io/v1beta1",
        names.META_SLOT_CLAIMS: "true",
    }
    ref = ReservationRef.of(Reservation("team/wl", EMPTY, 0.0, meta=meta))
    assert ref.key == ("team", "wl-1")
    assert (ref.owner_kind, ref.owner_name, ref.owner_uid) == ("Workload", "wl", "u-1")
    assert ref.owner_managed and ref.slot_claims


def test_the_book_reads_a_ref_once_per_meta() -> None:
    book = ClusterCache(awaiting=()).book
    r = Reservation("llm/g", EMPTY, 0.0, meta={"namespace": "llm", "name": "g"})
    first = book.ref_of(r)
    assert book.ref_of(dataclasses.replace(r, expires_at=5.0)) is first  # a bind keeps the meta
    again = book.ref_of(dataclasses.replace(r, meta={"namespace": "llm", "name": "g2"}))
    assert again is not first and again.name == "g2"
