"""EventRecorder's series and spam filter, on a fake client and a fake clock."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
from lightkube import ApiError
from lightkube.resources.events_v1 import Event

from sunk.kube.events import EventRecorder


class FakeKube:
    """The two calls EventRecorder makes, recorded (a port fake, not an apiserver)."""

    def __init__(self) -> None:
        self.events: dict[str, Event] = {}
        self.calls: list[tuple[str, str]] = []

    async def create(self, event: Event) -> Event:
        assert event.metadata is not None
        assert event.metadata.name is not None
        self.events[event.metadata.name] = event
        self.calls.append(("create", event.metadata.name))
        return event

    async def patch(self, kind: Any, name: str, body: dict[str, Any], **_: Any) -> None:
        if name not in self.events:
            request = httpx2.Request("PATCH", f"http://kube/{name}")
            raise ApiError(
                request=request, response=httpx2.Response(404, request=request, json={"code": 404})
            )
        self.events[name].series = body["series"]
        self.calls.append(("patch", name))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
    }


def recorder(kube: FakeKube, clock: Clock, **options: Any) -> EventRecorder:
    return EventRecorder(kube, "test", clock=clock, **options)  # type: ignore[arg-type]


async def test_repeats_become_one_event_with_a_growing_series() -> None:
    kube, clock = FakeKube(), Clock()
    events = recorder(kube, clock)
    for _ in range(3):
        await events.emit(pod("a"), "Drained", "drained a", action="Drain")
        clock.now += 10
    assert [kind for kind, _ in kube.calls] == ["create", "patch", "patch"]
    (event,) = kube.events.values()
    assert event.series["count"] == 3  # type: ignore[index]
    # Another note, reason or object is another Event.
    await events.emit(pod("a"), "Drained", "drained a again", action="Drain")
    await events.emit(pod("a"), "Resumed", "drained a", action="Resume")
    await events.emit(pod("b", "u2"), "Drained", "drained a", action="Drain")
    assert len(kube.events) == 4


async def test_a_repeat_after_the_window_or_once_the_event_expired_starts_anew() -> None:
    kube, clock = FakeKube(), Clock()
    events = recorder(kube, clock, series_window=60)
    await events.emit(pod("a"), "R", "n", action="A")
    clock.now += 61
    await events.emit(pod("a"), "R", "n", action="A")
    assert [kind for kind, _ in kube.calls] == ["create", "create"]
    kube.events.clear()  # expired (Events live an hour)
    clock.now += 1
    await events.emit(pod("a"), "R", "n", action="A")
    assert [kind for kind, _ in kube.calls] == ["create", "create", "create"]


async def test_a_flapping_object_is_held_to_its_token_bucket() -> None:
    kube, clock = FakeKube(), Clock()
    events = recorder(kube, clock, burst=25, refill_every=300)
    for i in range(100):  # 100 different notes: no series to fold them into
        await events.emit(pod("a"), "Flap", f"flap {i}", action="A")
    assert len(kube.calls) == 25
    assert events.stats.skipped == 75
    await events.emit(pod("other", "u9"), "Flap", "flap", action="A")  # other objects unaffected
    assert len(kube.calls) == 26
    clock.now += 299
    await events.emit(pod("a"), "Flap", "flap 100", action="A")
    assert len(kube.calls) == 26
    clock.now += 1  # one token back
    await events.emit(pod("a"), "Flap", "flap 101", action="A")
    assert len(kube.calls) == 27


async def test_held_back_repeats_still_count() -> None:
    kube, clock = FakeKube(), Clock()
    events = recorder(kube, clock, burst=2, refill_every=100)
    for _ in range(10):
        await events.emit(pod("a"), "R", "n", action="A")
    assert [kind for kind, _ in kube.calls] == ["create", "patch"]
    clock.now += 100
    await events.emit(pod("a"), "R", "n", action="A")
    (event,) = kube.events.values()
    assert event.series["count"] == 11  # type: ignore[index]


async def test_a_failing_apiserver_never_raises() -> None:
    class Broken(FakeKube):
        async def create(self, event: Event) -> Event:
            raise RuntimeError("apiserver down")

    events = recorder(Broken(), Clock())
    await events.emit(pod("a"), "R", "n", action="A")
    assert events.stats.failed == 1


async def test_emit_soon_holds_events_till_the_controller_is_quiet_for_at_most_max_hold() -> None:
    kube, clock = FakeKube(), Clock()
    busy = True
    events = recorder(kube, clock, busy=lambda: busy, max_hold=5)
    events.emit_soon(pod("a"), "Scheduled", "bound", action="Binding")
    events.emit_soon(pod("b", "u2"), "Scheduled", "bound", action="Binding")
    await asyncio.sleep(0.2)
    assert kube.calls == []  # the controller has work waiting
    busy = False
    await asyncio.sleep(0.2)
    assert kube.calls == []  # not idle for `quiet` yet: a pause within a burst
    clock.now += 0.3
    await asyncio.sleep(0.2)
    assert len(kube.calls) == 2
    busy = True
    events.emit_soon(pod("c", "u3"), "Scheduled", "bound", action="Binding")
    clock.now += 6  # held long enough: written even though still busy
    await asyncio.sleep(0.2)
    assert len(kube.calls) == 3
