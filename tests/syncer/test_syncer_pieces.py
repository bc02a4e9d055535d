"""The syncer's small pieces without a test bed: write limits, which changes
become Events, the guards on its Slurm writes (on a fake of its Slurm port)
and the adapter's guard read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from lightkube.models.core_v1 import NodeCondition
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.events_v1 import Event

from sunk.slurm.errors import SlurmApiError, SlurmProblem, SlurmUnavailableError
from sunk.slurm.models import Node as SlurmNode
from sunk.syncer import slurm_adapter
from sunk.syncer.controller import Syncer
from sunk.syncer.decide import Condition, Decision, Drain, Resume, SetComment, SlurmState
from sunk.syncer.kube_state import state_event
from sunk.syncer.ratelimit import TokenBucket
from sunk.syncer.slurm_adapter import SlurmPortForSyncer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    for _ in range(3):
        assert bucket.delay() == 0
        bucket._tokens -= 1
    assert bucket.delay() == pytest.approx(0.1)
    clock.now = 0.05
    assert bucket.delay() == pytest.approx(0.05)
    clock.now = 10
    assert bucket.delay() == 0
    assert bucket._tokens == 3  # never more than the burst


async def test_acquire_waits_for_a_token_and_unlimited_never_waits() -> None:
    bucket = TokenBucket(rate=50, burst=2)
    started = asyncio.get_running_loop().time()
    for _ in range(4):
        await bucket.acquire()
    # Two from the burst, two more at 50/s: at least ~40 ms.
    assert asyncio.get_running_loop().time() - started >= 0.035
    assert bucket.waited > 0
    unlimited = TokenBucket(rate=0, burst=1)
    for _ in range(1000):
        await unlimited.acquire()
    assert unlimited.waited == 0


def have(kind: str, status: str, reason: str = "") -> NodeCondition:
    return NodeCondition(type=kind, status=status, reason=reason)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (
            None,
            Condition("SlurmDrain", "True", "SlurmDrain", "bad DIMM"),
            ("SlurmDrained", "Warning"),
        ),
        (None, Condition("SlurmDrain", "True", "SunkDrain", "sunk/syncer: x"), None),
        (
            have("SlurmDrain", "True", "SlurmDrain"),
            Condition("SlurmDrain", "False", "NotDrained", ""),
            ("SlurmDrainCleared", "Normal"),
        ),
        (
            have("SlurmDrain", "True", "SunkDrain"),
            Condition("SlurmDrain", "False", "NotDrained", ""),
            None,
        ),
        (
            have("SlurmNotResponding", "False"),
            Condition("SlurmNotResponding", "True", "NotResponding", ""),
            ("SlurmNotResponding", "Warning"),
        ),
        (
            have("SlurmDown", "True"),
            Condition("SlurmDown", "False", "IDLE", ""),
            ("SlurmUp", "Normal"),
        ),
        (None, Condition("SlurmDown", "False", "IDLE", ""), None),
        (have("SlurmDown", "True"), Condition("SlurmDown", "True", "DOWN", "x"), None),
        (None, Condition("SlurmAllocated", "True", "ALLOCATED", ""), None),
    ],
)
def test_which_slurm_changes_are_told_as_events(
    before: NodeCondition | None, after: Condition, expected: tuple[str, str] | None
) -> None:
    assert state_event(before, after) == expected


OURS = "sunk/syncer: node cordoned"


def slurm_node(drained: bool, reason: str = "") -> SlurmState:
    return SlurmState("slurmd-0", "IDLE", drained, reason, responding=True, busy=False)


class FakeSlurm:
    """Slurm as the syncer sees it, in memory (a port fake, not a Slurm):
    `now` is what the read right before a write finds."""

    fresh = True
    write_wait = 0.0
    requests = 0

    def __init__(self, now: SlurmState | None) -> None:
        self.now = now
        self.writes: list[tuple[str, ...]] = []
        self.polls = 0

    def node(self, name: str) -> SlurmState | None:
        return self.now

    async def read_node(self, name: str) -> SlurmState | None:
        return self.now

    async def drain(self, name: str, reason: str) -> None:
        self.writes.append(("drain", reason))

    async def resume(self, name: str) -> None:
        self.writes.append(("resume",))

    async def set_comment(self, name: str, comment: str) -> None:
        self.writes.append(("comment", comment))

    def poll_now(self) -> None:
        self.polls += 1

    async def follow(
        self,
        on_node: Callable[[str], None],
        on_state: Callable[[str | None], Awaitable[None]],
    ) -> None:
        await asyncio.Event().wait()

    def on_write(self, callback: Callable[[int], None]) -> None:
        pass


class FakeKube:
    """The Event writes the syncer makes, recorded (a port fake, not an apiserver)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    async def create(self, event: Event) -> Event:
        self.reasons.append(event.reason or "")
        return event


@pytest.mark.parametrize(
    ("action", "now", "writes", "told"),
    [
        pytest.param(Drain(OURS), slurm_node(False), [("drain", OURS)], ["SlurmDrain"], id="drain"),
        pytest.param(
            Drain(OURS), slurm_node(True, "bad DIMM"), [], [], id="someone else's drain stays"
        ),
        pytest.param(
            Drain(OURS),
            slurm_node(True, "sunk/nodeset: replacing the pod for an update"),
            [],
            [],
            id="the NodeSet controller's drain stays",
        ),
        pytest.param(
            Drain(OURS),
            slurm_node(True, "sunk/syncer: node NotReady"),
            [("drain", OURS)],
            ["SlurmDrain"],
            id="its own drain takes the new reason",
        ),
        pytest.param(Drain(OURS), slurm_node(True, OURS), [], [], id="drained already"),
        pytest.param(Drain(OURS), None, [], [], id="gone from Slurm"),
        pytest.param(
            Drain(OURS, put_back=True),
            slurm_node(False),
            [("drain", OURS)],
            ["SlurmDrainRestored"],
            id="a drain removed in Slurm is put back",
        ),
        pytest.param(
            Resume(OURS), slurm_node(True, OURS), [("resume",)], ["SlurmResume"], id="resume"
        ),
        pytest.param(
            Resume(OURS), slurm_node(True, "bad DIMM"), [], [], id="no resume: the reason changed"
        ),
        pytest.param(Resume(OURS), slurm_node(False), [], [], id="no resume: resumed already"),
        pytest.param(Resume(OURS), None, [], [], id="no resume: gone from Slurm"),
        pytest.param(
            SetComment("k8s pod ns/slurmd-0 on node n1"),
            slurm_node(True, "bad DIMM"),
            [("comment", "k8s pod ns/slurmd-0 on node n1")],
            [],
            id="a comment needs no guard",
        ),
    ],
)
async def test_slurm_writes_are_guarded_by_a_read_right_before(
    action: Drain | Resume | SetComment,
    now: SlurmState | None,
    writes: list[tuple[str, ...]],
    told: list[str],
) -> None:
    """The cache decided `action`; what the read right before the write finds is `now`."""
    slurm, kube = FakeSlurm(now), FakeKube()
    syncer = Syncer(kube, slurm)  # type: ignore[arg-type]
    node = Node(metadata=ObjectMeta(name="n1", uid="u1"))
    await syncer._apply_slurm(node, "slurmd-0", Decision(slurm=[action]))
    await syncer.slurm_writes_done()  # written in the background
    assert slurm.writes == writes
    # The Events are written off the worker, once the syncer has had nothing
    # to do for a moment (0.25 s): wait for them, or that long for none.
    async with asyncio.timeout(2):
        while len(kube.reasons) < len(told):
            await asyncio.sleep(0.01)
    if not told:
        await asyncio.sleep(0.3)
    assert kube.reasons == told
    assert slurm.polls == 1  # the view is asked to show the outcome either way
    for kind in ("drain", "resume", "comment"):
        counted = syncer.metrics.registry.get_sample_value(
            "sunk_syncer_actions_total", {"kind": kind}
        )
        assert (counted or 0) == sum(1 for write in writes if write[0] == kind)


class FakeClient:
    """The read the adapter makes right before a write (a port fake, not a slurmrestd)."""

    def __init__(self, answer: SlurmNode | Exception | None, *, hangs: bool = False) -> None:
        self.answer = answer
        self.hangs = hangs

    async def node(self, name: str) -> SlurmNode | None:
        if self.hangs:
            await asyncio.Event().wait()  # as slurmrestd 24.11 can, until its MessageTimeout
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class SlowSlurm(FakeSlurm):
    """Its drains wait for `release`; a write may fail."""

    def __init__(self, now: SlurmState | None, *, fails: bool = False) -> None:
        super().__init__(now)
        self.release = asyncio.Event()
        self.fails = fails

    async def drain(self, name: str, reason: str) -> None:
        await self.release.wait()
        if self.fails:
            raise SlurmUnavailableError("POST", "node/slurmd-0", "refused", maybe_applied=False)
        await super().drain(name, reason)


async def test_events_wait_while_nodes_are_being_reconciled() -> None:
    """A mass change's Events go out once its reconciles are done (at most 5 s later)."""
    slurm, kube = FakeSlurm(slurm_node(False)), FakeKube()
    syncer = Syncer(kube, slurm)  # type: ignore[arg-type]
    syncer.queue.add("n2")  # another node waits for its reconcile
    node = Node(metadata=ObjectMeta(name="n1", uid="u1"))
    await syncer._apply_slurm(node, "slurmd-0", Decision(slurm=[Drain(OURS)]))
    await syncer.slurm_writes_done()
    await asyncio.sleep(0.1)
    assert slurm.writes == [("drain", OURS)]
    assert kube.reasons == []  # held
    syncer.queue.done(await syncer.queue.get())
    async with asyncio.timeout(1):
        while not kube.reasons:
            await asyncio.sleep(0.01)
    assert kube.reasons == ["SlurmDrain"]


async def test_a_reconcile_leaves_its_slurm_write_under_way_and_the_next_one_waits_for_it() -> None:
    """The worker goes on while the batch writer gathers many nodes; the node's
    own next reconcile reads and writes only after that write is done."""
    slurm, kube = SlowSlurm(slurm_node(False)), FakeKube()
    syncer = Syncer(kube, slurm)  # type: ignore[arg-type]
    node = Node(metadata=ObjectMeta(name="n1", uid="u1"))
    async with asyncio.timeout(1):
        await syncer._apply_slurm(node, "slurmd-0", Decision(slurm=[Drain(OURS)]))
    assert slurm.writes == []  # under way
    slurm.now = slurm_node(True, OURS)  # as Slurm has it once written
    after = asyncio.create_task(
        syncer._apply_slurm(node, "slurmd-0", Decision(slurm=[Resume(OURS)]))
    )
    await asyncio.sleep(0.01)
    assert not after.done()  # waits for the drain
    slurm.release.set()
    async with asyncio.timeout(1):
        await after
        await syncer.slurm_writes_done()
    assert slurm.writes == [("drain", OURS), ("resume",)]


async def test_a_failed_slurm_write_reconciles_the_node_again() -> None:
    slurm, kube = SlowSlurm(slurm_node(False), fails=True), FakeKube()
    syncer = Syncer(kube, slurm)  # type: ignore[arg-type]
    node = Node(metadata=ObjectMeta(name="n1", uid="u1"))
    await syncer._apply_slurm(node, "slurmd-0", Decision(slurm=[Drain(OURS)]))
    slurm.release.set()
    async with asyncio.timeout(1):
        await syncer.slurm_writes_done()
    assert syncer.queue.failures("n1") == 1  # queued again, after a back-off
    assert syncer.metrics.registry.get_sample_value(
        "sunk_syncer_actions_total", {"kind": "drain"}
    ) in (None, 0)


class FakeView:
    def __init__(self, cached: SlurmNode) -> None:
        self.cached = cached

    def node(self, name: str) -> SlurmNode | None:
        return self.cached


CACHED = SlurmNode(name="slurmd-0", state=("IDLE",))
NOW = SlurmNode(name="slurmd-0", state=("IDLE", "DRAIN"), reason="bad DIMM")
REFUSED = SlurmApiError(
    "GET", "node/slurmd-0", 500, (SlurmProblem(-1, "Unable to query partitions", ""),)
)


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        pytest.param(FakeClient(NOW), NOW, id="the node as it is now"),
        pytest.param(FakeClient(None), None, id="gone from Slurm"),
        pytest.param(FakeClient(REFUSED), CACHED, id="a failed read: the cached copy"),
        pytest.param(FakeClient(NOW, hangs=True), CACHED, id="a hung read: the cached copy"),
    ],
)
async def test_the_guard_read_falls_back_to_the_cache(
    client: FakeClient, expected: SlurmNode | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_adapter, "GUARD_READ_TIMEOUT", 0.01)
    port = SlurmPortForSyncer(client, FakeView(CACHED))  # type: ignore[arg-type]
    read = await port.read_node("slurmd-0")
    assert read == (None if expected is None else slurm_adapter.slurm_state(expected))


async def test_the_guard_read_raises_when_slurm_cannot_be_reached() -> None:
    down = SlurmUnavailableError("GET", "node/slurmd-0", "refused", maybe_applied=False)
    port = SlurmPortForSyncer(FakeClient(down), FakeView(CACHED))  # type: ignore[arg-type]
    with pytest.raises(SlurmUnavailableError):
        await port.read_node("slurmd-0")


class WritingClient(FakeClient):
    """Takes node updates; `refuse` makes the next one fail."""

    def __init__(self) -> None:
        super().__init__(None)
        self.updates: list[tuple[list[str], dict[str, object]]] = []
        self.refuse: SlurmApiError | None = None

    async def update_nodes(self, names: list[str], update: object) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.updates.append((list(names), update.model_dump(exclude_none=True)))  # type: ignore[attr-defined]


class MarkedView(FakeView):
    """A view whose node list reads are counted as the real one counts them."""

    def __init__(self, cached: SlurmNode) -> None:
        super().__init__(cached)
        self.begun = 0
        self.read = 0

    def node_read_mark(self) -> int:
        return self.begun

    def nodes_read_since(self, mark: int) -> bool:
        return self.read > mark


async def test_the_syncers_own_writes_show_on_the_cached_node_until_the_view_reads_again() -> None:
    view = MarkedView(CACHED)
    client = WritingClient()
    port = SlurmPortForSyncer(client, view)  # type: ignore[arg-type]
    await port.drain("slurmd-0", "sunk/syncer: node cordoned")
    shown = port.node("slurmd-0")
    assert shown is not None
    assert (shown.drained, shown.reason) == (True, "sunk/syncer: node cordoned")
    # A read begun before the drain was written may not show it: the drain stays laid over.
    view.begun += 1
    view.read = view.begun - 1
    assert port.node("slurmd-0") == shown
    # Once a read begun after it succeeds, the cache says what Slurm says (here:
    # someone resumed the node meanwhile), and nothing the syncer wrote hides it.
    view.read = view.begun
    assert port.node("slurmd-0") == slurm_adapter.slurm_state(CACHED)

    view.cached = NOW  # drained by a person
    await port.resume("slurmd-0")  # (the controller's guard read would have kept this back)
    await port.set_comment("slurmd-0", "k8s pod default/slurmd-0 on node n0")
    shown = port.node("slurmd-0")
    assert shown is not None
    assert (shown.drained, shown.reason) == (False, "")
    assert shown.comment == "k8s pod default/slurmd-0 on node n0"
    assert [names for names, _ in client.updates] == [["slurmd-0"]] * 3


async def test_a_write_slurm_refused_is_not_laid_over_the_cached_node() -> None:
    view = MarkedView(CACHED)
    client = WritingClient()
    client.refuse = SlurmApiError("POST", "node/slurmd-0", 400, (SlurmProblem(2016, "no", ""),))
    port = SlurmPortForSyncer(client, view)  # type: ignore[arg-type]
    with pytest.raises(SlurmApiError):
        await port.drain("slurmd-0", "sunk/syncer: node cordoned")
    assert port.node("slurmd-0") == slurm_adapter.slurm_state(CACHED)


async def test_what_the_view_has_read_since_is_dropped_from_the_written_nodes() -> None:
    view = MarkedView(CACHED)
    port = SlurmPortForSyncer(WritingClient(), view)  # type: ignore[arg-type]
    for i in range(slurm_adapter.PRUNE_AT_LEAST):
        await port.set_comment(f"slurmd-{i}", "c")
    view.begun += 1
    view.read = view.begun  # the view has read every node since
    await port.set_comment("slurmd-x", "c")
    assert list(port._written) == ["slurmd-x"]


async def test_a_failed_guard_read_falls_back_to_slurms_copy_not_the_syncers_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A person may have drained the node since sunk's own drain: when the read
    before a resume hangs, sunk's write in its copy must not stand in for it."""
    monkeypatch.setattr(slurm_adapter, "GUARD_READ_TIMEOUT", 0.01)
    view = MarkedView(CACHED)
    client = WritingClient()
    port = SlurmPortForSyncer(client, view)  # type: ignore[arg-type]
    await port.drain("slurmd-0", "sunk/syncer: node cordoned")
    client.hangs = True
    guarded = await port.read_node("slurmd-0")
    assert guarded == slurm_adapter.slurm_state(CACHED)  # not drained: no resume on it
