"""Informer and leader election against the real apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpcore2
import httpx2
import msgspec
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod
from lightkube.resources.events_v1 import Event as EventV1

from sunk.kube.client import kube_client
from sunk.kube.events import EventRecorder
from sunk.kube.informer import Event, Informer
from sunk.kube.leader import LeaderElector

pytestmark = pytest.mark.contract


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


async def test_an_informer_without_a_namespace_sees_every_namespace(
    kube: AsyncClient, namespace: str
) -> None:
    """As kubectl's -A (lightkube's own None is the client's default namespace:
    the chart's slurm.namespace "*" once watched only 'default')."""
    mark = {"sunk.dev/test": namespace}
    await kube.create(
        ConfigMap(metadata=ObjectMeta(name="elsewhere", namespace=namespace, labels=mark))
    )
    informer: Informer[ConfigMap] = Informer(kube, ConfigMap, labels=mark)
    async with running(informer):
        assert informer.list_keys() == [f"{namespace}/elsewhere"]


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


async def test_an_index_follows_the_objects_and_is_current_when_handlers_hear(
    kube: AsyncClient, namespace: str
) -> None:
    """Index by a data value (as the controllers index pods by node): listed,
    changed, moved from one value to another, deleted, and already current
    inside the handler that hears of the change."""
    await kube.create(configmap("a", namespace, rack="r1"))
    informer: Informer[ConfigMap] = Informer(kube, ConfigMap, namespace=namespace)
    informer.add_index("rack", lambda cm: [(cm.data or {}).get("rack", "")])
    seen_in_handler: list[list[str]] = []
    informer.subscribe(
        lambda e: (
            seen_in_handler.append(
                sorted(str(cm.metadata.name) for cm in informer.by_index("rack", "r2"))  # type: ignore[union-attr]
            )
            if e.key.endswith("/a")
            else None
        )
    )

    def names(rack: str) -> list[str]:
        return sorted(str(cm.metadata.name) for cm in informer.by_index("rack", rack))  # type: ignore[union-attr]

    async with running(informer):
        assert names("r1") == ["a"]
        await kube.create(configmap("b", namespace, rack="r1"))
        await until(lambda: names("r1") == ["a", "b"])
        await kube.patch(ConfigMap, "a", {"data": {"rack": "r2"}}, namespace=namespace)
        await until(lambda: names("r2") == ["a"])
        assert names("r1") == ["b"]
        assert seen_in_handler[-1] == ["a"]
        await kube.delete(ConfigMap, "a", namespace=namespace)
        await until(lambda: names("r2") == [])
        assert informer.by_index("rack", "") == []  # no value, not indexed


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


async def test_a_leader_that_loses_its_lease_stops_its_work_and_stands_again(
    kube: AsyncClient, namespace: str
) -> None:
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
    try:
        await until(lambda: elector.is_leader)
        # Someone else takes the Lease by force (as after a network partition).
        lease = await kube.get(Lease, "op", namespace=namespace)
        assert lease.spec is not None
        lease.spec.holderIdentity = "usurper"
        await kube.replace(lease)
        await asyncio.wait_for(cancelled.wait(), 5)
        assert not elector.is_leader
        # A candidate again, not a dead process: the usurper never renews, so
        # once its Lease runs out the first leads a second term.
        await until(lambda: elector.terms == 2 and elector.is_leader, timeout=10)
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Relay:
    """A TCP relay to the apiserver that a test can cut, as a network would.
    `down` drops every connection and refuses new ones; `hang` makes every
    connection, open or new, silent for good: bytes go in and nothing comes
    back, and neither end is told (a dead path, which only a timeout finds)."""

    def __init__(self) -> None:
        self.target = ("", 0)
        self.mode = "up"
        self._open: list[tuple[list[asyncio.StreamWriter], list[bool]]] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        self.set("down")
        if self._server is not None:
            self._server.close()

    def set(self, mode: str) -> None:
        self.mode = mode
        for writers, silent in self._open:
            if mode == "down":
                for writer in writers:
                    writer.transport.abort()
            elif mode == "hang":
                silent[0] = True
        if mode == "down":
            self._open.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "down":
            writer.transport.abort()
            return
        writers, silent = [writer], [self.mode == "hang"]
        self._open.append((writers, silent))
        if silent[0]:
            with contextlib.suppress(Exception):
                while await reader.read(65536):
                    pass
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        writers.append(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    if not silent[0]:
                        dst.write(data)
                        await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@contextlib.asynccontextmanager
async def relayed_client(kubeconfig: Path, relay: Relay) -> AsyncIterator[AsyncClient]:
    original = KubeConfig.from_file(kubeconfig)
    current = original.get()
    assert current is not None
    url = httpx2.URL(current.cluster.server)
    relay.target = (url.host, url.port or 443)
    port = await relay.start()
    config = KubeConfig.from_one(
        cluster=msgspec.structs.replace(current.cluster, server=str(url.copy_with(port=port))),
        user=current.user,
        fname=original.fname,
    )
    client = AsyncClient(config, field_manager="sunk-tests")
    try:
        yield client
    finally:
        await client.close()
        await relay.close()


async def test_leaders_ride_out_an_apiserver_outage(kubeconfig: Path, namespace: str) -> None:
    """Two candidates reach the real apiserver through a relay that is cut: a
    hung path first, then a refused one. The leader stops its work by its
    renew deadline, nobody crashes, and afterwards exactly one leads again."""
    timing = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.2}
    relay = Relay()
    async with relayed_client(kubeconfig, relay) as client:
        electors = [
            LeaderElector(client, namespace=namespace, name="op", identity=f"e{i}", **timing)
            for i in range(2)
        ]
        working: set[str] = set()
        stopped_at: dict[str, float] = {}

        def lead_as(name: str) -> Callable[[], Coroutine[Any, Any, None]]:
            async def lead() -> None:
                working.add(name)
                try:
                    await asyncio.sleep(3600)
                finally:
                    working.discard(name)
                    stopped_at[name] = time.monotonic()

            return lead

        tasks = [asyncio.create_task(e.run(lead_as(e.identity))) for e in electors]
        try:
            await until(lambda: len(working) == 1)
            for mode in ("hang", "down"):
                (leader,) = working
                cut = time.monotonic()
                relay.set(mode)
                await until(lambda: not working, timeout=5)
                # Within the renew deadline (2 s) plus a retry period and a margin.
                assert stopped_at[leader] - cut < 3.5, (mode, stopped_at[leader] - cut)
                await asyncio.sleep(4)  # longer than the Lease: both keep standing
                assert not any(t.done() for t in tasks)
                assert not working
                relay.set("up")
                await until(lambda: len(working) == 1, timeout=15)
            await asyncio.sleep(1)
            assert len(working) == 1
            assert sum(e.is_leader for e in electors) == 1
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_informer_outlives_a_silently_dead_watch(
    kube: AsyncClient, kubeconfig: Path, namespace: str
) -> None:
    """The watch's connection goes silent without closing (a NAT or a node
    dropped it): the informer notices by its read timeout, watches again, and
    its cache catches up with what changed meanwhile."""
    relay = Relay()
    async with relayed_client(kubeconfig, relay) as client:
        informer: Informer[ConfigMap] = Informer(
            client, ConfigMap, namespace=namespace, read_timeout=2, retry_delay=0.2
        )
        async with running(informer):
            relay.set("hang")
            await kube.create(configmap("while-silent", namespace))
            await asyncio.sleep(3)
            assert informer.get(f"{namespace}/while-silent") is None
            relay.set("up")
            await until(lambda: informer.get(f"{namespace}/while-silent") is not None, 15)


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


async def test_a_burst_after_a_pause_reuses_the_kube_clients_connections(
    kubeconfig: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sunk's components keep their apiserver connections between bursts: the
    second burst opens none (httpx's defaults closed them after 5 s idle and
    kept at most 20, so every burst paid TLS handshakes on both sides)."""
    opened: list[object] = []
    create = httpcore2.AsyncConnectionPool.create_connection

    def counting(pool: httpcore2.AsyncConnectionPool, origin: httpcore2.Origin) -> Any:
        opened.append(origin)
        return create(pool, origin)

    monkeypatch.setattr(httpcore2.AsyncConnectionPool, "create_connection", counting)
    client = kube_client(kubeconfig, "sunk-tests")
    try:
        await client.create(configmap("burst", namespace, a="1"))

        async def burst() -> None:
            reads = (client.get(ConfigMap, "burst", namespace=namespace) for _ in range(30))
            await asyncio.gather(*reads)

        await burst()
        first = len(opened)
        assert 20 < first <= 31  # about one per request at once (more than httpx kept)
        await asyncio.sleep(6)  # longer than httpx's 5 s keep-alive
        await burst()
        assert len(opened) == first
    finally:
        await client.close()
