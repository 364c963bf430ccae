"""The cache's index of plain gang members: after any mix of watch events and pods seen only
in requests (some evicted from the bounded memory of those), a gang's members are exactly the
pods the cache knows whose gang it is."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.kube import cache as cache_module
from extender.kube import names as keys
from extender.kube.api import Kind
from extender.kube.pods import PodInfo
from extender.reservations import ClusterCache
from extender.testing.extender import pod_obj

GANGS = ["a", "b", None]
EVENTS = st.lists(
    st.tuples(st.sampled_from(["watched", "deleted", "seen"]), st.integers(0, 5), st.sampled_from(GANGS)),
    max_size=30,
)


def pod(i: int, gang: str | None) -> dict[str, Any]:
    labels = {keys.GANG: gang} if gang else {}
    return pod_obj(f"p{i}", gpus=1, labels=labels)


@settings(max_examples=80, deadline=None)
@given(events=EVENTS)
def test_gang_members_match_what_the_cache_knows(events: list[tuple[str, int, str | None]]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cache_module, "RECENT_PODS", 3)  # evictions happen within a short run
        cache = ClusterCache(awaiting=())
        for what, i, gang in events:
            if what == "watched":
                cache.apply(Kind.PODS, "MODIFIED", pod(i, gang))
            elif what == "deleted":
                cache.apply(Kind.PODS, "DELETED", pod(i, gang))
            else:
                cache.remember(PodInfo.from_obj(pod(i, gang)))
            known = [p for k in range(6) if (p := cache.pod("llm", f"p{k}")) is not None]
            for g in ("a", "b"):
                expected = sorted(p.key for p in known if p.gang == f"llm/{g}")
                got = sorted(p.key for p in cache.pods_of_gang(f"llm/{g}"))
                assert got == expected
                assert all(p is cache.pod(p.namespace, p.name) for p in cache.pods_of_gang(f"llm/{g}"))
