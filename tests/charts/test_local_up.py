"""The README's first command, end to end: `sunk local up`, use the cluster from
both front doors, `sunk local down`.

Runs the real CLI as a subprocess on a private state directory (so a cluster
the developer has up is not touched): the control plane, three local nodes,
both charts through the real helm, sunk's operator, syncer and scheduler on
the host. Then a researcher's `sbatch` over ssh, and a Kubernetes pod placed
by `sunk scheduler` through a Slurm job; `down` must leave no process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from plugins.local import wait_for
from sunk.local.system import pids_rooted_at
from sunk.syncer.decide import LABEL_SLURM_BUSY
from sunk.testbed.kube import async_client

pytestmark = pytest.mark.testbed

JOB_ID_ANNOTATION = "sunk.dev/slurm-job-id"


def sunk(state: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunk", "local", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ssh(state: Path, command: str) -> str:
    proc = sunk(state, "ssh", command, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def cluster() -> Iterator[Path]:
    if os.environ.get("SUNK_KUBECONFIG") or os.environ.get("SUNK_TESTBED_STATE"):
        pytest.skip("`sunk local up` starts its own control plane")
    state = Path(tempfile.mkdtemp(prefix="sunk-local-up-", dir="/tmp"))
    started = time.monotonic()
    up = sunk(state, "up", timeout=900)
    print(f"sunk local up: {time.monotonic() - started:.1f}s\n{up.stdout}")
    try:
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        yield state
    finally:
        down = sunk(state, "down", timeout=300)
        assert down.returncode == 0, down.stderr
        assert not pids_rooted_at(state / "root"), "processes left after down"
        subprocess.run(["rm", "-rf", str(state)], check=False)


def test_a_researcher_sees_idle_nodes_and_runs_a_batch_job(cluster: Path) -> None:
    nodes = ssh(cluster, "sinfo -h -N -o '%N %t'").split("\n")
    assert len([line for line in nodes if line.endswith(" idle")]) == 3, nodes
    job = ssh(cluster, "sbatch --parsable --wrap 'hostname'").strip()
    deadline = time.monotonic() + 60
    while "COMPLETED" not in (out := ssh(cluster, f"sacct -n -X -j {job} -o State")):
        assert time.monotonic() < deadline, out
        time.sleep(1)


async def test_a_pod_is_placed_by_slurm_and_its_deletion_ends_the_job(cluster: Path) -> None:
    summary = json.loads((cluster / "bed.json").read_text())
    kube = async_client(Path(summary["kubernetes"]["kubeconfig"]), field_manager="test")
    try:
        pod = Pod(
            metadata=ObjectMeta(name="inference", namespace="default"),
            spec=PodSpec(
                schedulerName="sunk-scheduler",
                terminationGracePeriodSeconds=5,
                containers=[
                    Container(
                        name="main",
                        image="debian:trixie",
                        command=["sleep", "3600"],
                        resources=ResourceRequirements(requests={"cpu": "1"}),
                    )
                ],
            ),
        )
        await kube.create(pod)

        async def bound() -> bool:
            current = await kube.get(Pod, "inference", namespace="default")
            return bool(current.spec and current.spec.nodeName)

        await wait_for("the pod to be bound through Slurm", bound, timeout=60)
        current = await kube.get(Pod, "inference", namespace="default")
        assert current.metadata is not None
        assert current.metadata.annotations
        job = current.metadata.annotations[JOB_ID_ANNOTATION]
        assert current.spec is not None
        assert (current.spec.nodeName or "").startswith("local-")
        state = await asyncio.to_thread(ssh, cluster, f"squeue -h -j {job} -o %T")
        assert state.strip() == "RUNNING", state

        await kube.delete(Pod, "inference", namespace="default")

        async def job_ended() -> bool:
            # squeue fails for a job Slurm has already forgotten: that is ended too.
            out = await asyncio.to_thread(ssh, cluster, f"squeue -h -j {job} -o %T || true")
            return out.strip() not in ("RUNNING", "PENDING")

        await wait_for("the pod's Slurm job to end", job_ended, timeout=60)
    finally:
        await kube.close()


async def test_an_eviction_waits_for_the_nodes_slurm_job(cluster: Path) -> None:
    """What `kubectl drain` does after its cordon: evict the node's pods. The chart's
    PodDisruptionBudget refuses it for a slurmd whose node runs a job (the syncer's
    busy label), and lets it through once the job is done."""
    summary = json.loads((cluster / "bed.json").read_text())
    kube = async_client(Path(summary["kubernetes"]["kubeconfig"]), field_manager="test")
    namespace = "slurm"
    try:
        pods = [
            p
            async for p in kube.list(
                Pod, namespace=namespace, labels={"app.kubernetes.io/component": "slurmd"}
            )
        ]
        slurmd = pods[0]
        assert slurmd.metadata is not None
        assert slurmd.spec is not None
        name = slurmd.metadata.name or ""
        slurm_node = f"compute-{slurmd.spec.nodeName}"
        job = (
            await asyncio.to_thread(
                ssh, cluster, f"sbatch --parsable -w {slurm_node} --wrap 'sleep 20'"
            )
        ).strip()

        async def labelled(value: str) -> bool:
            pod = await kube.get(Pod, name, namespace=namespace)
            return bool(pod.metadata and (pod.metadata.labels or {}).get(LABEL_SLURM_BUSY) == value)

        await wait_for("the slurmd pod labelled busy", lambda: labelled("true"), timeout=60)
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        with pytest.raises(ApiError) as refused:
            await kube.create(eviction, name=name, namespace=namespace)
        assert refused.value.status.code == 429, refused.value.status
        state = await asyncio.to_thread(ssh, cluster, f"squeue -h -j {job} -o %T")
        assert state.strip() == "RUNNING", state

        await wait_for("the job to end and the label to follow", lambda: labelled("false"), 90)
        await kube.create(eviction, name=name, namespace=namespace)
        out = await asyncio.to_thread(ssh, cluster, f"sacct -n -X -j {job} -o State")
        assert "COMPLETED" in out, out
    finally:
        await kube.close()
