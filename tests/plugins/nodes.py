"""Real Kubernetes nodes for the session: kubelet + containerd per node, in the
bed's network namespace, pulling sunk's images from the bed's registry.

`kubelet_nodes` starts them once per session on the session's control plane;
modules that need nodes take it and schedule onto its node names.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from lightkube import AsyncClient

from sunk_testbed import images
from sunk_testbed.control_plane import KubeAccess, KubeControlPlane
from sunk_testbed.nodes import (
    KubeletNodes,
    NodeBed,
    NodeSpec,
    ensure_node_binaries,
    node_binaries_dir,
)
from sunk_testbed.procs import Supervisor
from sunk_testbed.room import MachineRoom

NODE_COUNT = 5  # the NodeSet and chart e2e tests need five
NODE_PREFIX = "kn-"


def _log(message: str) -> None:
    print(f"[nodes] {message}", file=sys.stderr, flush=True)


def kubectl(
    access: KubeAccess, *args: str, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The bed's kubectl as the admin, `input` on its stdin."""
    return kubectl_at(access.admin_kubeconfig, *args, timeout=timeout, input=input)


def kubectl_at(
    kubeconfig: Path | str, *args: str, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The bed's kubectl with `kubeconfig`, `input` on its stdin."""
    return subprocess.run(
        [str(node_binaries_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class RealNodes:
    bed: NodeBed
    specs: list[NodeSpec]
    images: images.ImageSet
    bin_dir: Path

    @property
    def group(self) -> KubeletNodes:
        return self.bed.group

    @property
    def room(self) -> MachineRoom:
        return self.bed.room

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def kubelet_nodes(
    testbed_state_dir: Path,
    supervisor: Supervisor,
    kube_control_plane: KubeControlPlane | None,
    kube_access: KubeAccess,
    kube: AsyncClient,
) -> AsyncIterator[RealNodes]:
    if kube_control_plane is None:
        pytest.skip("real nodes join the bed's own control plane")
    bin_dir = await asyncio.to_thread(ensure_node_binaries, _log)
    built = await asyncio.to_thread(images.ensure_images, _log, coredns=bin_dir / "coredns")
    assert built.coredns is not None
    bed = NodeBed(testbed_state_dir, supervisor, kube_control_plane)
    specs = [
        NodeSpec(f"{NODE_PREFIX}{i}", labels={"sunk.test/node": "real"})
        for i in range(1, NODE_COUNT + 1)
    ]
    pull = [built.coredns.ref, built.slurm.ref, built.login.ref, built.sunk.ref]
    await asyncio.to_thread(bed.start, specs, bin_dir, built.pause.ref, pull)
    await bed.ready(kube, kube_access, [s.name for s in specs], built.coredns.ref, 120)
    await asyncio.to_thread(bed.reap_pulls, 120)
    yield RealNodes(bed, specs, built, bin_dir)
    await asyncio.to_thread(bed.stop, bin_dir)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def shared_storage(kube: AsyncClient, kubelet_nodes: RealNodes) -> str:
    """The bed's ReadWriteMany class on the session's nodes (SeaweedFS through
    the S3 CSI driver, `sunk_testbed.storage`), installed once; its name,
    what the slurm chart's `homes.storageClassName` takes."""
    from sunk_testbed.storage import STORAGE_CLASS, ensure_storage_images, install_shared_storage

    # A cold cache builds SeaweedFS, the driver and the sidecars first (minutes).
    built = await asyncio.to_thread(ensure_storage_images, _log)
    # On kn-2: the tests power off kn-1 (test_real_nodes) and a controller
    # node (the chart e2e's failover), and homes must outlive both.
    storage_node = kubelet_nodes.names[1]
    await install_shared_storage(
        kube, kubelet_nodes.group, built, _log, within=300, node=storage_node
    )
    return STORAGE_CLASS
