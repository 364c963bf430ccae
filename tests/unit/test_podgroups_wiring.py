"""The PodGroup controller in ``run_controller``: a kopf handler for PodGroups
(``scheduling.volcano.sh/v1beta1``) routes events to it (pods come from the cluster cache's
watch, tests/unit/test_controller_runner.py); without Volcano's API only the Kueue handlers
are there."""

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


def test_podgroup_handler_routes_events() -> None:
    registry = kopf.OperatorRegistry()
    pg = Recorder()
    register(registry, Recorder(), None, pg)  # type: ignore[arg-type]
    by_fn = {h.fn.__name__: h for h in handlers(registry)}
    assert "podgroup_event" in by_fn
    sel = by_fn["podgroup_event"].selector
    assert (sel.group, sel.version, sel.any_name) == ("scheduling.volcano.sh", "v1beta1", "podgroups")

    asyncio.run(by_fn["podgroup_event"].fn(event={"type": "ADDED", "object": {"metadata": {"name": "g"}}}))
    assert pg.seen == [("podgroup", "ADDED", "g")]


def test_without_volcano_no_podgroup_handlers() -> None:
    registry = kopf.OperatorRegistry()
    register(registry, Recorder(), None)  # type: ignore[arg-type]
    names = {h.fn.__name__ for h in handlers(registry)}
    assert "podgroup_event" not in names
