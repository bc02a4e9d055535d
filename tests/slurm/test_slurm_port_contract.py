"""sunk.slurm against real slurmrestd: every call, the defects, auth, outages.

Parametrized over two Slurm releases: Debian trixie's 24.11 (the session's
bed, data_parser v0.0.40-42) and Debian sid's 26.05 (a private 2-node bed,
v0.0.42-45, all of which sunk speaks). The sid bed is skipped, with
the reason, when its root filesystem cannot be built.

Tests leave the shared bed as they found it: drained nodes are resumed,
jobs cancelled, dynamic nodes deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import jwt
import pytest

from plugins.slurm import external_restd
from sunk.nodeset.slurm_adapter import SlurmPortForNodeSets
from sunk.slurm import (
    Change,
    FileKey,
    Job,
    JobEvent,
    JobSpec,
    JobUpdate,
    JwtMinter,
    NodeEvent,
    NodeUpdate,
    ReservationSpec,
    SlurmApiError,
    SlurmAuthError,
    SlurmClient,
    SlurmNotFoundError,
    SlurmProblem,
    SlurmStaleError,
    SlurmUnsupportedError,
    SlurmView,
    StateEvent,
    StaticKey,
    StaticToken,
    Subscription,
    ViewState,
)
from sunk.slurm.dialect import SUPPORTED_VERSIONS, version_key
from sunk.slurm.hostlist import expand
from sunk_testbed.procs import Supervisor, free_port
from sunk_testbed.slurm_cluster import (
    DYNAMIC_FEATURE,
    PARTITION,
    PLAIN_UID,
    SlurmAccess,
    SlurmCluster,
    ensure_rootfs,
)

pytestmark = pytest.mark.contract

T = TypeVar("T")


@dataclass(frozen=True)
class Bed:
    suite: str
    cluster: SlurmCluster
    access: SlurmAccess

    @property
    def node(self) -> str:
        """The node tests may drain (the last one; restored afterwards)."""
        return self.access.nodes[-1]


@pytest.fixture(scope="session")
def sid_bed(testbed_external: bool) -> Iterator[Bed]:
    if testbed_external or external_restd() is not None:
        pytest.skip("the sid bed is only started for the tests' own bed")
    try:
        rootfs = ensure_rootfs("sid")
    except RuntimeError as exc:  # no mirror, no debootstrap: say so, do not fail
        pytest.skip(f"Debian sid's Slurm is not available: {exc}")
    state = Path(tempfile.mkdtemp(prefix="sunk-sp-", dir="/tmp"))
    cluster = SlurmCluster(state, Supervisor(state), rootfs, nodes=2)
    try:
        access = cluster.start()
        yield Bed("sid", cluster, access)
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session", params=["trixie", "sid"])
def bed(request: pytest.FixtureRequest) -> Bed:
    if request.param == "sid":
        sid: Bed = request.getfixturevalue("sid_bed")
        return sid
    cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
    return Bed("trixie", cluster, cluster.access())


def minter(bed: Bed, **kwargs: float) -> JwtMinter:
    return JwtMinter(FileKey(bed.access.jwt_key), "root", **kwargs)


@pytest.fixture
async def slurm(bed: Bed) -> AsyncIterator[SlurmClient]:
    """A root client; any warning Slurm sends fails the test (it means a dialect bug)."""
    warnings: list[str] = []

    def on_warning(method: str, path: str, problem: SlurmProblem) -> None:
        warnings.append(f"{method} {path}: {problem.description}")

    async with SlurmClient(bed.access.restd_url, minter(bed), on_warning=on_warning) as client:
        yield client
    assert warnings == []


async def eventually(what: str, check: Callable[[], Awaitable[T | None]], timeout: float = 15) -> T:
    deadline = time.monotonic() + timeout
    while True:
        if (result := await check()) is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def running_job(slurm: SlurmClient, job_id: int, what: str = "the job running") -> Job:
    """The job once RUNNING (other tests' jobs may hold the nodes for a moment)."""

    async def running() -> Job | None:
        job = await slurm.job(job_id)
        return job if job is not None and job.state == "RUNNING" else None

    return await eventually(what, running, timeout=45)


async def next_event(
    events: Subscription, match: Callable[[object], bool], timeout: float = 10
) -> object:
    async with asyncio.timeout(timeout):
        while True:
            event = await events.get()
            if match(event):
                return event


@contextlib.asynccontextmanager
async def restored(slurm: SlurmClient, name: str) -> AsyncIterator[None]:
    """Whatever a test does to `name`, leave it undrained, idle and without comment."""
    try:
        yield
    finally:
        node = await slurm.node(name)
        if node is not None and (node.draining or node.base_state == "DOWN"):
            try:
                await slurm.resume(name)
            except SlurmApiError as refused:
                # A DOWN node whose slurmd registered again since the read is
                # back already (ReturnToService): Slurm's "not down" (seen in CI).
                if refused.errno not in (2028, 2180):
                    raise
        await slurm.update_node(name, NodeUpdate(comment=""))

        async def idle() -> bool:
            node = await slurm.node(name)
            return node is not None and node.state == ("IDLE",)

        await eventually(f"{name} idle again", idle)


def sleeper(**kwargs: object) -> JobSpec:
    fields: dict[str, object] = {
        "script": "#!/bin/sh\nsleep 300\n",
        "name": f"sunk-port-{uuid.uuid4().hex[:6]}",
        "partition": PARTITION,
        "nodes": "1",
        "tasks": 1,
        "time_limit_minutes": 5,
        "standard_output": "/dev/null",
    }
    fields.update(kwargs)
    return JobSpec.model_validate(fields)


# -- version negotiation ------------------------------------------------------


async def test_speaks_the_newest_version_both_know(slurm: SlurmClient, bed: Bed) -> None:
    info = await slurm.negotiate()
    assert info.release == bed.access.slurm_version
    expected = {"trixie": "v0.0.42", "sid": "v0.0.45"}[bed.suite]
    assert info.api_version == expected
    assert expected in info.offered


async def test_every_offered_version_does_the_basics(bed: Bed) -> None:
    """One round of the common calls in each version both sides speak."""
    async with SlurmClient(bed.access.restd_url, minter(bed)) as probe:
        offered = (await probe.negotiate()).offered
    versions = sorted(set(offered) & set(SUPPORTED_VERSIONS), key=version_key)
    assert len(versions) == {"trixie": 3, "sid": 4}[bed.suite]  # 40-42; 42-45
    for version in versions:
        async with SlurmClient(bed.access.restd_url, minter(bed), api_version=version) as slurm:
            listing = await slurm.nodes()
            assert listing is not None
            assert set(bed.access.nodes) <= {n.name for n in listing.items}
            node = await slurm.node(bed.node)
            assert node is not None
            assert node.partitions == (PARTITION,)
            [ping] = await slurm.ping()
            assert ping.up
            assert ping.primary
            submitted = await slurm.submit(sleeper(exclusive=True, hold=True))
            job = await slurm.job(submitted.job_id)
            assert job is not None
            assert job.state == "PENDING"
            assert job.time_limit == 5
            await slurm.cancel(submitted.job_id)
            with pytest.raises(SlurmNotFoundError) as missing:
                await slurm.cancel(999_999)  # v0.0.40/41 hide this; sunk asks
            assert missing.value.errno == 2017
            assert slurm.stats.warnings == 0, version


# -- controller ----------------------------------------------------------------


async def test_ping_and_diag(slurm: SlurmClient) -> None:
    [ping] = await slurm.ping()
    assert ping.up
    assert ping.primary
    version = (await slurm.negotiate()).api_version
    assert ping.mode == ("primary" if version_key(version) < (0, 0, 45) else "")  # gone in 45
    diag = await slurm.diag()
    assert diag.server_thread_count >= 1
    assert diag.jobs_submitted >= 0


async def test_reconfigure_and_carry_on(slurm: SlurmClient, bed: Bed) -> None:
    await slurm.reconfigure()

    async def answering() -> bool:
        [ping] = await slurm.ping()
        nodes = await slurm.nodes()
        return ping.up and nodes is not None

    # 24.11 restarts slurmctld in place: the client rides it out.
    await eventually("slurmctld back after reconfigure", answering, timeout=30)


# -- nodes -----------------------------------------------------------------------


async def test_list_and_get_nodes(slurm: SlurmClient, bed: Bed) -> None:
    listing = await slurm.nodes()
    assert listing is not None
    assert listing.last_update > 0
    by_name = {n.name: n for n in listing.items}
    for name in bed.access.nodes:
        node = by_name[name]
        assert node.cpus == 2
        assert node.partitions == (PARTITION,)
        assert node.version == bed.access.slurm_version
    node = await slurm.node(bed.node)
    assert node is not None
    assert node.name == bed.node
    assert await slurm.node("no-such-node") is None


async def test_unchanged_nodes_read_incrementally(slurm: SlurmClient) -> None:
    for _ in range(5):  # a job of an earlier test ending may slip in: try again
        listing = await slurm.nodes()
        assert listing is not None
        try:
            if await slurm.nodes(since=listing.last_update) is None:
                return
        except SlurmApiError:
            pass  # 24.11's defect after a recent node change
        await asyncio.sleep(1.1)
    raise AssertionError("an unchanged cluster never answered 304")


async def test_drain_resume_reason_features_comment(slurm: SlurmClient, bed: Bed) -> None:
    name = bed.node
    reason = f"sunk port {uuid.uuid4().hex[:6]}"
    async with restored(slurm, name):
        await slurm.drain(name, reason)
        node = await slurm.node(name)
        assert node is not None
        assert node.draining
        assert node.drained  # idle: nothing runs there
        assert node.reason == reason
        assert node.reason_set_by_user == "root"
        shown = bed.cluster.run(["scontrol", "show", "node", name]).stdout
        assert f"Reason={reason} [root@" in shown

        await slurm.update_node(name, NodeUpdate(features=("rack7", "h100"), comment="hello"))
        node = await slurm.node(name)
        assert node is not None
        assert node.features == ("rack7", "h100")
        assert node.active_features == ("rack7", "h100")
        assert node.comment == "hello"

        await slurm.resume(name)

        async def undrained() -> bool:
            node = await slurm.node(name)
            return node is not None and not node.draining

        await eventually(f"{name} undrained", undrained)
        # RESUME of a node that is not drained: Slurm's own "no".
        with pytest.raises(SlurmApiError) as refused:
            await slurm.resume(name)
        # 24.11: 2028 "Invalid node state specified"; 26.05: 2180 "... transition".
        assert refused.value.errno in (2028, 2180)
        assert refused.value.message.startswith("Invalid node state")
        # DOWN, then back. ReturnToService=2 returns the node as soon as its
        # slurmd registers again, which can beat the read (seen in CI): try
        # until one read sees it down.
        for _ in range(5):
            await slurm.update_node(name, NodeUpdate(state="DOWN", reason="sunk port down"))
            node = await slurm.node(name)
            assert node is not None
            if node.base_state == "DOWN":
                break
            assert node.base_state == "IDLE"
        assert node.base_state == "DOWN"
        assert node.reason == "sunk port down"
        assert not node.responding


async def test_node_errors_are_typed(slurm: SlurmClient, bed: Bed) -> None:
    with pytest.raises(SlurmNotFoundError) as unknown:
        await slurm.drain("no-such-node", "x")
    assert unknown.value.errno == 2018
    # Static nodes cannot be deleted: 500 on 24.11, 422 on 26.05, same errno.
    with pytest.raises(SlurmApiError) as static:
        await slurm.delete_node(bed.access.nodes[0])
    assert static.value.errno == 2028
    assert static.value.status in (422, 500)


async def test_plain_user_may_read_but_not_drain(bed: Bed) -> None:
    user = bed.access.plain_user
    async with SlurmClient(
        bed.access.restd_url, JwtMinter(FileKey(bed.access.jwt_key), user)
    ) as slurm:
        assert await slurm.nodes() is not None
        with pytest.raises(SlurmApiError) as refused:
            await slurm.drain(bed.node, "not mine to drain")
        assert refused.value.errno == 2010
        assert not isinstance(refused.value, SlurmAuthError)


def start_dynamic_slurmd(cluster: SlurmCluster, name: str) -> subprocess.Popen[bytes]:
    (cluster.spool_slurmd / name).mkdir(exist_ok=True)
    conf = f"Feature={DYNAMIC_FEATURE} CPUs=1 Port={free_port()}"
    argv = cluster.sandbox().argv(["slurmd", "-D", "-Z", "-N", name, "--conf", conf])
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def test_a_nodeset_drain_keeps_a_drain_made_since_the_last_poll(
    slurm: SlurmClient, bed: Bed
) -> None:
    """The NodeSet controller decides from a view up to a poll old; a person's
    drain made since must keep its reason, not be replaced by the update's."""
    name = bed.node
    async with SlurmView(slurm, interval=3600, watch_jobs=False) as view, restored(slurm, name):
        await view.refresh()
        port = SlurmPortForNodeSets(slurm, view)
        assert not view.nodes()[name].draining
        await slurm.drain(name, "admin: bad GPU")  # behind the view's back
        assert not await port.drain_unless_drained(name, "sunk/nodeset: an update")
        node = await slurm.node(name)
        assert node is not None
        assert node.reason == "admin: bad GPU"
        await slurm.resume(name)
        assert await port.drain_unless_drained(name, "sunk/nodeset: an update")
        node = await slurm.node(name)
        assert node is not None
        assert node.reason == "sunk/nodeset: an update"


async def test_dynamic_node_added_then_deleted(slurm: SlurmClient, bed: Bed) -> None:
    name = f"dyn{uuid.uuid4().hex[:4]}"
    async with SlurmView(slurm, interval=0.2, watch_jobs=False) as view:
        events = view.subscribe(replay=False)
        slurmd = start_dynamic_slurmd(bed.cluster, name)
        try:
            added = await next_event(
                events,
                lambda e: isinstance(e, NodeEvent) and e.name == name and e.new is not None,
                timeout=15,
            )
            assert isinstance(added, NodeEvent)
            assert added.change is Change.ADDED
            assert DYNAMIC_FEATURE in added.new.features  # type: ignore[union-attr]
        finally:
            kill(slurmd)
        # A dynamic node can go once its slurmd is gone (Slurm refuses while busy).
        await slurm.delete_node(name)
        removed = await next_event(
            events, lambda e: isinstance(e, NodeEvent) and e.change is Change.REMOVED
        )
        assert isinstance(removed, NodeEvent)
        assert removed.name == name
        assert removed.old is not None
        assert await slurm.node(name) is None


def kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


# -- jobs --------------------------------------------------------------------------


async def test_submit_read_update_signal_cancel(slurm: SlurmClient, bed: Bed) -> None:
    spec = sleeper(
        script=(
            "#!/bin/sh\ntrap 'echo got-usr1' USR1\necho trapped\nwhile true; do sleep 0.2; done\n"
        ),
        standard_output="/tmp/sunk-port-%j.out",
        comment="sunk-port",
    )
    submitted = await slurm.submit(spec)
    try:
        started = await running_job(slurm, submitted.job_id)
        assert started.name == spec.name
        assert started.comment == "sunk-port"
        assert started.user_name == "root"
        assert started.nodes in bed.access.nodes
        listing = await slurm.jobs()
        assert listing is not None
        assert submitted.job_id in {j.job_id for j in listing.items}

        await slurm.update_job(submitted.job_id, JobUpdate(comment="updated", time_limit_minutes=9))
        job = await slurm.job(submitted.job_id)
        assert job is not None
        assert (job.comment, job.time_limit) == ("updated", 9)

        output = bed.cluster.tmp / f"sunk-port-{submitted.job_id}.out"

        # RUNNING in Slurm comes before the script has set its trap; a USR1
        # before that would kill it (the default action), not be caught.
        async def trapped() -> bool:
            return output.exists() and "trapped" in output.read_text()

        await eventually("the batch script to set its trap", trapped)
        await slurm.signal(submitted.job_id, "SIGUSR1", full=True)

        async def delivered() -> bool:
            return output.exists() and "got-usr1" in output.read_text()

        await eventually("SIGUSR1 delivered to the batch script", delivered)
    finally:
        await slurm.cancel(submitted.job_id)
    job = await slurm.job(submitted.job_id)
    assert job is None or job.state == "CANCELLED"
    await slurm.cancel(submitted.job_id)  # already done: fine, not an error
    with pytest.raises(SlurmNotFoundError) as unknown:
        await slurm.cancel(999_999)  # a 200 reply with 2017 inside
    assert unknown.value.errno == 2017
    assert unknown.value.status == 200
    assert await slurm.job(999_999) is None
    with pytest.raises(SlurmNotFoundError):
        await slurm.update_job(999_999, JobUpdate(comment="x"))


async def test_a_token_naming_a_uid_acts_as_that_user(slurm: SlurmClient, bed: Bed) -> None:
    """What the scheduler's per-tenant tokens rest on: a token whose user is a
    uid slurmctld knows acts as that user, an allocation asked with it runs as
    that user, and the user may end it."""
    tenant = slurm.acting_as(JwtMinter(FileKey(bed.access.jwt_key), str(PLAIN_UID)))
    others = await slurm.submit(sleeper())  # root's
    # A pending job of higher priority would refuse the allocation (2013).
    await running_job(slurm, others.job_id, "root's job running")

    async def allocated() -> int | None:
        try:
            return (await tenant.allocate(sleeper(script=None, immediate=True))).job_id
        except SlurmApiError as refused:
            if refused.errno != 2016:  # not "nodes busy" (another test's job, for a moment)
                raise
            return None

    try:
        job_id = await eventually("an immediate allocation", allocated, timeout=45)
        job = await slurm.job(job_id)
        assert job is not None
        assert (job.user_id, job.user_name, job.state) == (
            PLAIN_UID,
            bed.access.plain_user,
            "RUNNING",
        )
        # Not tried here: the tenant cancelling root's job. Slurm refuses it
        # (EPERM), but on 24.11 and 26.05 slurmctld then stops answering job
        # reads (squeue times out): a REST cancel must only ever name a job of
        # the token's own user (docs/slurm-port.md).
        await tenant.cancel(job_id)
        job = await slurm.job(job_id)
        assert job is None or job.state == "CANCELLED"
    finally:
        await slurm.cancel(others.job_id)


async def test_a_running_jobs_layout_names_its_nodes(slurm: SlurmClient, bed: Bed) -> None:
    """`GET /resources/{job_id}` (v0.0.44+): where a job runs and what it holds
    there, the call the GPU work reads device indices from; 24.11 lacks it."""
    if bed.suite == "trixie":
        with pytest.raises(SlurmUnsupportedError, match="resources"):
            await slurm.job_layout(1)
        return
    assert await slurm.job_layout(999_999) is None
    submitted = await slurm.submit(sleeper())
    try:
        job = await running_job(slurm, submitted.job_id)
        layout = await slurm.job_layout(submitted.job_id)
        assert layout is not None
        assert [node.node for node in layout] == expand(job.nodes)
        assert layout[0].core_bitmap  # the cores it holds there
        assert layout[0].gres == ()  # the bed's nodes have no GRES
    finally:
        await slurm.cancel(submitted.job_id)


async def test_a_rejected_submission_carries_slurms_reason(slurm: SlurmClient) -> None:
    with pytest.raises(SlurmApiError) as rejected:
        await slurm.submit(sleeper(partition="no-such-partition"))
    assert rejected.value.errno == 2000
    assert rejected.value.message == "Invalid partition name specified"
    assert "Batch job submission failed" in str(rejected.value)
    with pytest.raises(SlurmApiError) as too_big:
        await slurm.submit(sleeper(nodes="99"))
    assert too_big.value.errno != 0
    assert too_big.value.message
    assert slurm.stats.retries == 0  # Slurm's "no" is final: never retried


# -- partitions and reservations -----------------------------------------------------


async def test_partitions(slurm: SlurmClient, bed: Bed) -> None:
    [partition] = await slurm.partitions()
    assert partition.name == PARTITION
    assert partition.state == ("UP",)
    assert partition.nodes.total == len(bed.access.nodes)
    assert partition.node_sets == "dynamic"


async def test_reservations(slurm: SlurmClient, bed: Bed) -> None:
    spec = ReservationSpec(
        name=f"maint-{uuid.uuid4().hex[:6]}",
        nodes=(bed.node,),
        start_time=int(time.time()) + 3600,
        duration_minutes=60,
    )
    if bed.suite == "trixie":  # v0.0.42 has no reservation writes (Slurm 25.05+)
        with pytest.raises(SlurmUnsupportedError, match="reservation"):
            await slurm.create_reservation(spec)
        assert await slurm.reservations() == []
        return
    await slurm.create_reservation(spec)
    try:
        got = await slurm.reservation(spec.name)
        assert got is not None
        assert got.node_list == bed.node
        assert {"MAINT", "IGNORE_JOBS"} <= set(got.flags)
        assert got.end_time is not None
        assert got.start_time is not None
        assert got.end_time - got.start_time == 3600
        # Same name again: Slurm updates it in place.
        await slurm.create_reservation(spec.model_copy(update={"duration_minutes": 30}))
        got = await slurm.reservation(spec.name)
        assert got is not None
        assert got.end_time is not None
        assert got.start_time is not None
        assert got.end_time - got.start_time == 1800
        assert [r.name for r in await slurm.reservations()] == [spec.name]
    finally:
        await slurm.delete_reservation(spec.name)
    assert await slurm.reservation(spec.name) is None
    with pytest.raises(SlurmNotFoundError):
        await slurm.delete_reservation(spec.name)


async def test_an_update_window_reserves_its_nodes_and_keeps_long_jobs_off_them(
    slurm: SlurmClient, bed: Bed
) -> None:
    """The NodeSet port's maintenance reservation: made once, not rewritten
    while unchanged; a job that would still run at the window's start does not
    begin on the reserved nodes, a shorter one does."""
    name = f"sunk-update-{uuid.uuid4().hex[:6]}"
    start = int(time.time()) + 600
    nodes = sorted(bed.access.nodes)
    async with SlurmView(slurm, interval=0.2, watch_jobs=False) as view:
        port = SlurmPortForNodeSets(slurm, view)
        if bed.suite == "trixie":  # no reservation writes through REST before 25.05
            assert await port.reserve(name, nodes, start, start + 3600) is not None
            await port.unreserve(name)
            assert await slurm.reservations() == []
            return
        jobs: list[int] = []
        try:
            assert await port.reserve(name, nodes, start, start + 3600) is None
            before = slurm.stats.requests
            assert await port.reserve(name, nodes, start, start + 3600) is None
            assert slurm.stats.requests == before
            got = await slurm.reservation(name)
            assert got is not None
            assert sorted(expand(got.node_list)) == nodes
            assert "MAINT" in got.flags
            assert (got.start_time, got.end_time) == (start, start + 3600)

            across = await slurm.submit(sleeper(time_limit_minutes=30))
            before_it = await slurm.submit(sleeper(time_limit_minutes=5))
            jobs += [across.job_id, before_it.job_id]

            async def started() -> bool:
                job = await slurm.job(before_it.job_id)
                return job is not None and job.state == "RUNNING"

            await eventually("the job that ends before the window running", started, 45)
            held = await slurm.job(across.job_id)
            assert held is not None
            assert held.state == "PENDING", held
            print(f"the 30-minute job pends: {held.state_reason}")

            # The window opens (its start is past, which Slurm refuses: the
            # port starts it now); the running job is left alone.
            now = int(time.time())
            assert await port.reserve(name, nodes, now - 300, now + 3600) is None
            got = await slurm.reservation(name)
            assert got is not None
            assert got.start_time is not None
            assert got.start_time <= now + 1
            job = await slurm.job(before_it.job_id)
            assert job is not None
            assert job.state == "RUNNING"
        finally:
            for job_id in jobs:
                with contextlib.suppress(SlurmNotFoundError):
                    await slurm.cancel(job_id)
            await port.unreserve(name)
        assert await slurm.reservation(name) is None
        before = slurm.stats.requests
        await port.unreserve(name)
        assert slurm.stats.requests == before


# -- authentication -----------------------------------------------------------------


async def test_expired_tokens_are_renewed_and_bad_ones_typed(bed: Bed) -> None:
    url = bed.access.restd_url
    key = bed.access.jwt_key.read_bytes()
    now = int(time.time())
    expired = jwt.encode({"iat": now - 120, "exp": now - 60, "sun": "root"}, key, "HS256")
    async with SlurmClient(url, StaticToken("root", expired)) as slurm:
        with pytest.raises(SlurmAuthError) as rejected:
            await slurm.nodes()
        assert rejected.value.status == 511
        assert rejected.value.errno == 1007
        assert expired not in str(rejected.value)

    # sunk's own short-lived tokens: the minter renews them before they die.
    short = JwtMinter(StaticKey(key), "root", lifetime=2, renew_before=0.5)
    async with SlurmClient(url, short) as slurm:
        assert await slurm.nodes() is not None
        await asyncio.sleep(2.2)  # the first token has expired by now
        assert await slurm.nodes() is not None
    assert short.minted == 2

    # A key slurmctld does not know: renewed once, then refused for good.
    forged = JwtMinter(StaticKey(b"x" * 32), "root")
    async with SlurmClient(url, forged) as slurm:
        with pytest.raises(SlurmAuthError) as refused:
            await slurm.jobs()
        assert refused.value.errno == 1007
    assert forged.minted == 2

    # No token at all: the HTTP layer's plain-text 401.
    async with SlurmClient(url, StaticToken("root", "")) as slurm:
        with pytest.raises(SlurmAuthError) as missing:
            await slurm.negotiate()
        assert missing.value.status == 401
        assert missing.value.message == "Authentication failure"


# -- the cached view --------------------------------------------------------------------


async def test_view_of_an_unchanged_cluster_costs_small_replies(
    slurm: SlurmClient, bed: Bed
) -> None:
    async with SlurmView(slurm, interval=0.1) as view:
        assert view.fresh
        assert set(bed.access.nodes) <= set(view.nodes())

        async def quiet() -> bool:  # two unchanged polls in a row: settled
            before = view.stats.unchanged
            await asyncio.sleep(0.5)
            return view.stats.unchanged - before >= 8

        await eventually("the cluster to settle", quiet, timeout=20)
        requests, received = slurm.stats.requests, slurm.stats.bytes_received
        full = view.stats.full_reads + view.stats.changed
        await asyncio.sleep(1.0)
        polls = slurm.stats.requests - requests
        assert polls >= 10
        per_request = (slurm.stats.bytes_received - received) / polls
        if view.stats.full_reads + view.stats.changed == full:
            assert per_request < 1200  # 304s and "no job changes", not listings


async def test_view_sees_a_drain_despite_the_defect(slurm: SlurmClient, bed: Bed) -> None:
    name = bed.node
    async with SlurmView(slurm, interval=0.2) as view, restored(slurm, name):
        events = view.subscribe(replay=False)
        await asyncio.sleep(1.1)  # update_time has 1 s resolution
        fallbacks = view.stats.fallbacks
        bed.cluster.run(["scontrol", "update", f"nodename={name}", "state=drain", "reason=view"])
        event = await next_event(
            events,
            lambda e: (
                isinstance(e, NodeEvent) and e.name == name and e.new is not None and e.new.draining
            ),
        )
        assert isinstance(event, NodeEvent)
        assert event.change is Change.CHANGED
        assert event.old is not None
        assert not event.old.draining
        assert event.new is not None
        assert event.new.reason == "view"
        node = view.node(name)
        assert node is not None
        assert node.draining
        if bed.access.slurm_version.startswith("24.11."):
            # The incremental read failed with "Unable to query partitions";
            # the view fell back to a full read instead of going stale.
            assert view.stats.fallbacks > fallbacks
        assert view.fresh


async def test_view_job_events_and_forced_reads(slurm: SlurmClient, bed: Bed) -> None:
    async with SlurmView(slurm, interval=0.2) as view:
        events = view.subscribe(replay=False)
        submitted = await slurm.submit(sleeper(hold=True))
        added = await next_event(
            events, lambda e: isinstance(e, JobEvent) and e.job_id == submitted.job_id
        )
        assert isinstance(added, JobEvent)
        assert added.change is Change.ADDED
        assert added.new is not None
        assert added.new.state == "PENDING"
        await slurm.cancel(submitted.job_id)
        # refresh(): read now rather than at the next poll.
        await view.refresh()
        job = view.job(submitted.job_id)
        assert job is None or job.state == "CANCELLED"
        changed = await next_event(
            events, lambda e: isinstance(e, JobEvent) and e.job_id == submitted.job_id
        )
        assert isinstance(changed, JobEvent)
        assert changed.new is None or changed.new.state == "CANCELLED"
        # refresh_node(): the one node, fresh, before a dangerous action.
        node = await view.refresh_node(bed.node)
        assert node is not None
        assert node.name == bed.node
        assert await view.refresh_node("no-such-node") is None
        # Replay: a late subscriber first gets what is cached.
        late = view.subscribe()
        names = set()
        while (event := late.get_nowait()) is not None:
            if isinstance(event, NodeEvent):
                assert event.change is Change.ADDED
                names.add(event.name)
        assert set(bed.access.nodes) <= names


async def test_a_job_state_probe_follows_starts_and_ends_without_reading_the_list(
    slurm: SlurmClient,
) -> None:
    """`GET /jobs/state/` on both versions: every job's state, in the list's own
    words (a probe right after a list read finds nothing moved), and a view that
    probes learns a release and a cancel from it plus a read of that one job."""
    held = await slurm.submit(sleeper(hold=True))
    try:
        states = await slurm.job_states()
        assert states is not None
        assert states[held.job_id] == ("PENDING",)
        async with SlurmView(
            slurm, interval=0.2, watch_nodes=False, job_probe=True, detail_every=3600
        ) as view:
            events = view.subscribe(replay=False)
            assert view.job(held.job_id) is not None
            probes, lists = view.stats.probes, view.stats.changed + view.stats.full_reads
            await asyncio.sleep(0.5)
            assert view.stats.probes > probes
            assert view.stats.probe_reads == 0  # the list's states and the probe's agree
            await slurm.update_job(held.job_id, JobUpdate(hold=False))
            started = await next_event(
                events,
                lambda e: (
                    isinstance(e, JobEvent)
                    and e.job_id == held.job_id
                    and e.new is not None
                    and e.new.state == "RUNNING"
                ),
                timeout=20,
            )
            assert isinstance(started, JobEvent)
            assert started.new is not None
            assert started.new.nodes  # the one-job read's detail
            await slurm.cancel(held.job_id)
            ended = await next_event(
                events,
                lambda e: (
                    isinstance(e, JobEvent)
                    and e.job_id == held.job_id
                    and (e.new is None or e.new.state != "RUNNING")
                ),
            )
            assert isinstance(ended, JobEvent)
            assert view.stats.changed + view.stats.full_reads == lists  # no list read
            assert view.stats.probe_reads >= 2
    finally:
        with contextlib.suppress(SlurmApiError):
            await slurm.cancel(held.job_id)


async def test_view_goes_stale_then_recovers_over_a_restd_restart(
    slurm: SlurmClient, bed: Bed, testbed_external: bool
) -> None:
    """slurmrestd stops mid poll loop: stale at once, fresh again on its return.

    A drain made while it was away (through the CLI, which does not need it)
    arrives as an event after recovery; the same client is used throughout.
    """
    if testbed_external:
        pytest.skip("does not restart the slurmrestd of a bed it did not start")
    name = bed.node
    async with SlurmView(slurm, interval=0.2, max_backoff=0.5) as view, restored(slurm, name):
        events = view.subscribe(replay=False)
        assert view.fresh
        bed.cluster.stop_restd()
        try:
            stale = await next_event(
                events, lambda e: isinstance(e, StateEvent) and e.state is ViewState.STALE
            )
            assert isinstance(stale, StateEvent)
            assert "unavailable" in stale.reason
            assert not view.fresh
            with pytest.raises(SlurmStaleError):
                view.nodes()
            assert view.nodes(allow_stale=True)  # old data, only on request
            bed.cluster.run(
                ["scontrol", "update", f"nodename={name}", "state=drain", "reason=while-away"]
            )
            await asyncio.sleep(0.5)
            assert not view.fresh
        finally:
            bed.cluster.start_restd()
        fresh = await next_event(
            events, lambda e: isinstance(e, StateEvent) and e.state is ViewState.FRESH
        )
        assert isinstance(fresh, StateEvent)
        assert view.fresh
        node = view.node(name)
        assert node is not None
        assert node.draining
        assert node.reason == "while-away"
        assert view.stats.failures >= 1


async def test_one_request_drains_and_resumes_several_nodes(slurm: SlurmClient, bed: Bed) -> None:
    """`update_nodes` names its nodes as a hostlist in the path (brackets and
    commas encoded): slurmrestd passes it to slurmctld, which updates them all."""
    names = bed.access.nodes[-3:]  # three on trixie's bed, two on sid's
    reason = f"sunk port bulk {uuid.uuid4().hex[:6]}"
    async with contextlib.AsyncExitStack() as stack:
        for name in names:
            await stack.enter_async_context(restored(slurm, name))
        await slurm.update_nodes(names, NodeUpdate(state="DRAIN", reason=reason))
        for name in names:
            node = await slurm.node(name)
            assert node is not None
            assert node.draining
            assert node.reason == reason

        await slurm.update_nodes(names, NodeUpdate(state="RESUME"))

        async def all_undrained() -> bool:
            nodes = [await slurm.node(name) for name in names]
            return all(node is not None and not node.draining for node in nodes)

        await eventually(f"{', '.join(names)} undrained", all_undrained)


async def test_a_bulk_resume_refused_for_one_node_resumes_the_others(
    slurm: SlurmClient, bed: Bed
) -> None:
    """The syncer's batch of resumes may hold a node resumed meanwhile (a repeat
    after a stale read): Slurm refuses that one but goes on through the hostlist,
    so the others are resumed by the same request (what `BatchWriter` relies on)."""
    names = bed.access.nodes[-2:]
    drained, undrained = names
    async with contextlib.AsyncExitStack() as stack:
        for name in names:
            await stack.enter_async_context(restored(slurm, name))
        await slurm.drain(drained, f"sunk port partial {uuid.uuid4().hex[:6]}")
        with pytest.raises(SlurmApiError) as refused:
            await slurm.update_nodes([undrained, drained], NodeUpdate(state="RESUME"))
        assert refused.value.errno in (2028, 2180), refused.value
        node = await slurm.node(drained)
        assert node is not None
        assert not node.draining
