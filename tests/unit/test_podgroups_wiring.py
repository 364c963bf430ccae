"""The PodGroup controller and the plain-gang reporter in ``run_controller``: kopf handlers for
PodGroups (``scheduling.volcano.sh/v1beta1``), for pods naming a PodGroup and for plain-gang
pods route events to them; without Volcano's API only the Kueue handlers are there."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from extender.controllers.handlers import register


class Recorder:
    kueue = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []

    async def on_podgroup(self, event_type: str | None, obj: dict[str, Any]) -> None:
        self.seen.append(("podgroup", event_type, obj["metadata"]["name"]))

    async def on_pod(self, event_type: str | None, obj: dict[str, Any]) -> None:
        self.seen.append(("pod", event_type, obj["metadata"]["name"]))


def handlers(registry: kopf.OperatorRegistry) -> list[Any]:
    return list(registry._watching.get_all_handlers())  # kopf has no public accessor for these


def test_podgroup_and_pod_handlers_route_events() -> None:
    registry = kopf.OperatorRegistry()
    pg, plain = Recorder(), Recorder()
    register(registry, Recorder(), None, pg, plain)  # type: ignore[arg-type]
    by_fn = {h.fn.__name__: h for h in handlers(registry)}
    assert {"podgroup_event", "pod_event", "plain_gang_pod_event"} <= set(by_fn)
    sel = by_fn["podgroup_event"].selector
    assert (sel.group, sel.version, sel.any_name) == ("scheduling.volcano.sh", "v1beta1", "podgroups")
    assert by_fn["pod_event"].annotations == {"scheduling.k8s.io/group-name": kopf.PRESENT}
    assert by_fn["plain_gang_pod_event"].labels == {"gangslice.io/gang": kopf.PRESENT}

    async def body() -> None:
        await by_fn["podgroup_event"].fn(event={"type": "ADDED", "object": {"metadata": {"name": "g"}}})
        await by_fn["pod_event"].fn(event={"type": "MODIFIED", "object": {"metadata": {"name": "p"}}})
        await by_fn["plain_gang_pod_event"].fn(event={"type": None, "object": {"metadata": {"name": "q"}}})

    asyncio.run(body())
    assert pg.seen == [("podgroup", "ADDED", "g"), ("pod", "MODIFIED", "p")]
    assert plain.seen == [("pod", None, "q")]


def test_without_volcano_no_podgroup_handlers() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, Recorder(), None)  # type: ignore[arg-type]
    names = {h.fn.__name__ for h in handlers(registry)}
    assert "podgroup_event" not in names and "pod_event" not in names
