"""Two `sunk operator` processes on one real apiserver Lease and one real Slurm: one acts.

Each replica is the real CLI in its own process (so "killed" means SIGKILL:
no Lease release, no clean-up), watching one test namespace, with its Lease
there too. The NodeSet selects kubelet-less Node objects: what is checked
is who writes, not what slurmd does. Events name the replica that wrote
them (reportingInstance = the operator's identity, `<host>-<pid>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import httpx2
import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.events_v1 import Event

from sunk.api import LABEL_NODESET
from sunk.api import nodeset as api
from sunk_testbed.procs import free_port
from sunk_testbed.slurm_cluster import SlurmAccess

pytestmark = pytest.mark.e2e
NodeSet = api.resource()
LEASE = "sunk-operator"
LEASE_DURATION = 15.0  # LeaderElector's default, which `sunk operator` uses


def identity(proc: subprocess.Popen[bytes]) -> str:
    return f"{socket.gethostname()}-{proc.pid}"


@contextlib.asynccontextmanager
async def operators(
    kubeconfig: Path, slurm: SlurmAccess, namespace: str, log_dir: Path
) -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    argv = [
        str(Path(sys.executable).parent / "sunk"),
        "operator",
        "--slurmrestd", slurm.restd_url,
        "--jwt-key", str(slurm.jwt_key),
        "--kubeconfig", str(kubeconfig),
        "--namespace", namespace,
        "--lease-namespace", namespace,
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(2):
            # Each its own /metrics port (two processes share one host here).
            command = [*argv, f"--metrics-port={free_port()}"]
            procs.append(start(command, log_dir / f"operator-{i}.log"))
        yield procs
    finally:
        await asyncio.to_thread(stop, procs)


def metrics(proc: subprocess.Popen[bytes]) -> dict[str, float]:
    """The operator's Prometheus samples, by name with labels as printed."""
    args = cast(list[str], proc.args)
    (port,) = (a.removeprefix("--metrics-port=") for a in args if "--metrics-port=" in a)
    text = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in samples}


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := await check()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.2)
    return result


async def holder(kube: AsyncClient, namespace: str) -> str:
    with contextlib.suppress(Exception):
        lease = await kube.get(Lease, LEASE, namespace=namespace)
        return (lease.spec.holderIdentity if lease.spec else None) or ""
    return ""


async def writers(kube: AsyncClient, namespace: str) -> dict[str, int]:
    """reportingInstance → how many Events it wrote in the namespace."""
    counts: dict[str, int] = {}
    async for event in kube.list(Event, namespace=namespace):
        instance = event.reportingInstance or ""
        counts[instance] = counts.get(instance, 0) + 1
    return counts


async def pods(kube: AsyncClient, namespace: str) -> list[Pod]:
    return [p async for p in kube.list(Pod, namespace=namespace, labels={LABEL_NODESET: "ha"})]


async def test_two_operators_one_leader_and_the_other_takes_over(
    kube: AsyncClient,
    namespace: str,
    kubeconfig: Path,
    slurm_access: SlurmAccess,
    tmp_path: Path,
) -> None:
    tag = secrets.token_hex(3)
    names = [f"ha-{tag}-{i}" for i in range(3)]

    async def add_node(name: str) -> None:
        await kube.create(Node(metadata=ObjectMeta(name=name, labels={"ha-pool": tag})))

    try:
        for name in names[:2]:
            await add_node(name)
        async with operators(kubeconfig, slurm_access, namespace, tmp_path) as procs:
            leader, leader_id, follower_id = await leader_and_follower(kube, namespace, procs)

            body = NodeSet(
                {
                    "metadata": {"name": "ha"},
                    "spec": {
                        "template": {
                            "spec": {
                                "nodeSelector": {"ha-pool": tag},
                                "containers": [{"name": "slurmd", "image": "slurmd:1"}],
                            }
                        }
                    },
                }
            )
            await kube.create(body, namespace=namespace)
            await wait_for("2 pods", lambda: _count(pods(kube, namespace), 2))
            await asyncio.sleep(3)  # the follower, were it acting, would have written by now
            seen = await writers(kube, namespace)
            assert seen.get(leader_id, 0) >= 2, seen  # CreatedPod, one per node
            assert follower_id not in seen, seen
            assert await holder(kube, namespace) == leader_id
            # Both serve /metrics; only the leader reconciles (a standby polls nothing).
            (follower,) = (p for p in procs if p is not leader)
            led = await asyncio.to_thread(metrics, leader)
            assert led['sunk_operator_actions_total{kind="pod_create"}'] == 2
            assert led["sunk_operator_slurm_view_fresh"] == 1
            waited = await asyncio.to_thread(metrics, follower)
            assert waited["sunk_operator_reconcile_seconds_count"] == 0
            assert waited["sunk_operator_slurm_requests"] == 0

            leader.send_signal(signal.SIGKILL)
            await asyncio.to_thread(leader.wait, 10)
            killed = time.monotonic()
            await taken_by(kube, namespace, follower_id)
            takeover = time.monotonic() - killed
            print(f"takeover {takeover:.1f}s after SIGKILL (lease {LEASE_DURATION:.0f}s)")
            # It waits out the lease the dead leader last renewed (up to one
            # retry period, 2 s, before the kill), plus its own next poll;
            # the rest is a margin for a loaded machine.
            assert takeover <= LEASE_DURATION + 10

            await add_node(names[2])
            await wait_for(
                "a 3rd pod from the new leader", lambda: _count(pods(kube, namespace), 3)
            )

            async def new_leader_wrote() -> bool:
                return (await writers(kube, namespace)).get(follower_id, 0) >= 1

            await wait_for("the new leader's Event", new_leader_wrote, timeout=20)
            # Deleting the NodeSet is the new leader's work too (finalizer).
            await kube.delete(NodeSet, "ha", namespace=namespace)

            async def gone() -> bool:
                left = [s async for s in kube.list(NodeSet, namespace=namespace)]
                return not left

            await wait_for("the NodeSet deleted through its finalizer", gone, timeout=60)
            assert follower_id in await writers(kube, namespace)
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                await kube.delete(Node, name)


async def test_sigterm_hands_the_lease_over_at_once(
    kube: AsyncClient,
    namespace: str,
    kubeconfig: Path,
    slurm_access: SlurmAccess,
    tmp_path: Path,
) -> None:
    """What a rollout or `kubectl delete pod` does: SIGTERM to the leader. It hands
    its Lease back on the way out and exits 0, so the other replica leads within
    half a retry period (1 s, jittered to 1.2 s) instead of waiting out the lease
    (15 s)."""
    async with operators(kubeconfig, slurm_access, namespace, tmp_path) as procs:
        leader, _, follower_id = await leader_and_follower(kube, namespace, procs)
        signalled = time.monotonic()
        leader.send_signal(signal.SIGTERM)
        await taken_by(kube, namespace, follower_id)
        handover = time.monotonic() - signalled
        print(f"hand-over {handover:.2f}s after SIGTERM")
        assert await asyncio.to_thread(leader.wait, 10) == 0
        # The candidate's poll (≤ 1.2 s) and two requests; the rest is a margin
        # for a loaded machine (figures in docs/benchmarks.md).
        assert handover <= 3.0, handover
        log = (tmp_path / f"operator-{procs.index(leader)}.log").read_text()
        assert "Traceback" not in log, log[-2000:]


async def leader_and_follower(
    kube: AsyncClient, namespace: str, procs: list[subprocess.Popen[bytes]]
) -> tuple[subprocess.Popen[bytes], str, str]:
    """Once one holds the Lease: the leader's process, its identity, the other's."""
    by_identity = {identity(p): p for p in procs}
    leader_id = await wait_for(
        "a leader", lambda: _held_by(kube, namespace, by_identity), timeout=60
    )
    (follower_id,) = set(by_identity) - {leader_id}
    return by_identity[leader_id], leader_id, follower_id


async def taken_by(kube: AsyncClient, namespace: str, follower_id: str) -> None:
    await wait_for(
        "the follower to take the Lease",
        lambda: _is(holder(kube, namespace), follower_id),
        timeout=LEASE_DURATION + 30,
    )


async def _held_by(kube: AsyncClient, namespace: str, candidates: dict[str, Any]) -> str | None:
    held = await holder(kube, namespace)
    return held if held in candidates else None


async def _is(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


async def _count(found: Awaitable[list[Pod]], n: int) -> list[Pod] | None:
    result = await found
    return result if len(result) == n else None
