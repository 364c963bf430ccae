"""The one reserve path as tests call it for a plain gang (what the extender does on a
member's first filter)."""

from __future__ import annotations

from extender.placement.ledger import Reservation
from extender.placement.request import GangRequest
from extender.placement.slice import Placement
from extender.reservations import ClusterCache
from extender.reservations.reserve import Claim, reserve


def hold(
    cache: ClusterCache, gang: str, request: GangRequest, meta: dict[str, str] | None = None
) -> Placement:
    """Reserve ``request`` for ``gang`` (call it where no other decision runs): the slice, or
    why not."""
    got = reserve(cache, request, Claim(gang, dict(meta or {})))
    return got.slice if isinstance(got, Reservation) else got


async def reserve_gang(
    cache: ClusterCache, gang: str, request: GangRequest, meta: dict[str, str] | None = None
) -> Placement:
    """:func:`hold` under the book's lock, then the book's store writes it."""
    got = await cache.book.deciding(lambda: hold(cache, gang, request, meta))
    await cache.flush()
    return got
