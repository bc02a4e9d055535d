"""Informer and leader election against the real apiserver."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod
from lightkube.resources.events_v1 import Event as EventV1

from sunk.kube.events import EventRecorder
from sunk.kube.informer import Event, Informer
from sunk.kube.leader import LeaderElector, LostLeadership

pytestmark = pytest.mark.testbed


@contextlib.asynccontextmanager
async def running(informer: Informer[ConfigMap]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


def configmap(name: str, namespace: str, **data: str) -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name=name, namespace=namespace), data=data)


async def test_informer_lists_then_follows_changes(kube: AsyncClient, namespace: str) -> None:
    await kube.create(configmap("before", namespace))
    informer: Informer[ConfigMap] = Informer(kube, ConfigMap, namespace=namespace)
    events: list[Event[ConfigMap]] = []
    informer.subscribe(events.append)
    async with running(informer):
        assert "before" in {e.obj.metadata.name for e in events if e.type == "ADDED"}  # type: ignore[union-attr]
        await kube.create(configmap("after", namespace, a="1"))
        await kube.patch(ConfigMap, "after", {"data": {"a": "2"}}, namespace=namespace)
        await kube.delete(ConfigMap, "before", namespace=namespace)
        await until(lambda: informer.get(f"{namespace}/before") is None)
        await until(lambda: (informer.get(f"{namespace}/after") or ConfigMap()).data == {"a": "2"})
    kinds = [
        (e.type, e.key.split("/")[1]) for e in events if e.key.split("/")[1] != "kube-root-ca.crt"
    ]
    assert kinds == [
        ("ADDED", "before"),
        ("ADDED", "after"),
        ("MODIFIED", "after"),
        ("DELETED", "before"),
    ]
    modified = next(e for e in events if e.type == "MODIFIED")
    assert modified.old is not None
    assert modified.old.data == {"a": "1"}


async def test_informer_filters_by_label(kube: AsyncClient, namespace: str) -> None:
    informer: Informer[ConfigMap] = Informer(
        kube, ConfigMap, namespace=namespace, labels={"pick": "me"}
    )
    async with running(informer):
        await kube.create(configmap("no", namespace))
        yes = configmap("yes", namespace)
        assert yes.metadata is not None
        yes.metadata.labels = {"pick": "me"}
        await kube.create(yes)
        await until(lambda: informer.get(f"{namespace}/yes") is not None)
        assert informer.list_keys() == [f"{namespace}/yes"]


async def test_bookmarks_advance_an_idle_watch(kube: AsyncClient, namespace: str) -> None:
    """Nothing changes in our namespace, yet the resourceVersion moves on: a reconnect
    will not replay history or hit a 410 for an old version."""
    informer: Informer[ConfigMap] = Informer(kube, ConfigMap, namespace=namespace, watch_timeout=3)
    async with running(informer):
        start = int(informer.resource_version)
        other = f"{namespace}-elsewhere"
        await kube.create(Namespace(metadata=ObjectMeta(name=other)))
        try:
            for i in range(8):
                await kube.create(configmap(f"c{i}", other))
                await asyncio.sleep(0.4)
            await until(lambda: int(informer.resource_version) > start, timeout=10)
        finally:
            await kube.delete(Namespace, other)
        assert informer.list_keys() == [f"{namespace}/kube-root-ca.crt"]


async def test_informer_relists_after_410_and_reports_what_it_missed(
    kube: AsyncClient, namespace: str
) -> None:
    informer: Informer[ConfigMap] = Informer(kube, ConfigMap, namespace=namespace)
    events: list[Event[ConfigMap]] = []
    informer.subscribe(events.append)
    await kube.create(configmap("gone", namespace))
    async with running(informer):
        pass
    # While the informer is stopped: one object goes, one comes, and the
    # version it would resume from is compacted away.
    await kube.delete(ConfigMap, "gone", namespace=namespace)
    await kube.create(configmap("new", namespace))
    informer.resource_version = "1"
    events.clear()
    lists_before = informer.relists
    async with running(informer):
        await until(lambda: informer.relists > lists_before)
        await until(lambda: informer.get(f"{namespace}/new") is not None)
    assert informer.get(f"{namespace}/gone") is None
    assert {(e.type, e.key.split("/")[1]) for e in events} >= {
        ("DELETED", "gone"),
        ("ADDED", "new"),
    }


async def test_one_leader_at_a_time_and_a_fast_handover(kube: AsyncClient, namespace: str) -> None:
    timing = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.2}
    first = LeaderElector(kube, namespace=namespace, name="op", identity="first", **timing)
    second = LeaderElector(kube, namespace=namespace, name="op", identity="second", **timing)
    leading: list[str] = []
    stop_first = asyncio.Event()

    async def lead_first() -> None:
        leading.append("first")
        await stop_first.wait()

    async def lead_second() -> None:
        leading.append("second")
        await asyncio.sleep(3600)

    a = asyncio.create_task(first.run(lead_first))
    await until(lambda: first.is_leader)
    b = asyncio.create_task(second.run(lead_second))
    await asyncio.sleep(1.5)
    assert leading == ["first"]  # the second waits while the first renews
    assert not second.is_leader
    stop_first.set()  # the first finishes and releases the Lease
    await a
    await until(lambda: second.is_leader, timeout=2)  # no need to wait out the duration
    lease = await kube.get(Lease, "op", namespace=namespace)
    assert lease.spec is not None
    assert lease.spec.holderIdentity == "second"
    assert lease.spec.leaseTransitions == 1
    b.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await b


async def test_a_leader_that_cannot_renew_stops_its_work(kube: AsyncClient, namespace: str) -> None:
    elector = LeaderElector(
        kube,
        namespace=namespace,
        name="op",
        identity="me",
        lease_duration=3.0,
        renew_deadline=1.0,
        retry_period=0.2,
    )
    cancelled = asyncio.Event()

    async def lead() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()

    task = asyncio.create_task(elector.run(lead))
    await until(lambda: elector.is_leader)
    # Someone else takes the Lease by force (as after a network partition).
    lease = await kube.get(Lease, "op", namespace=namespace)
    assert lease.spec is not None
    lease.spec.holderIdentity = "usurper"
    await kube.replace(lease)
    with pytest.raises(LostLeadership):
        await asyncio.wait_for(task, 5)
    assert cancelled.is_set()


async def test_a_pod_informer_survives_bookmarks(kube: AsyncClient, namespace: str) -> None:
    """A BOOKMARK carries an empty Pod that lightkube cannot decode as one; the informer
    must take only its resourceVersion (this crashed the NodeSet controller once)."""
    informer: Informer[Pod] = Informer(kube, Pod, namespace=namespace, watch_timeout=3)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        start = int(informer.resource_version)
        for i in range(8):
            await kube.create(configmap(f"noise{i}", namespace))
            await asyncio.sleep(0.4)
        await until(lambda: int(informer.resource_version) > start, timeout=10)
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_events_are_recorded(kube: AsyncClient, namespace: str) -> None:
    """The recorder never raises, so a refused Event would go unnoticed: check one lands."""
    target = await kube.create(configmap("target", namespace))
    await EventRecorder(kube, "sunk-test").emit(target, "Tested", "it works", action="Test")
    events = [e async for e in kube.list(EventV1, namespace=namespace)]
    assert [(e.reason, e.note, e.regarding.name) for e in events if e.regarding] == [
        ("Tested", "it works", "target")
    ]


async def test_repeated_events_form_a_series_and_a_flapping_object_is_limited(
    kube: AsyncClient, namespace: str
) -> None:
    target = await kube.create(configmap("flappy", namespace))
    events = EventRecorder(kube, "sunk-test", burst=5)
    for _ in range(3):
        await events.emit(target, "Flapped", "same note", action="Test")
    for i in range(10):
        await events.emit(target, "Flapped", f"note {i}", action="Test")
    assert events.stats.failed == 0
    stored = [e async for e in kube.list(EventV1, namespace=namespace)]
    series = [e for e in stored if e.note == "same note"]
    assert len(series) == 1
    assert series[0].series is not None
    assert series[0].series.count == 3
    # 5 writes: one create and two series updates, then two more creates.
    assert len(stored) == 3
    assert events.stats.skipped == 8
