"""slurm.conf's KillWait, followed live by the scheduler on the real apiserver:
the value in the ConfigMap reaches it, an edit applies without a restart, one
it cannot read keeps the last value and says why in an Event on the
ConfigMap, and a deleted ConfigMap is Slurm's default."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from plugins.kube import event_note
from sunk.scheduler.kill_wait_watch import SLURM_CONF_KEY, KillWaitWatch
from sunk.slurm.conf import DEFAULT_KILL_WAIT

pytestmark = pytest.mark.contract

NAME = "slurm-config"


async def test_kill_wait_follows_the_configmap(kube: AsyncClient, namespace: str) -> None:
    await kube.create(
        ConfigMap(
            metadata=ObjectMeta(name=NAME, namespace=namespace),
            data={SLURM_CONF_KEY: "ClusterName=hpc\nKillWait=35\n"},
        )
    )
    seen: list[int] = []
    watch = KillWaitWatch(kube, namespace, NAME, on_change=seen.append)
    task = asyncio.create_task(watch.run())

    async def until(value: int) -> None:
        async with asyncio.timeout(10):
            while not seen or seen[-1] != value:
                await asyncio.sleep(0.02)

    async def patch(text: str) -> None:
        await kube.patch(ConfigMap, NAME, {"data": {SLURM_CONF_KEY: text}}, namespace=namespace)

    try:
        await asyncio.wait_for(watch.ready.wait(), 10)
        assert seen == [35]
        await patch("ClusterName=hpc\nKillWait=20\n")
        await until(20)

        await patch("ClusterName=hpc\nKillWait=soon\n")

        note = await event_note(kube, namespace, "InvalidSlurmConfig")
        assert f"ConfigMap {namespace}/{NAME}" in note
        assert "KillWait='soon'" in note
        assert "KillWait stays 20s" in note
        assert seen == [35, 20]

        await kube.delete(ConfigMap, NAME, namespace=namespace)
        await until(DEFAULT_KILL_WAIT)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
