"""One test bed: the Kubernetes control plane and the Slurm cluster, together.

`sunk local up` and the test fixtures both go through `Bed`, so a developer's
cluster and the one the tests use are built and started the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sunk.testbed.helm import ensure_helm
from sunk.testbed.kube import KubeAccess, KubeControlPlane, ensure_binaries
from sunk.testbed.procs import Supervisor
from sunk.testbed.slurm import SlurmAccess, SlurmCluster, ensure_rootfs

Log = Callable[[str], None]


@dataclass(frozen=True)
class Prepared:
    """Where the cached parts are, and what it took to get them."""

    kube_bin: Path
    rootfs: Path
    helm: Path
    seconds: float
    cold: bool  # True when anything had to be built or downloaded


@dataclass(frozen=True)
class BedAccess:
    kube: KubeAccess
    slurm: SlurmAccess


class Bed:
    def __init__(self, state_dir: Path, *, slurm_nodes: int = 3) -> None:
        self.state_dir = state_dir
        self.supervisor = Supervisor(state_dir)
        self.slurm_nodes = slurm_nodes

    def prepare(self, log: Log = print) -> Prepared:
        """Build or reuse the cached binaries and root filesystem."""
        started = time.monotonic()
        cold = False

        def note(message: str) -> None:
            nonlocal cold
            cold = True
            log(message)

        kube_bin = ensure_binaries(note)
        rootfs = ensure_rootfs("trixie", note)
        helm = ensure_helm(note)
        return Prepared(kube_bin, rootfs, helm, time.monotonic() - started, cold)

    def kube(self, log: Log = print) -> KubeControlPlane:
        return KubeControlPlane(self.state_dir, self.supervisor, log=log)

    def slurm(self) -> SlurmCluster:
        """The running bed's Slurm, for CLI calls; never builds anything."""
        return SlurmCluster.attach(self.state_dir, self.supervisor)

    def up(self, log: Log = print) -> BedAccess:
        """Start everything that is not running yet; idempotent."""
        prepared = self.prepare(log)
        t0 = time.monotonic()
        kube = self.kube(log).start()
        log(f"kubernetes control plane ready in {time.monotonic() - t0:.1f}s: {kube.server}")
        t1 = time.monotonic()
        cluster = SlurmCluster(
            self.state_dir, self.supervisor, prepared.rootfs, nodes=self.slurm_nodes
        )
        slurm = cluster.start()
        log(f"slurm ready in {time.monotonic() - t1:.1f}s: {slurm.restd_url}")
        self._write_summary(kube, slurm)
        return BedAccess(kube, slurm)

    def down(self) -> None:
        """Stop what this bed started, and nothing else; idempotent.

        Every daemon is recorded by the supervisor, newest first, so Slurm
        stops before the control plane; no build is ever triggered here.
        """
        self.supervisor.stop_all()

    def status(self) -> dict[str, bool]:
        """Each recorded daemon and whether it still runs."""
        return {n: self.supervisor.running(n) is not None for n in self.supervisor.names()}

    def _write_summary(self, kube: KubeAccess, slurm: SlurmAccess) -> None:
        summary = {
            "kubernetes": {"server": kube.server, "kubeconfig": str(kube.admin_kubeconfig)},
            "slurm": {
                "restd_url": slurm.restd_url,
                "cluster": slurm.cluster_name,
                "version": slurm.slurm_version,
                "nodes": slurm.nodes,
            },
        }
        (self.state_dir / "bed.json").write_text(json.dumps(summary, indent=2))
