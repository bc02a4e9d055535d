"""One local node: its Node object, Lease, status, admission and pod workers.

The node talks to the apiserver only through its `NodeApi` (its own
`system:node:NAME` identity). `stop()` is a power-off: heartbeats stop (the
controller manager marks the node NotReady after its grace period) and every
container of the node is stopped; `start()` boots it again and re-runs the
pods still bound to it, as a kubelet does after a reboot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lightkube.models.core_v1 import Container
from lightkube.resources.core_v1 import Node, Pod

from sunk.local import plan
from sunk.local.port import NodeApi, WatchEvent
from sunk.local.status import now_utc, rfc3339
from sunk.local.worker import PodWorker

if TYPE_CHECKING:
    from sunk.local.runtime import Env

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeConfig:
    name: str
    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110
    gpus: int = 0  # nvidia.com/gpu extended resource (indices in NVIDIA_VISIBLE_DEVICES)
    ephemeral_storage: str = "100Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()


# Labels a kubelet may set on its own Node (NodeRestriction); others are applied
# with the runtime's admin identity after registration, as a cluster admin would.
_KUBELET_LABELS = {
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
}


def kubelet_may_set(label: str) -> bool:
    if label in _KUBELET_LABELS:
        return True
    prefix = label.split("/", 1)[0] if "/" in label else ""
    if prefix.startswith(("kubelet.kubernetes.io", "node.kubernetes.io")):
        return True
    restricted = prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
    restricted = restricted or prefix == "k8s.io" or prefix.endswith(".k8s.io")
    return not restricted


class NodeAgent:
    def __init__(
        self,
        env: Env,
        config: NodeConfig,
        index: int,
        api_factory: Callable[[], NodeApi],
    ) -> None:
        self.env = env
        self.config = config
        self.name = config.name
        self.index = index
        self.address = env.subnet.node_address(index)
        self._api_factory = api_factory
        self._api: NodeApi | None = None
        self.uid: str | None = None
        self.allocatable: dict[str, Decimal] = {
            "cpu": plan.quantity(config.cpu),
            "memory": plan.quantity(config.memory),
            "pods": Decimal(config.pods),
            "ephemeral-storage": plan.quantity(config.ephemeral_storage),
        }
        if config.gpus:
            self.allocatable[plan.GPU] = Decimal(config.gpus)
        self.labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": _arch(),
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": _arch(),
            **config.labels,
        }
        self.workers: dict[str, PodWorker] = {}
        self._finished: dict[str, None] = {}  # uids we finalized (ignore their late events)
        self._admitted: dict[str, Pod] = {}
        self._ip_slots: dict[str, int] = {}
        self._gpus: dict[tuple[str, str], list[int]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._events: asyncio.Queue[tuple[Mapping[str, Any], str, str, str]] = asyncio.Queue(
            maxsize=1000
        )
        self._boot_id = str(uuid.uuid4())
        self._ready_since = now_utc()
        # Set when the Node's Ready condition is not ours (the node lifecycle controller
        # marked it Unknown after late heartbeats): post status now, as kubelet does.
        self._status_due = asyncio.Event()
        self.running = False
        # ConfigMaps/Secrets read by this node's pods, shared for a short while
        # (kubelet's TTL cache): many pods of a node reference the same objects.
        self._objects: dict[tuple[str, str, str], tuple[float, Any]] = {}
        self._inflight: dict[tuple[str, str, str], asyncio.Future[Any]] = {}

    @property
    def api(self) -> NodeApi:
        if self._api is None:
            raise RuntimeError(f"node {self.name} is not running")
        return self._api

    # ---------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.running:
            return
        self._api = self._api_factory()
        await self.env.network.add_node_address(self.index)
        created = await self.api.register(self._manifest())
        self.uid = (created.get("metadata") or {}).get("uid")
        restricted = {k: v for k, v in self.labels.items() if not kubelet_may_set(k)}
        if restricted:
            await self.env.label_node(self.name, restricted)
        self._boot_id = str(uuid.uuid4())
        self._ready_since = now_utc()
        await self.api.patch_node_status(self._status())
        await self.api.renew_lease(self.env.config.lease_duration, self.uid)
        self.running = True
        self._tasks = [
            asyncio.create_task(self._heartbeat(), name=f"heartbeat {self.name}"),
            asyncio.create_task(self._watch_pods(), name=f"pods {self.name}"),
            asyncio.create_task(self._watch_own_node(), name=f"node {self.name}"),
            asyncio.create_task(self._send_events(), name=f"events {self.name}"),
        ]
        _log.info("node %s up at %s", self.name, self.address)

    async def stop(self, grace: float = 0.0) -> None:
        """Power off: no more heartbeats or API writes; every container stopped."""
        if not self.running:
            return
        self.running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        workers = list(self.workers.values())
        await asyncio.gather(*(w.shutdown(grace) for w in workers), return_exceptions=True)
        self.workers.clear()
        self._admitted.clear()
        self._ip_slots.clear()
        self._gpus.clear()
        await self.env.network.remove_node_address(self.index)
        if self._api is not None:
            await self._api.close()
            self._api = None
        _log.info("node %s stopped", self.name)

    # ------------------------------------------------------ registration

    def _resources(self) -> dict[str, str]:
        out = {k: _quantity_text(k, v) for k, v in self.allocatable.items()}
        return out

    def _manifest(self) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        if self.config.taints:
            spec["taints"] = [dict(t) for t in self.config.taints]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {k: v for k, v in self.labels.items() if kubelet_may_set(k)},
                "annotations": {"sunk.dev/local-runtime": "true"},
            },
            "spec": spec,
        }

    def _status(self) -> dict[str, Any]:
        now = rfc3339(now_utc())
        since = rfc3339(self._ready_since)

        def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            }

        version = self.env.config.kubernetes_version
        return {
            "capacity": self._resources(),
            "allocatable": self._resources(),
            "conditions": [
                cond(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                cond(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                cond(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.address},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": self._boot_id.replace("-", ""),
                "systemUUID": self._boot_id,
                "bootID": self._boot_id,
                "kernelVersion": platform.release(),
                "osImage": "sunk local runtime (Debian root filesystem)",
                "containerRuntimeVersion": "sunk-local://0.1.0",
                "kubeletVersion": version,
                "kubeProxyVersion": version,
                "operatingSystem": "linux",
                "architecture": _arch(),
            },
        }

    async def _heartbeat(self) -> None:
        """Renew the Lease often (the controller's liveness signal) and post status now and then."""
        config = self.env.config
        loop = asyncio.get_running_loop()
        last_status = loop.time()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._status_due.wait(), config.renew_interval)
            try:
                await self.api.renew_lease(config.lease_duration, self.uid)
                if self._status_due.is_set() or loop.time() - last_status >= config.status_interval:
                    self._status_due.clear()
                    await self.api.patch_node_status(self._status())
                    last_status = loop.time()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # timeouts have an empty str(): say which
                _log.warning("node %s: heartbeat failed: %r", self.name, exc)

    # -------------------------------------------------------------- pods

    async def _watch_own_node(self) -> None:
        """Admission checks node affinity against the Node's current labels, as kubelet
        does (an admin may label the node after it registered)."""
        async for event in self.api.own_node():
            for node in event.objects:
                labels = node.metadata.labels if node.metadata else None
                if event.kind != "delete" and labels is not None:
                    self.labels = dict(labels)
                if event.kind != "delete" and self.running and not _posted_ready(node):
                    self._status_due.set()

    async def _watch_pods(self) -> None:
        async for event in self.api.pods():
            try:
                self._on_pods(event)
            except Exception:
                _log.exception("node %s: pod event not handled", self.name)

    def _on_pods(self, event: WatchEvent) -> None:
        pods: list[Pod] = list(event.objects)
        if event.kind == "resync":
            present = {p.metadata.uid for p in pods if p.metadata}
            for known, worker in list(self.workers.items()):
                if known not in present:
                    worker.removed()
            # Admission goes in creation order, as in kubelet.
            pods.sort(
                key=lambda p: (p.metadata.creationTimestamp if p.metadata else None) or now_utc()
            )
        for pod in pods:
            found = pod.metadata.uid if pod.metadata else None
            if found is None:
                continue
            uid = found
            if event.kind == "delete":
                if uid in self.workers:
                    self.workers[uid].removed()
                continue
            if uid in self._finished:
                continue
            existing = self.workers.get(uid)
            if existing is not None:
                existing.update(pod)
                continue
            worker = PodWorker(self, pod)
            self.workers[uid] = worker
            worker.start()
            assert worker.task is not None
            worker.task.add_done_callback(self._worker_done_callback(uid))

    def _worker_done_callback(self, uid: str) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._worker_done(uid)

    def _worker_done(self, uid: str) -> None:
        worker = self.workers.pop(uid, None)
        if worker is not None and worker.finalized:
            self._finished[uid] = None
            if len(self._finished) > 10000:
                self._finished.pop(next(iter(self._finished)))

    # ------------------------------------------------- used by workers

    def admit(self, pod: Pod) -> plan.Rejection | None:
        assert pod.metadata is not None
        uid = pod.metadata.uid or ""
        rejection = plan.admit(
            pod,
            [p for u, p in self._admitted.items() if u != uid],
            self.allocatable,
            self.labels,
            self.name,
        )
        if rejection is None:
            self._admitted[uid] = pod
        return rejection

    def release(self, uid: str) -> None:
        self._admitted.pop(uid, None)
        self._ip_slots.pop(uid, None)
        for key in [k for k in self._gpus if k[0] == uid]:
            del self._gpus[key]

    def allocate_ip(self, uid: str) -> str:
        if uid not in self._ip_slots:
            used = set(self._ip_slots.values())
            slot = next((s for s in range(2, 255) if s not in used), None)
            if slot is None:
                raise RuntimeError(f"node {self.name}: no free pod address")
            self._ip_slots[uid] = slot
        return self.env.subnet.pod_address(self.index, self._ip_slots[uid])

    def gpus_for(self, uid: str, container: Container) -> str | None:
        """GPU indices for a container with an nvidia.com/gpu limit, like a device plugin."""
        limits = container.resources.limits if container.resources else None
        count = int(plan.quantity((limits or {}).get(plan.GPU, "0")))
        if count <= 0:
            return None
        key = (uid, container.name)
        if key not in self._gpus:
            taken = {i for ids in self._gpus.values() for i in ids}
            free = [i for i in range(self.config.gpus) if i not in taken]
            self._gpus[key] = free[:count]
        return ",".join(str(i) for i in self._gpus[key])

    async def claim_path(self, namespace: str, claim: str) -> Path:
        """The host directory of a bound PersistentVolumeClaim."""
        pvc = await self.api.pvc(namespace, claim)
        if pvc is None:
            raise plan.ConfigError(
                f"persistentvolumeclaim {claim!r} not found", reason="FailedMount"
            )
        volume = pvc.spec.volumeName if pvc.spec else None
        phase = pvc.status.phase if pvc.status else None
        if not volume or phase != "Bound":
            raise plan.ConfigError(
                f"persistentvolumeclaim {claim!r} is not bound", reason="FailedMount"
            )
        pv = await self.api.pv(volume)
        if pv is None or pv.spec is None:
            raise plan.ConfigError(f"persistentvolume {volume!r} not found", reason="FailedMount")
        if pv.spec.local is not None:
            path = Path(pv.spec.local.path)
        elif pv.spec.hostPath is not None:
            path = Path(pv.spec.hostPath.path)
        else:
            raise plan.ConfigError(
                f"persistentvolume {volume!r}: only local and hostPath volumes work here",
                reason="FailedMount",
            )
        return self.env.ensure_volume_dir(path)

    async def fetch(self, kind: str, namespace: str, name: str) -> dict[str, bytes] | None:
        """A ConfigMap's or Secret's data, cached for half the volume refresh period."""
        key = (kind, namespace, name)
        loop = asyncio.get_running_loop()
        ttl = self.env.config.volume_refresh / 2
        cached = self._objects.get(key)
        if cached is not None and loop.time() - cached[0] < ttl:
            return cast(dict[str, bytes] | None, cached[1])
        pending = self._inflight.get(key)
        if pending is not None:
            return cast(dict[str, bytes] | None, await asyncio.shield(pending))
        future: asyncio.Future[Any] = loop.create_future()
        self._inflight[key] = future
        try:
            if kind == "ConfigMap":
                value = await self.api.config_map(namespace, name)
            else:
                value = await self.api.secret(namespace, name)
            self._objects[key] = (loop.time(), value)
            future.set_result(value)
            return value
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            del self._inflight[key]

    def emit(self, involved: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._events.put_nowait((involved, kind, reason, message))

    async def _send_events(self) -> None:
        while True:
            involved, kind, reason, message = await self._events.get()
            with contextlib.suppress(Exception):
                await self.api.event(involved, kind, reason, message)


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _quantity_text(resource: str, value: Decimal) -> str:
    if resource == "cpu":
        millis = int(value * 1000)
        return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
    return str(int(value))


def _posted_ready(node: Node) -> bool:
    """Whether the Node still shows the Ready=True this runtime posts."""
    conditions = node.status.conditions if node.status else None
    return any(c.type == "Ready" and c.status == "True" for c in conditions or ())
