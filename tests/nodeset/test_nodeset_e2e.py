"""NodeSet end to end: the controller with the real Slurm port, real slurmd pods, real jobs.

One module bed: the session's five real nodes (kubelet + containerd; four
labelled for the NodeSet, the fifth labelled later), slurmd pods from the slurm
image, its own Slurm (no static nodes, configless, controller at the room's
host address, a `compute` partition over the NodeSet `compute`), and the
NodeSet controller in-process with `SlurmPortForNodeSets` over a real
`SlurmClient` + `SlurmView`. The tests run in order and share the
NodeSet `compute`: created in the first, updated by the later ones.

Why its own Slurm rather than the charts: the controller runs in-process, so
a test can kill it mid-update and start it again, against a Slurm it can
inspect; the NodeSet and partition lines are those the slurm chart writes for
a NodeSet (charts/slurm/templates/_config.tpl).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from plugins.nodes import RealNodes
from plugins.slurm_pods import slurm_bed
from sunk.api import LABEL_NODESET, LABEL_TEMPLATE_HASH
from sunk.api import nodeset as api
from sunk.api.install import install_crds
from sunk.nodeset.controller import NodeSetController
from sunk.nodeset.plan import REASON_PREFIX, REASON_SCALE_IN
from sunk.nodeset.slurm_adapter import SlurmPortForNodeSets
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.view import SlurmView
from sunk_testbed import slurmpods
from sunk_testbed.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.e2e
NodeSet = api.resource()
NAME = "compute"
POOL = "sunk.test/pool"


class ErrorLog(logging.Handler):
    """sunk's errors while the operator runs, for a timed-out wait to show."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        cause = record.exc_info[1] if record.exc_info else None
        self.lines.append(f"{record.getMessage()}: {cause!r}" if cause else record.getMessage())


class Operator:
    """The NodeSet controller with the real Slurm port; stopped and started like a process."""

    def __init__(self, kube: AsyncClient, restd_url: str, jwt_key: Path, namespace: str) -> None:
        self.kube, self.url, self.key, self.namespace = kube, restd_url, jwt_key, namespace
        self._task: asyncio.Task[None] | None = None
        self.starts = 0
        self.errors = ErrorLog()
        logging.getLogger("sunk").addHandler(self.errors)

    async def _run(self) -> None:
        credentials = JwtMinter(FileKey(self.key), "root")
        async with SlurmClient(self.url, credentials) as client:
            view = SlurmView(client, interval=0.5, watch_jobs=False)
            async with view:
                port = SlurmPortForNodeSets(client, view)
                controller = NodeSetController(self.kube, port, namespace=self.namespace)
                await controller.run()

    def start(self) -> None:
        assert self._task is None or self._task.done()
        self._task = asyncio.create_task(self._run())
        self.starts += 1

    async def stop(self) -> None:
        """A crash as far as Kubernetes and Slurm can tell: the task dies wherever it is."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def crashed(self) -> bool:
        return self._task is not None and self._task.done() and not self._task.cancelled()

    def check(self) -> None:
        if self._task is not None and self._task.done():
            self._task.result()  # raises what killed it


@dataclass
class Bed:
    cluster: SlurmCluster
    kube: AsyncClient
    namespace: str
    nodes: list[str]
    operator: Operator
    ctld_port: int
    tag: str
    image: str
    timings: dict[str, float] = field(default_factory=dict)
    last_unsettled: str = ""

    def slurm(self, *argv: str, check: bool = True) -> str:
        return self.cluster.run(list(argv), check=check, timeout=30).stdout

    async def aslurm(self, *argv: str, check: bool = True) -> str:
        return await asyncio.to_thread(self.slurm, *argv, check=check)

    async def submit(self, node: str, seconds: int) -> str:
        """A batch job of `sleep seconds` pinned to the Slurm node; its id."""
        out = await self.aslurm(
            "sbatch", "--parsable", "-p", NAME, "-w", node, "--chdir=/tmp", "-o", "/dev/null",
            "--wrap", f"sleep {seconds}",
        )  # fmt: skip
        return out.strip().split(";")[0]

    async def run_job(self, node: str, seconds: int) -> str:
        """`submit`, then wait until the job runs."""
        job = await self.submit(node, seconds)

        async def running() -> bool:
            return "JobState=RUNNING" in await self.aslurm("scontrol", "show", "job", job)

        await wait_for("the job to run", running, timeout=20)
        return job

    async def slurm_nodes(self) -> dict[str, dict[str, str]]:
        """`scontrol show node` of this NodeSet's nodes: name → key=value fields."""
        out = await self.aslurm("scontrol", "-o", "show", "node", check=False)
        nodes = {}
        for line in out.splitlines():
            fields = _fields(line)
            if NAME in fields.get("AvailableFeatures", "").split(","):
                nodes[fields["NodeName"]] = fields
        return nodes

    async def pods(self, nodeset: str = NAME) -> list[Pod]:
        return [
            p
            async for p in self.kube.list(
                Pod, namespace=self.namespace, labels={LABEL_NODESET: nodeset}
            )
        ]

    async def status(self, nodeset: str = NAME) -> dict[str, Any]:
        obj = await self.kube.get(NodeSet, nodeset, namespace=self.namespace)
        return obj.get("status") or {}


def _fields(line: str) -> dict[str, str]:
    """key=value pairs of `scontrol -o`, where values (Reason) may contain spaces."""
    result: dict[str, str] = {}
    key = None
    for word in line.split(" "):
        if "=" in word and word.split("=", 1)[0].isalpha():
            key, value = word.split("=", 1)
            result[key] = value
        elif key is not None:
            result[key] += " " + word
    return {k: v.strip() for k, v in result.items()}


async def wait_for(
    what: str, check: Callable[[], Awaitable[Any]], timeout: float = 60, bed: Bed | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        last = f" (last: {bed.last_unsettled})" if bed is not None else ""
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}{last}"
        await asyncio.sleep(0.25)


def is_ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


async def settled(bed: Bed, count: int) -> bool:
    """`count` current pods, all Ready, all idle and undrained (by us) in Slurm, status says so."""
    why = await unsettled(bed, count)
    bed.last_unsettled = why
    return not why


async def unsettled(bed: Bed, count: int) -> str:
    pods = await bed.pods()
    if len(pods) != count or not all(map(is_ready, pods)):
        waiting = [
            (p.metadata.name, p.status.phase if p.status else None)  # type: ignore[union-attr]
            for p in pods
            if not is_ready(p)
        ]
        return f"{sum(map(is_ready, pods))}/{len(pods)} pods ready, want {count}: {waiting}"
    if len({p.metadata.labels[LABEL_TEMPLATE_HASH] for p in pods}) != 1:  # type: ignore[union-attr]
        return "pods of several revisions"
    nodes = await bed.slurm_nodes()
    names = {p.metadata.name for p in pods}  # type: ignore[union-attr]
    if set(nodes) != names:
        return f"Slurm nodes {sorted(nodes)} != pods {sorted(names)}"
    for name, node in nodes.items():
        state = node["State"]
        if not state.startswith("IDLE") or "NOT_RESPONDING" in state:
            return f"{name} is {state}"
        if "DRAIN" in state and node.get("Reason", "").startswith(REASON_PREFIX):
            return f"{name} is {state} ({node.get('Reason')})"
    status = await bed.status()
    if status.get("desired") != count or status.get("ready") != count:
        return f"status {status}"
    return ""


def _progress(nodeset: Any) -> str:
    """The NodeSet's Progressing condition: what its controller waits on."""
    conditions = (nodeset.get("status") or {}).get("conditions") or []
    waiting = [c.get("message", "") for c in conditions if c.get("type") == "Progressing"]
    deleting = " (deleting)" if nodeset["metadata"].get("deletionTimestamp") else ""
    return f"NodeSet{deleting}: {waiting[0] if waiting else 'no Progressing condition'}"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def bed(kubelet_nodes: RealNodes, kube: AsyncClient) -> AsyncIterator[Bed]:
    await install_crds(kube)
    extra_conf = [
        f"NodeSet={NAME} Feature={NAME}",
        f"PartitionName={NAME} Nodes={NAME} MaxTime=INFINITE State=UP",
    ]
    async with slurm_bed(kubelet_nodes, kube, prefix="t-nodeset-e2e", extra_conf=extra_conf) as sb:
        namespace, tag = sb.namespace, sb.namespace.rsplit("-", 1)[1]
        nodes = sb.node_names[:5]
        for node in nodes[:4]:  # the fifth joins the pool later; the bed unlabels them all
            await kube.patch(
                Node, node, {"metadata": {"labels": {POOL: tag}}}, patch_type=PatchType.MERGE
            )
        access = sb.cluster.access()
        operator = Operator(kube, access.restd_url, access.jwt_key, namespace)
        operator.start()
        try:
            yield Bed(sb.cluster, kube, namespace, nodes, operator, sb.ctld_port, tag, sb.image)
        finally:
            if not operator.crashed():
                # Deleting the NodeSet drains its nodes, deletes its pods and
                # removes its Slurm records: the controller must see it through.
                with contextlib.suppress(ApiError):
                    await kube.delete(NodeSet, NAME, namespace=namespace)

                async def gone() -> bool:
                    pods = [p async for p in kube.list(Pod, namespace=namespace)]
                    sets = [s async for s in kube.list(NodeSet, namespace=namespace)]
                    return not pods and not sets

                with contextlib.suppress(AssertionError):
                    await wait_for("the NodeSets to be gone", gone, timeout=40)
            await operator.stop()
            logging.getLogger("sunk").removeHandler(operator.errors)


class DrainWatch:
    """Polls Slurm while an update runs: the most nodes drained by sunk at once."""

    def __init__(self, bed: Bed) -> None:
        self.bed = bed
        self.most = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            nodes = await self.bed.slurm_nodes()
            ours = [
                n
                for n, f in nodes.items()
                if "DRAIN" in f["State"] and f.get("Reason", "").startswith(REASON_PREFIX)
            ]
            self.most = max(self.most, len(ours))
            await asyncio.sleep(0.2)

    async def __aenter__(self) -> DrainWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def set_template(
    bed: Bed,
    marker: str,
    max_unavailable: int | str = 1,
    maintenance_window: dict[str, str] | None = None,
) -> None:
    strategy: dict[str, Any] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": max_unavailable},
    }
    if maintenance_window is not None:
        strategy["maintenanceWindow"] = maintenance_window
    patch = {
        "spec": {
            "template": slurmpods.nodeset_template(bed.ctld_port, bed.image, marker),
            "updateStrategy": strategy,
        }
    }
    await bed.kube.patch(NodeSet, NAME, patch, namespace=bed.namespace, patch_type=PatchType.MERGE)


async def revision_of(bed: Bed) -> str:
    status = await bed.status()
    return str(status.get("templateHash", ""))


async def rolled(bed: Bed, old: set[str], count: int) -> bool:
    pods = await bed.pods()
    if any(p.metadata.labels[LABEL_TEMPLATE_HASH] in old for p in pods):  # type: ignore[union-attr]
        return False
    return await settled(bed, count)


# ----------------------------------------------------------------------------- tests


async def test_a_nodeset_over_four_nodes_gives_four_idle_slurm_nodes_and_grows(bed: Bed) -> None:
    started = time.monotonic()
    body = NodeSet(
        {
            "metadata": {"name": NAME},
            "spec": {
                "template": {
                    **slurmpods.nodeset_template(bed.ctld_port, bed.image),
                    "spec": {
                        **slurmpods.nodeset_template(bed.ctld_port, bed.image)["spec"],
                        "nodeSelector": {POOL: bed.tag},
                    },
                },
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            },
        }
    )
    await bed.kube.create(body, namespace=bed.namespace)
    await wait_for("4 idle Slurm nodes", lambda: settled(bed, 4), timeout=60, bed=bed)
    bed.timings["4 nodes idle"] = time.monotonic() - started
    nodes = await bed.slurm_nodes()
    assert set(nodes) == {f"{NAME}-{n}" for n in bed.nodes[:4]}
    for fields in nodes.values():
        assert fields["Partitions"] == NAME
    status = await bed.status()
    assert status["slurm"]["idle"] == 4

    started = time.monotonic()
    await bed.kube.patch(
        Node,
        bed.nodes[4],
        {"metadata": {"labels": {POOL: bed.tag}}},
        patch_type=PatchType.MERGE,
    )
    await wait_for("a 5th idle Slurm node", lambda: settled(bed, 5), timeout=60, bed=bed)
    assert f"{NAME}-{bed.nodes[4]}" in await bed.slurm_nodes()
    print(f"timings: {bed.timings}, 5th node {time.monotonic() - started:.1f}s")
    bed.operator.check()


async def test_a_rolling_update_waits_for_the_job_on_its_node(bed: Bed) -> None:
    await wait_for("the NodeSet settled", lambda: settled(bed, 5), bed=bed)
    pods = {p.metadata.name: p for p in await bed.pods()}  # type: ignore[union-attr]
    busy = f"{NAME}-{bed.nodes[2]}"
    busy_uid = pods[busy].metadata.uid  # type: ignore[union-attr]
    old = {await revision_of(bed)}
    job = await bed.run_job(busy, 20)
    job_started = time.monotonic()

    async with DrainWatch(bed) as watch:
        await set_template(bed, "v2", max_unavailable=2)
        replaced_at: float | None = None

        async def done() -> bool:
            nonlocal replaced_at
            pod = next((p for p in await bed.pods() if p.metadata.name == busy), None)  # type: ignore[union-attr]
            if replaced_at is None and (pod is None or pod.metadata.uid != busy_uid):  # type: ignore[union-attr]
                replaced_at = time.monotonic()
                shown = await bed.aslurm("scontrol", "show", "job", job)
                assert "JobState=RUNNING" not in shown, "the busy pod was replaced under its job"
            return await rolled(bed, old, 5)

        await wait_for("the update to roll through", done, timeout=120, bed=bed)
    shown = await bed.aslurm("scontrol", "show", "job", job)
    assert "JobState=COMPLETED" in shown, shown
    assert "ExitCode=0:0" in shown, shown
    assert replaced_at is not None
    assert replaced_at - job_started >= 19
    assert watch.most <= 2, f"{watch.most} nodes drained at once"
    bed.operator.check()


async def test_an_admin_drain_survives_an_update_and_a_controller_restart(bed: Bed) -> None:
    await wait_for("the NodeSet settled", lambda: settled(bed, 5), bed=bed)
    node = f"{NAME}-{bed.nodes[1]}"
    reason = "disk check by ops"
    await bed.aslurm("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
    old = {await revision_of(bed)}
    async with DrainWatch(bed) as watch:
        await set_template(bed, "v3")
        await wait_for(
            "the update to roll through",
            lambda old=old: rolled(bed, old, 5),  # type: ignore[misc]
            timeout=120,
            bed=bed,
        )
    assert watch.most <= 1
    fields = (await bed.slurm_nodes())[node]
    assert "DRAIN" in fields["State"], fields
    assert fields["Reason"].startswith(reason), fields

    await bed.operator.stop()
    bed.operator.start()
    await asyncio.sleep(3)  # a few reconciles of the restarted controller
    await wait_for("the NodeSet settled", lambda: settled(bed, 5), bed=bed)
    fields = (await bed.slurm_nodes())[node]
    assert "DRAIN" in fields["State"], fields
    assert fields["Reason"].startswith(reason), fields
    await bed.aslurm("scontrol", "update", f"nodename={node}", "state=resume")
    bed.operator.check()


async def test_two_nodesets_on_one_node_yield_one_pod_and_a_condition(bed: Bed) -> None:
    # `compute` owns all five nodes; `rival` wants the last one too.
    body = NodeSet(
        {
            "metadata": {"name": "rival"},
            "spec": {
                "template": {
                    **slurmpods.nodeset_template(bed.ctld_port, bed.image),
                    "spec": {
                        **slurmpods.nodeset_template(bed.ctld_port, bed.image)["spec"],
                        "nodeSelector": {"kubernetes.io/hostname": bed.nodes[4]},
                    },
                },
            },
        }
    )
    await bed.kube.create(body, namespace=bed.namespace)
    try:

        async def conflict() -> bool:
            conditions = {c["type"]: c for c in (await bed.status("rival")).get("conditions", [])}
            c = conditions.get("NodeConflict")
            return bool(c and c["status"] == "True" and bed.nodes[4] in c["message"])

        await wait_for("a NodeConflict condition", conflict, timeout=30)
        assert await bed.pods("rival") == []
        on_node = [
            p
            async for p in bed.kube.list(Pod, namespace=bed.namespace)
            if p.spec and p.spec.nodeName == bed.nodes[4]
        ]
        assert [p.metadata.name for p in on_node] == [f"{NAME}-{bed.nodes[4]}"]  # type: ignore[union-attr]
    finally:
        await bed.kube.delete(NodeSet, "rival", namespace=bed.namespace)
    bed.operator.check()


async def test_killing_the_controller_during_an_update_never_kills_a_job(bed: Bed) -> None:
    rng = random.Random(5)  # noqa: S311 - timings, not secrets
    for round_ in range(3):
        await wait_for("the NodeSet settled", lambda: settled(bed, 5), bed=bed)
        busy = f"{NAME}-{bed.nodes[round_]}"
        # Running before the update starts: a job still pending when its node is
        # drained never starts there, and "no job killed" would test nothing.
        job = await bed.run_job(busy, 6)
        old = {await revision_of(bed)}
        await set_template(bed, f"kill-{round_}", max_unavailable=2)
        for _ in range(2):
            await asyncio.sleep(rng.uniform(0.2, 3.0))
            await bed.operator.stop()
            await asyncio.sleep(rng.uniform(0.0, 1.0))
            bed.operator.start()
        await wait_for(
            "the update to roll through",
            lambda old=old: rolled(bed, old, 5),  # type: ignore[misc]
            timeout=120,
            bed=bed,
        )
        shown = await bed.aslurm("scontrol", "show", "job", job)
        assert "JobState=COMPLETED" in shown, shown
        assert "ExitCode=0:0" in shown, shown
    bed.operator.check()


async def test_an_update_in_a_maintenance_window_waits_for_it_and_keeps_long_jobs_off(
    bed: Bed,
) -> None:
    """Before the window the update's nodes are reserved in Slurm and nothing
    is drained, so a job that would run across the window's start waits; at
    the start the update rolls, each replaced node leaves the reservation
    (the job then runs there), and the reservation goes when all are done."""
    await wait_for("the NodeSet settled", lambda: settled(bed, 5), bed=bed)
    old = {await revision_of(bed)}
    opens = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(
        seconds=20
    )
    window = {"start": opens.strftime("%Y-%m-%dT%H:%M:%SZ"), "duration": "10m"}
    reservation = f"sunk-update-{bed.namespace}-{NAME}"
    await set_template(bed, "windowed", max_unavailable=5, maintenance_window=window)
    try:

        async def reserved() -> str:
            out = await bed.aslurm("scontrol", "show", "reservation", reservation, check=False)
            return out if "Flags=" in out else ""

        shown = await wait_for("the update's reservation", reserved, timeout=15, bed=bed)
        assert "MAINT" in shown, shown
        assert f"Nodes={NAME}-" in shown, shown
        # Partition MaxTime=INFINITE: a job without a time limit would run across the window.
        job = await bed.submit(f"{NAME}-{bed.nodes[0]}", 300)
        await asyncio.sleep(3)
        pending = await bed.aslurm("scontrol", "show", "job", job)
        assert "JobState=PENDING" in pending, pending
        assert all("DRAIN" not in f["State"] for f in (await bed.slurm_nodes()).values())
        assert not any(
            p.metadata.labels[LABEL_TEMPLATE_HASH] not in old  # type: ignore[union-attr]
            for p in await bed.pods()
        ), "a pod was replaced before the window"
        conditions = {c["type"]: c for c in (await bed.status()).get("conditions", [])}
        assert "maintenance window" in conditions["Progressing"]["message"]

        async def running() -> bool:
            return "JobState=RUNNING" in await bed.aslurm("scontrol", "show", "job", job)

        # Its node leaves the reservation once replaced, in the window.
        await wait_for("the held job running", running, timeout=90, bed=bed)
        assert datetime.datetime.now(datetime.UTC) >= opens
        await bed.aslurm("scancel", job)
        await wait_for(
            "the update to roll through",
            lambda: rolled(bed, old, 5),
            timeout=120,
            bed=bed,
        )

        async def unreserved() -> bool:
            out = await bed.aslurm("scontrol", "show", "reservation", reservation, check=False)
            return "Flags=" not in out

        await wait_for("the reservation gone", unreserved, timeout=15, bed=bed)
    finally:
        patch = {"spec": {"updateStrategy": {"maintenanceWindow": None}}}
        await bed.kube.patch(
            NodeSet, NAME, patch, namespace=bed.namespace, patch_type=PatchType.MERGE
        )
    bed.operator.check()


async def test_a_node_leaving_the_set_is_drained_then_emptied_then_forgotten(bed: Bed) -> None:
    await wait_for("the NodeSet settled", lambda: settled(bed, 5), bed=bed)
    leaving = bed.nodes[4]
    slurm_node = f"{NAME}-{leaving}"
    (pod,) = [p for p in await bed.pods() if p.metadata.name == slurm_node]  # type: ignore[union-attr]
    job = await bed.run_job(slurm_node, 10)
    await bed.kube.patch(
        Node, leaving, {"metadata": {"labels": {POOL: None}}}, patch_type=PatchType.MERGE
    )

    async def drained() -> bool:
        fields = (await bed.slurm_nodes()).get(slurm_node, {})
        return "DRAIN" in fields.get("State", "") and fields.get("Reason", "").startswith(
            REASON_SCALE_IN
        )

    await wait_for("the leaving node drained", drained, timeout=30)
    # Drained, but its job still runs: the pod stays (the same pod, not a new one).
    assert "JobState=RUNNING" in await bed.aslurm("scontrol", "show", "job", job)
    assert pod.metadata.uid in {p.metadata.uid for p in await bed.pods()}  # type: ignore[union-attr]

    async def pod_gone() -> bool:
        return slurm_node not in {p.metadata.name for p in await bed.pods()}  # type: ignore[union-attr]

    await wait_for("the pod to go once the job ended", pod_gone, timeout=60)
    shown = await bed.aslurm("scontrol", "show", "job", job)
    assert "JobState=COMPLETED" in shown, shown
    assert "ExitCode=0:0" in shown, shown

    async def forgotten() -> bool:
        return slurm_node not in await bed.slurm_nodes()

    await wait_for("the Slurm record removed", forgotten, timeout=30)
    await wait_for("four nodes settled", lambda: settled(bed, 4), bed=bed)
    bed.operator.check()


async def test_deleting_the_nodeset_removes_its_pods_and_slurm_nodes(bed: Bed) -> None:
    await wait_for("the NodeSet settled", lambda: settled(bed, 4), bed=bed)
    assert len(await bed.slurm_nodes()) == 4
    await bed.kube.delete(NodeSet, NAME, namespace=bed.namespace)

    started = time.monotonic()

    async def gone() -> bool:
        sets = [s async for s in bed.kube.list(NodeSet, namespace=bed.namespace)]
        pods = await bed.pods()
        nodes = await bed.slurm_nodes()
        bed.last_unsettled = "; ".join(
            [
                *(_progress(s) for s in sets),
                *(
                    f"pod {p.metadata.name}: {p.status.phase if p.status else '?'}"  # type: ignore[union-attr]
                    f"{' terminating' if p.metadata.deletionTimestamp else ''}"  # type: ignore[union-attr]
                    for p in pods
                ),
                *(f"Slurm {n}: {f.get('State')} {f.get('Reason', '')}" for n, f in nodes.items()),
                *(f"error: {line}" for line in bed.operator.errors.lines[-5:]),
            ]
        )
        return not sets and not pods and not nodes

    await wait_for("pods, Slurm nodes and the NodeSet gone", gone, timeout=60, bed=bed)
    bed.timings["deleted"] = time.monotonic() - started
    print(f"timings: {bed.timings}")
    bed.operator.check()
