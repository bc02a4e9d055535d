"""One `sunk local up` cluster shared by the modules that use it as a user would.

`sunk local up` costs a minute or more, so the modules that need the README's
cluster (`tests/charts/test_local_up*.py`, which sort next to each other) share
one. It starts at the first test that asks for `local_cluster` and is taken
down (`sunk local down`, nothing left behind) after the last test of a run of
consecutive tests that ask for it, so it does not idle beside the beds of the
modules that follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from plugins.nodes import kubectl_at
from sunk_testbed.bed import NAMESPACE, RELEASE, Bed
from sunk_testbed.helm import Helm, ensure_helm

FIXTURE = "local_cluster"


def sunk(state: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunk", "local", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ssh(state: Path, command: str, timeout: float = 120) -> str:
    proc = sunk(state, "ssh", command, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def poll_ssh(
    state: Path, command: str, done: Callable[[str], bool], within: float, every: float = 1
) -> str:
    """Run `command` on the login pod until `done(output)`; that output."""
    deadline = time.monotonic() + within
    while not done(out := ssh(state, command)):
        assert time.monotonic() < deadline, f"{command!r} after {within:.0f} s: {out}"
        time.sleep(every)
    return out


def summary(state: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((state / "bed.json").read_text())
    return loaded


def kubectl(
    state: Path, *args: str, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    config = summary(state)["kubernetes"]["kubeconfig"]
    return kubectl_at(config, *args, timeout=timeout, input=input)


def cluster_helm(state: Path) -> Helm:
    """helm as `sunk local up` ran it: the cluster's admin kubeconfig, its helm home."""
    kubeconfig = Path(summary(state)["kubernetes"]["kubeconfig"])
    return Helm(ensure_helm(print), kubeconfig, state / "cluster" / "helm")


def upgrade_slurm(state: Path, values: dict[str, Any], values_file: str) -> None:
    """`helm upgrade` of the cluster's slurm release with `values`, written to
    `values_file` beside the bed's own values."""
    cluster_helm(state).upgrade_install(
        RELEASE, "slurm", NAMESPACE, values, values_file=state / "cluster" / values_file
    )


def tenant_pod(info: dict[str, Any], name: str, annotations: dict[str, str] | None = None) -> Pod:
    """A one-CPU pod in `default` (the namespace `sunk local up` grants) for
    sunk-scheduler, from the slurm image the nodes already hold."""
    return Pod(
        metadata=ObjectMeta(name=name, namespace="default", annotations=annotations),
        spec=PodSpec(
            schedulerName="sunk-scheduler",
            terminationGracePeriodSeconds=5,
            containers=[
                Container(
                    name="main",
                    image=info["images"]["sunk/slurm"],
                    command=["sleep", "3600"],
                    resources=ResourceRequirements(requests={"cpu": "1"}),
                )
            ],
        ),
    )


def scheduler_pods(cluster: Path) -> dict[str, int]:
    """The scheduler's running pods: name → restarts."""
    out = kubectl(cluster, "get", "pods", "-n", "slurm", "-o", "json")
    assert out.returncode == 0, out.stderr
    pods = {}
    for pod in json.loads(out.stdout)["items"]:
        name = pod["metadata"]["name"]
        if name.startswith("sunk-scheduler-") and pod["status"].get("phase") == "Running":
            statuses = pod["status"].get("containerStatuses", [])
            pods[name] = sum(s["restartCount"] for s in statuses)
    return pods


def job_state(cluster: Path, job: str) -> str:
    return str(ssh(cluster, f"squeue -h -j {job} -o %T 2>/dev/null || true")).strip()


def running_slurm_pods(state: Path) -> dict[str, tuple[str, int]]:
    """Every running pod of the Slurm namespace: its uid and the restarts of its
    containers (init ones too), to show that nothing was restarted or replaced."""
    proc = kubectl(state, "get", "pods", "-n", "slurm", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return {
        pod["metadata"]["name"]: (
            pod["metadata"]["uid"],
            sum(
                c.get("restartCount", 0)
                for c in pod["status"].get("containerStatuses", [])
                + pod["status"].get("initContainerStatuses", [])
            ),
        )
        for pod in json.loads(proc.stdout)["items"]
        if pod["status"].get("phase") == "Running"
    }


class LocalCluster:
    """The shared cluster's state directory, started on first use."""

    def __init__(self) -> None:
        self.state: Path | None = None

    def up(self) -> Path:
        if self.state is not None:
            return self.state
        state = Path(tempfile.mkdtemp(prefix="sunk-local-up-", dir="/tmp"))
        self.state = state
        started = time.monotonic()
        proc = sunk(state, "up", timeout=900)
        print(f"sunk local up: {time.monotonic() - started:.1f}s\n{proc.stdout}")
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        return state

    def down(self) -> None:
        state, self.state = self.state, None
        if state is None:
            return
        try:
            proc = sunk(state, "down", timeout=300)
            assert proc.returncode == 0, proc.stderr
            assert Bed(state).leftovers() == []
        finally:
            subprocess.run(["rm", "-rf", str(state)], check=False)


_shared = LocalCluster()


@pytest.fixture
def local_cluster() -> Path:
    """Function-scoped on purpose: the cluster may have been taken down and
    started again since the last test that asked."""
    if os.environ.get("SUNK_KUBECONFIG") or os.environ.get("SUNK_TESTBED_STATE"):
        pytest.skip("`sunk local up` starts its own control plane")
    return _shared.up()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if FIXTURE not in getattr(item, "fixturenames", ()):
        return
    if nextitem is None or FIXTURE not in getattr(nextitem, "fixturenames", ()):
        _shared.down()


def pytest_sessionfinish() -> None:
    _shared.down()
