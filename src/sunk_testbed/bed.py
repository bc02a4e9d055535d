"""One local cluster: the Kubernetes control plane, real nodes and both charts.

`sunk local up` goes through `Bed`: it builds or reuses the caches (Kubernetes,
the node binaries, helm, the images), starts the control plane, then real
nodes (a kubelet and a containerd each, `sunk_testbed.nodes`) that pull the
images from the bed's registry, serves ReadWriteMany claims (SeaweedFS through
an S3 CSI driver, `sunk_testbed.storage`) for the users' homes, installs the
sunk-cluster and slurm charts with the real helm, and waits until a user on the login pod sees every
compute node idle in `sinfo`. Every pod of both charts, sunk's own
components included, runs from its image on a real kubelet: `up` starts no
product process on the host. Every daemon is recorded by the Supervisor, so
`down` stops exactly what `up` started; the Slurm state lives on volumes in
the state directory, so a later `up` brings the same cluster back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, codecs

from sunk.api import RESOURCE_NODE_GPUS
from sunk.kube.client import kube_client
from sunk.slurm.hostlist import expand
from sunk_testbed import charts, gpus
from sunk_testbed.control_plane import KubeAccess, KubeControlPlane, ensure_binaries
from sunk_testbed.helm import Helm, ensure_helm
from sunk_testbed.images import ImageSet, Registry, ensure_images
from sunk_testbed.nodes import NodeBed, NodeSpec, ensure_node_binaries
from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import ensure_rootfs
from sunk_testbed.storage import (
    STORAGE_CLASS,
    StorageImages,
    ensure_storage_images,
    install_shared_storage,
)
from sunk_testbed.workloads import ensure_workload_binaries

Log = Callable[[str], None]

NAMESPACE = "slurm"
RELEASE = "slurm"
CLUSTER_RELEASE = "sunk"
# The one login user of the local cluster; `sunk local ssh` logs in as it.
USER_NAME = "researcher"
USER_UID = 2000
# Where the local cluster's users come from: the slurm chart's in-chart LDAP
# directory (seeded with the researcher), so users can be added and removed
# while it runs (docs/identity.md); SUNK_LOCAL_IDENTITY=static writes them
# into /etc/passwd instead.
IDENTITY = os.environ.get("SUNK_LOCAL_IDENTITY", "ldap")
NODE_PREFIX = "local-"
# GPUs of every node: stand-in device files (no GPU here) that sunk's GPU
# plugin serves to the slurmd pods and to the pods the scheduler places.
GPUS = 4


@dataclass(frozen=True)
class Prepared:
    """Where the cached parts are, and what it took to get them."""

    kube_bin: Path
    node_bin: Path
    rootfs: Path
    helm: Path
    images: ImageSet
    storage: StorageImages  # the homes' shared filesystem and its CSI driver
    seconds: float
    cold: bool  # True when anything had to be built or downloaded


@dataclass(frozen=True)
class BedAccess:
    kube: KubeAccess
    login_address: str
    ssh_key: Path
    user: str
    nodes: list[str]


class Bed:
    def __init__(self, state_dir: Path, *, nodes: int = 3) -> None:
        self.state_dir = state_dir
        self.supervisor = Supervisor(state_dir)
        self.node_count = nodes
        self.files = state_dir / "cluster"

    def prepare(self, log: Log = print, *, workloads: bool = False) -> Prepared:
        """Build or reuse the cached binaries, root filesystem and helm; with
        `workloads`, the JobSet and LWS controllers' too (their images in
        `Prepared.images`), which nothing else builds."""
        started = time.monotonic()
        cold = False

        def note(message: str) -> None:
            nonlocal cold
            cold = True
            log(message)

        kube_bin = ensure_binaries(note)
        node_bin = ensure_node_binaries(note)
        rootfs = ensure_rootfs("trixie", note)
        helm = ensure_helm(note)
        managers = ensure_workload_binaries(note) if workloads else None
        built = ensure_images(note, coredns=node_bin / "coredns", workloads=managers)
        storage = ensure_storage_images(note)
        return Prepared(
            kube_bin, node_bin, rootfs, helm, built, storage, time.monotonic() - started, cold
        )

    def kube(self, log: Log = print) -> KubeControlPlane:
        return KubeControlPlane(self.state_dir, self.supervisor, log=log)

    def node_names(self) -> list[str]:
        return [f"{NODE_PREFIX}{i}" for i in range(1, self.node_count + 1)]

    def up(self, log: Log = print) -> BedAccess:
        """Start everything that is not running yet and wait until Slurm is usable; idempotent."""
        t0 = time.monotonic()
        prepared = self.prepare(log)
        log(f"caches ready in {time.monotonic() - t0:.1f}s")
        t1 = time.monotonic()
        kube = self.kube(log).start()
        log(f"kubernetes control plane ready in {time.monotonic() - t1:.1f}s: {kube.server}")
        self.files.mkdir(parents=True, exist_ok=True)
        t2 = time.monotonic()
        # Zones for the topology: the first two nodes in zone-a, the rest in zone-b.
        specs = [
            NodeSpec(
                name,
                labels={
                    charts.NODE_POOL_LABEL: charts.COMPUTE_POOL,
                    charts.ZONE_LABEL: "zone-a" if i < 2 else "zone-b",
                },
            )
            for i, name in enumerate(self.node_names())
        ]
        node_bed = self.node_bed(log)
        images = prepared.images
        assert images.coredns is not None
        # Every node pulls what the charts run while the cluster comes up: the
        # slurm image first (the config check and most pods run it).
        pull = [images.coredns.ref, images.slurm.ref, images.sunk.ref, images.login.ref]
        if IDENTITY == "ldap":
            pull.append(images.ldap.ref)
        pull += [prepared.storage.csi_s3.ref, prepared.storage.registrar.ref]
        node_bed.start(specs, prepared.node_bin, images.pause.ref, pull)
        # Where pods reach the host, as for the bed's own registry.
        host = node_bed.registry.address.rsplit(":", 1)[0]
        private = self.private_registry().start(host=host)
        log(f"{len(specs)} kubelets and containerds started in {time.monotonic() - t2:.1f}s")
        try:
            access = asyncio.run(self._install(kube, node_bed, prepared, private, log))
        finally:
            node_bed.reap_pulls(within=30)
        self._write_summary(access, prepared.images)
        return access

    def node_bed(self, log: Log = print) -> NodeBed:
        return NodeBed(self.state_dir, self.supervisor, self.kube(log))

    def private_registry(self) -> Registry:
        """The same images as the nodes' registry, behind a login: container
        jobs pull `private.sunk.test/...` from it with the chart's
        `containers.registryAuthSecret` (docs/containers.md)."""
        return Registry(self.state_dir, self.supervisor, name="private-registry", login=True)

    async def _install(
        self, kube: KubeAccess, node_bed: NodeBed, prepared: Prepared, private: str, log: Log
    ) -> BedAccess:
        client = kube_client(kube.admin_kubeconfig, "sunk-local")
        try:
            return await self._install_with(client, kube, node_bed, prepared, private, log)
        finally:
            await client.close()

    async def _install_with(
        self,
        client: AsyncClient,
        kube: KubeAccess,
        node_bed: NodeBed,
        prepared: Prepared,
        private: str,
        log: Log,
    ) -> BedAccess:
        t0 = time.monotonic()
        names = self.node_names()
        assert prepared.images.coredns is not None
        await node_bed.ready(client, kube, names, prepared.images.coredns.ref, 120)
        log(f"{len(names)} nodes and cluster DNS ready in {time.monotonic() - t0:.1f}s")
        await charts.apply_volumes(client, self.state_dir / "volumes")
        # The homes' class, served while sunk-cluster installs; the slurm
        # chart's claim needs it.
        storage = asyncio.create_task(
            install_shared_storage(client, node_bed.group, prepared.storage, log)
        )

        t1 = time.monotonic()
        key = self.files / "id_ed25519"
        user = charts.User(USER_NAME, USER_UID, charts.new_ssh_key(key))
        helm = Helm(prepared.helm, kube.admin_kubeconfig, self.files / "helm")
        values = charts.slurm_values(
            users=[user],
            homes_class=STORAGE_CLASS,
            images=prepared.images,
            registry=node_bed.registry.address,
            private_registry=private,
            # A topology/tree on the zones, as a site describes its network, so
            # --switches and a Topology=block partition keep a job in a zone.
            topology_levels=[charts.ZONE_LABEL],
            identity=IDENTITY,
            gpus=GPUS,
        )
        # Stand-in GPUs (no GPU here), handed out by each node's containerd
        # from the CDI spec NVIDIA's toolkit would write for them.
        devices = gpus.stand_in_gpus(self.state_dir / "gpus", GPUS)
        gpus.write_cdi_spec(
            [node_bed.group.paths(name).cdi_dir for name in names],
            devices,
            gpus.stand_in_driver(self.state_dir / "gpu-driver"),
        )
        # The operator may make exactly these NodeSets' pods (componentPolicies):
        # the chart's default list lacks what the bed's values add (its image
        # repositories, the private registry's Secret), as a site lists its own.
        slurmd_pods = await asyncio.to_thread(
            charts.render_slurmd_pod_allowance,
            helm,
            RELEASE,
            NAMESPACE,
            values,
            self.files / "slurm-values.yaml",
        )
        await charts.install(
            helm,
            client,
            CLUSTER_RELEASE,
            "sunk-cluster",
            NAMESPACE,
            charts.cluster_values(
                RELEASE,
                prepared.images.sunk,
                namespace=NAMESPACE,
                # Pods of the default namespace run in Slurm as the researcher, in
                # the account that grants inference and high (normal by default).
                tenants=[
                    {
                        "namespaces": ["default"],
                        "uids": str(USER_UID),
                        "user": USER_UID,
                        "accounts": [charts.RESEARCH_ACCOUNT],
                        "qos": list(charts.RESEARCH_QOS),
                    }
                ],
                # On, as on GPU nodes: the stand-in devices (no GPU here),
                # each kubelet's own root and CDI spec directories (they share
                # one host), and no NVIDIA toolkit (the host's /etc is no node's).
                gpu_plugin={
                    "deviceDir": str(devices),
                    "toolkitConfigDir": str(self.state_dir / "nvidia-container-runtime"),
                    "kubeletRootDir": f"{node_bed.group.dir}/{{node}}/kubelet",
                    "cdiSpecDirs": [f"{node_bed.group.dir}/{{node}}/cdi"],
                },
                slurmd_pods=slurmd_pods,
            ),
            values_file=self.files / "sunk-values.yaml",
        )
        # The slurmd pods get every GPU from the plugin: the NodeSet asks for
        # them where the node offers them, so the nodes must offer them first.
        try:
            await charts.wait_until(
                "the GPU plugin serving every node",
                lambda: charts.nodes_offer(client, names, RESOURCE_NODE_GPUS),
                120,
                interval=1,
            )
        except TimeoutError as timed_out:
            selector = {
                "app.kubernetes.io/name": "sunk",
                "app.kubernetes.io/instance": CLUSTER_RELEASE,
                "app.kubernetes.io/component": "gpu-plugin",
            }
            pods = await charts.pods_report(client, NAMESPACE, selector)
            raise TimeoutError(f"{timed_out}; the plugin's pods:\n{pods}") from None
        secret = charts.registry_auth_secret(NAMESPACE, private, *self.private_registry().login())
        await client.apply(codecs.from_dict(secret), force=True)
        await storage
        await charts.install(
            helm,
            client,
            RELEASE,
            "slurm",
            NAMESPACE,
            values,
            values_file=self.files / "slurm-values.yaml",
        )
        log(f"charts installed in {time.monotonic() - t1:.1f}s (helm releases sunk, slurm)")

        t2 = time.monotonic()
        nodes = [f"compute-{name}" for name in names]
        # Pods' Ready conditions (and a stopped Slurm's saved node states) may
        # still be those of before a `down`: only a job that runs on every node
        # shows the cluster works.
        try:
            login = await charts.wait_until(
                "a job on every compute node (srun from the login pod)",
                lambda: self._jobs_run(client, key, nodes),
                300,
                interval=1,
            )
        except TimeoutError as timed_out:
            pods = await charts.unready_pods(client, NAMESPACE)
            raise TimeoutError(f"{timed_out}; pods not Ready in {NAMESPACE}:\n{pods}") from None
        await charts.wait_until(
            "every compute node idle in sinfo after that job",
            lambda: asyncio.to_thread(self._all_idle, key, login, nodes),
            60,
            interval=0.5,
        )
        log(f"{len(nodes)} compute nodes run jobs in {time.monotonic() - t2:.1f}s")
        # The operator writes the topology as nodes join, and slurmctld's
        # sidecar applies each version with `scontrol reconfigure`, which drops
        # what was made at run time (a partition an admin just created): the
        # cluster is ready once the topology in force places every node.
        t3 = time.monotonic()
        await charts.wait_until(
            "the topology in force in slurmctld placing every compute node",
            lambda: asyncio.to_thread(self._topology_places, key, login, nodes),
            120,
            interval=1,
        )
        log(f"topology applied in {time.monotonic() - t3:.1f}s")
        t4 = time.monotonic()
        await charts.wait_until(
            "accounting (sacct) answering",
            lambda: asyncio.to_thread(self._accounting_up, key, login),
            300,
            interval=1,
        )
        log(f"accounting answers sacct in {time.monotonic() - t4:.1f}s")
        return BedAccess(kube, login, key, USER_NAME, nodes)

    async def _jobs_run(self, client: AsyncClient, key: Path, nodes: Sequence[str]) -> str | None:
        """The login pod's address once `srun` runs a step on every compute node."""
        login = await charts.pod_ip(client, NAMESPACE, charts.component(RELEASE, "login"))
        if login is None:
            return None
        command = f"srun -N{len(nodes)} -w {','.join(nodes)} --immediate=10 -t 1 hostname"
        proc = await asyncio.to_thread(self.ssh, key, login, [command], timeout=30)
        return login if set(proc.stdout.split()) == set(nodes) else None

    def _all_idle(self, key: Path, login: str, nodes: Sequence[str]) -> bool:
        proc = self.ssh(key, login, ["sinfo -h -N -o '%N %t'"], timeout=30)
        states = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(node) == "idle" for node in nodes)

    def _topology_places(self, key: Path, login: str, nodes: Sequence[str]) -> bool:
        proc = self.ssh(key, login, ["scontrol show topology"], timeout=30)
        placed = {
            name
            for word in proc.stdout.split()
            if word.startswith("Nodes=")
            for name in expand(word.removeprefix("Nodes="))
        }
        return set(nodes) <= placed

    def _accounting_up(self, key: Path, login: str) -> bool:
        return self.ssh(key, login, ["sacct -n -X"], timeout=30).returncode == 0

    def ssh(
        self, key: Path, login: str, command: Sequence[str], *, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` on the login pod; a time-out is exit code 124 (as timeout(1)),
        so a check that polls takes it as "not yet"."""
        argv = charts.ssh_argv(key, USER_NAME, login, command)
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as expired:
            out = expired.stdout.decode(errors="replace") if expired.stdout else ""
            return subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout}s")

    def login_address(self) -> str:
        """The login pod's current address (it changes when the pod is replaced)."""
        kube = self.kube().access()
        if kube is None:
            raise RuntimeError(f"no running control plane in {self.state_dir}: `sunk local up`")

        async def find() -> str | None:
            client = kube_client(kube.admin_kubeconfig, "sunk-local")
            try:
                return await charts.pod_ip(client, NAMESPACE, charts.component(RELEASE, "login"))
            finally:
                await client.close()

        address = asyncio.run(find())
        if address is None:
            raise RuntimeError("the login pod is not ready (see `sunk local status`)")
        return address

    def ssh_key(self) -> Path:
        return self.files / "id_ed25519"

    def down(self) -> None:
        """Stop what this bed started, and nothing else; idempotent.

        The nodes first (each pod stopped through CRI, then whatever is left in
        the node's cgroups; mounts go with the room), then the registry and
        the control plane; no build is ever triggered here.
        """
        from sunk_testbed.nodes import node_binaries_dir

        node_bin = node_binaries_dir()
        self.node_bed().stop(node_bin if (node_bin / ".complete").exists() else None)
        self.supervisor.stop_all()

    def leftovers(self) -> list[str]:
        """What a `down` should have removed but did not (empty when clean)."""
        left = [f"daemon {n}" for n in self.supervisor.names() if self.supervisor.running(n)]
        return left + self.node_bed().leftovers(self.node_names())

    def status(self) -> dict[str, bool]:
        """Each recorded daemon and whether it still runs."""
        return {n: self.supervisor.running(n) is not None for n in self.supervisor.names()}

    def _write_summary(self, access: BedAccess, images: ImageSet) -> None:
        summary: dict[str, Any] = {
            "kubernetes": {
                "server": access.kube.server,
                "kubeconfig": str(access.kube.admin_kubeconfig),
            },
            "slurm": {
                "namespace": NAMESPACE,
                "releases": [CLUSTER_RELEASE, RELEASE],
                "login": access.login_address,
                "user": access.user,
                "ssh_key": str(access.ssh_key),
                "identity": IDENTITY,
                "nodes": access.nodes,
            },
            "images": {image.repository: image.ref for image in images.all()},
        }
        (self.state_dir / "bed.json").write_text(json.dumps(summary, indent=2))
