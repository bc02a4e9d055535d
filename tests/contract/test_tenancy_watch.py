"""The scheduler's tenancy ConfigMap, followed live on the real apiserver: edits
apply without a restart, an invalid edit keeps the last valid tenancy and says
why in an Event on the ConfigMap, and a deleted ConfigMap serves no one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from plugins.kube import event_note
from sunk.scheduler.tenancy_watch import TENANCY_KEY, TenancyWatch

pytestmark = pytest.mark.contract

NAME = "scheduler-tenancy"


def tenancy(namespace: str, uids: str) -> str:
    return f"tenants: [{{namespaces: [{namespace}], uids: '{uids}', user: {uids.split('-')[0]}}}]"


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def test_tenancy_edits_apply_live_and_a_bad_one_keeps_the_last_good(
    kube: AsyncClient, namespace: str
) -> None:
    await kube.create(
        ConfigMap(
            metadata=ObjectMeta(name=NAME, namespace=namespace),
            data={TENANCY_KEY: tenancy("team-a", "5000-5099")},
        )
    )
    watch = TenancyWatch(kube, namespace, NAME)
    changes = 0

    def changed() -> None:
        nonlocal changes
        changes += 1

    watch.on_change = changed
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.ready.wait(), 10)
        assert watch.current().grant_for("team-a") is not None
        assert changes == 1

        # A valid edit: served without a restart.
        await kube.patch(
            ConfigMap,
            NAME,
            {"data": {TENANCY_KEY: tenancy("team-b", "6000-6099")}},
            namespace=namespace,
        )
        await until(lambda: watch.current().grant_for("team-b") is not None)
        assert watch.current().grant_for("team-a") is None
        assert changes == 2

        # An invalid edit (uids below 1000): the last valid tenancy stays, an Event says why.
        await kube.patch(
            ConfigMap,
            NAME,
            {"data": {TENANCY_KEY: tenancy("team-c", "10-20")}},
            namespace=namespace,
        )

        note = await event_note(kube, namespace, "InvalidTenancy")
        assert f"ConfigMap {namespace}/{NAME}" in note
        assert "below 1000" in note
        assert watch.current().grant_for("team-b") is not None
        assert watch.current().grant_for("team-c") is None
        assert changes == 2

        # Deleted: no namespace is served (nothing is granted by default).
        await kube.delete(ConfigMap, NAME, namespace=namespace)
        await until(lambda: watch.current().grant_for("team-b") is None)
        assert changes == 3
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
