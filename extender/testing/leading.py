"""Run the controllers in a test until this replica leads."""

from __future__ import annotations

import asyncio

from extender.controllers.leader import LeaseConfig
from extender.controllers.runner import run_controller
from extender.reservations import ClusterCache
from extender.testing.kube import FakeKube

#: The Lease the tests contend for (renewed every 10 ms).
TEST_LEASE = LeaseConfig(namespace="gs", name="ctl", retry_period_s=0.01)


async def lead(
    cache: ClusterCache, api: FakeKube, leading: list[bool]
) -> tuple[asyncio.Task[None], asyncio.Event]:
    """Start ``run_controller`` as replica ``me`` (no watches) and return once it leads;
    set the event to stop it, then await the task. ``leading`` records each change."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_controller(
            cache,
            api=api,
            lease=TEST_LEASE,
            identity="me",
            on_leadership=leading.append,
            stop=stop,
            watch=False,
        )
    )
    while not leading:
        await asyncio.sleep(0.01)
    return task, stop
