"""Who a reservation is for, read once from the meta kept with it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from extender.kube import names
from extender.kube.crd_models import gang_namespace, object_name
from extender.placement.ledger import Reservation


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationRef:
    """A reservation's gang key, its SliceReservation (namespace, name) and the object that
    owns it (a Workload, a PodGroup; empty for a plain gang)."""

    gang: str
    namespace: str
    name: str
    owner_kind: str = ""
    owner_name: str = ""
    owner_uid: str = ""
    owner_api_version: str = ""
    #: Its slots are ResourceClaims the admission webhook created (DRA).
    slot_claims: bool = False

    @classmethod
    def of(cls, r: Reservation) -> ReservationRef:
        return cls.parse(r.gang, r.meta)

    @classmethod
    def parse(cls, gang: str, meta: Mapping[str, str] | None) -> ReservationRef:
        m = meta or {}
        return cls(
            gang=gang,
            namespace=m.get("namespace") or gang_namespace(gang),
            name=m.get("name") or object_name(gang),
            owner_kind=m.get(names.META_OWNER_KIND, ""),
            owner_name=m.get(names.META_OWNER_NAME, ""),
            owner_uid=m.get(names.META_OWNER_UID, ""),
            owner_api_version=m.get(names.META_OWNER_API_VERSION, ""),
            slot_claims=m.get(names.META_SLOT_CLAIMS) == "true",
        )

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name) of the SliceReservation."""
        return self.namespace, self.name

    @property
    def owner_managed(self) -> bool:
        """Held until its controller releases it (a Workload's, a PodGroup's): no TTL."""
        return self.owner_kind in names.OWNER_MANAGED_KINDS

    @property
    def label(self) -> str:
        return f"reservation {self.namespace}/{self.name} (gang {self.gang})"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"
