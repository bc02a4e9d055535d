"""The benchmarks' bed: KWOK nodes on the real control plane, real slurmd for slurmd pods.

Stand-ins, named in every benchmark's output (`STAND_INS`):

- **Kubernetes nodes: KWOK (simulated).** The `kwok` controller (sigs.k8s.io/kwok,
  built by `sunk_testbed.nodes.ensure_node_binaries`) runs against the bed's
  own control plane (etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler, all real) and manages the Node objects the bed creates with
  the annotation `kwok.x-k8s.io/node: fake`: it makes them Ready, renews their
  Leases (40 s, as a kubelet does by default) and plays the lifecycle of the
  pods bound to them (Running and Ready at once, removed when deleted).
- **slurmd: real processes started by the bench, one per pod.** Pods labelled
  `app=slurmd` are left alone by KWOK's stages; a small pod mirror (this
  module run as a child process, `python bench/kwok_bed.py mirror ...`) does
  for them what a kubelet would do with the pod's slurmd container: for each
  such pod bound to a node it starts `slurmd -D -Z -N $SLURMD_NODENAME --conf
  "$SLURMD_CONF Port=P"` in the bed's Slurm sandbox (its own port, spool
  directory and log file), reports the pod Running, and Ready once slurmd
  accepts connections on its port (the old pods' TCP readiness probe); on
  deletion it sends SIGTERM, waits up to the pod's grace period, and removes
  the pod. A slurmd that exits by itself is restarted, as restartPolicy Always
  would. slurmd reads the bed's slurm.conf from the sandbox's /etc/slurm and
  munge's socket from the bed's munged, instead of configless from a Service.

What is real: the control plane, the sunk components under test, Slurm
(munged, slurmctld, slurmrestd and every slurmd). What is not: kubelets,
containers, images and the pod network (no pod runs anything but slurmd).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount

from sunk_testbed import control_plane
from sunk_testbed.control_plane import KubeAccess, KubeControlPlane, async_client
from sunk_testbed.images import DEFAULT_SLURM
from sunk_testbed.nodes import ensure_node_binaries, node_binaries_dir
from sunk_testbed.procs import Supervisor, free_port, port_open
from sunk_testbed.slurm_cluster import SlurmAccess, SlurmCluster, ensure_release_rootfs

STAND_INS = (
    "Kubernetes nodes: KWOK (simulated); slurmd: real processes started by the bench, one per pod"
)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SLURMD_LABEL = ("app", "slurmd")  # pods the mirror runs; KWOK's pod stages skip them
LEASE_SECONDS = 40  # a kubelet's default; KWOK renews every quarter of it
TICKS = os.sysconf("SC_CLK_TCK")
MODULE = Path(__file__).resolve()
_log = logging.getLogger("kwok_bed")

# KWOK v0.8 plays no lifecycle unless given Stages (its own defaults are only
# written by kwokctl). These follow KWOK's "fast" node and pod stages, with the
# pod stages restricted to pods that are not slurmd pods.
_NOT_SLURMD = f"""
    - key: '.metadata.labels.{SLURMD_LABEL[0]}'
      operator: 'NotIn'
      values: ['{SLURMD_LABEL[1]}']"""

KWOK_CONFIG = f"""\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: 10.0.0.0/16
  nodeLeaseDurationSeconds: {LEASE_SECONDS}
  manageNodesWithAnnotationSelector: {KWOK_ANNOTATION}=fake
  # Not defaulted when a config file is given.
  nodeLeaseParallelism: 8
  nodePlayStageParallelism: 4
  podPlayStageParallelism: 8
  podsOnNodeSyncParallelism: 2
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      {{{{ range NodeConditions }}}}
      - lastHeartbeatTime: {{{{ $now | Quote }}}}
        lastTransitionTime: {{{{ $now | Quote }}}}
        message: {{{{ .message | Quote }}}}
        reason: {{{{ .reason | Quote }}}}
        status: {{{{ .status | Quote }}}}
        type: {{{{ .type | Quote }}}}
      {{{{ end }}}}
      allocatable:
      {{{{ with .status.allocatable }}}}
      {{{{ YAML . 1 }}}}
      {{{{ else }}}}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{{{ end }}}}
      capacity:
      {{{{ with .status.capacity }}}}
      {{{{ YAML . 1 }}}}
      {{{{ else }}}}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{{{ end }}}}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        kubeProxyVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        containerRuntimeVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        kernelVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat-with-lease
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      {{{{ range NodeConditions }}}}
      - lastHeartbeatTime: {{{{ $now | Quote }}}}
        message: {{{{ .message | Quote }}}}
        reason: {{{{ .reason | Quote }}}}
        status: {{{{ .status | Quote }}}}
        type: {{{{ .type | Quote }}}}
      {{{{ end }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']{_NOT_SLURMD}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{type: Initialized, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: ContainersReady, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: Running
      startTime: {{{{ $now | Quote }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'{_NOT_SLURMD}
  next:
    delete: true
"""


# -- small helpers shared by the benchmarks -----------------------------------


def _stat(text: str) -> tuple[str, list[str]]:
    """A /proc/<pid>/stat line: the command, and the fields after it (state first)."""
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def _cpu_seconds(fields: list[str]) -> float:
    """utime + stime."""
    return (int(fields[11]) + int(fields[12])) / TICKS


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (own, and reaped children's), RSS, peak RSS and threads of a process."""
    _, fields = _stat(Path(f"/proc/{pid}/stat").read_text())
    status = {
        line.split(":")[0]: line.split(":")[1].strip()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    }
    return {
        "cpu_s": _cpu_seconds(fields),
        "sys_s": int(fields[12]) / TICKS,
        "children_cpu_s": (int(fields[13]) + int(fields[14])) / TICKS,
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
        "threads": int(status["Threads"]),
    }


def cpu_by_command() -> dict[str, float]:
    """CPU seconds of every process on the machine, summed by command name: what
    a burst cost each part (slurmctld, slurmrestd, kube-apiserver, etcd, ...)."""
    totals: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes():
                continue  # a kernel thread: its name changes with its work
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        comm, fields = _stat(stat)
        totals[comm] = totals.get(comm, 0.0) + _cpu_seconds(fields)
    return totals


def cpu_spent(before: dict[str, float], after: dict[str, float], top: int = 8) -> str:
    """The commands that used the most CPU between two `cpu_by_command` readings."""
    spent = {c: after[c] - before.get(c, 0.0) for c in after}
    ranked = sorted(((s, c) for c, s in spent.items() if s > 0.05), reverse=True)[:top]
    return ", ".join(f"{c} {s:.1f}" for s, c in ranked)


def apiserver_requests(kubeconfig: Path) -> dict[str, float]:
    """The apiserver's request counters (its /metrics), summed by verb and
    resource: what a burst asked of it, whoever asked."""
    kubectl = [str(node_binaries_dir() / "kubectl"), f"--kubeconfig={kubeconfig}"]
    out = subprocess.run(
        [*kubectl, "get", "--raw", "/metrics"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    totals: dict[str, float] = {}
    for line in out.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if not fields.get("resource"):
            continue  # /metrics, /healthz and the like: the bench's own reads
        what = fields["resource"] + (
            f"/{fields['subresource']}" if fields.get("subresource") else ""
        )
        key = f"{fields['verb']} {what}"
        totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def requests_made(before: dict[str, float], after: dict[str, float], top: int = 10) -> str:
    """The most frequent requests between two `apiserver_requests` readings."""
    made = {k: after[k] - before.get(k, 0.0) for k in after}
    ranked = sorted(((n, k) for k, n in made.items() if n >= 1), reverse=True)[:top]
    return ", ".join(f"{k} {n:.0f}" for n, k in ranked)


async def wait_until(
    what: str, check: Callable[[], Awaitable[bool]], limit: float = 60, every: float = 0.02
) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(every)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- Kubernetes objects ---------------------------------------------------------


def kwok_node(name: str) -> Node:
    node = Node.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {KWOK_ANNOTATION: "fake"},
                "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
            },
        }
    )
    assert isinstance(node, Node)
    return node


def node_resources(cpu: str, memory: str, pods: str) -> dict[str, Any]:
    capacity = {"cpu": cpu, "memory": memory, "pods": pods}
    return {"status": {"capacity": capacity, "allocatable": capacity}}


def slurmd_pod(
    name: str,
    namespace: str,
    node: str,
    conf: str,
    labels: dict[str, str] | None = None,
    grace: int = 2,
) -> Pod:
    """A slurmd pod bound to `node`: the mirror runs slurmd -N `name` --conf `conf`."""
    pod = Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {SLURMD_LABEL[0]: SLURMD_LABEL[1], **(labels or {})},
            },
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": grace,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "slurmd",
                        "image": "registry.sunk.test/sunk/slurm",
                        "env": [
                            {"name": "SLURMD_NODENAME", "value": name},
                            {"name": "SLURMD_CONF", "value": conf},
                        ],
                    }
                ],
            },
        }
    )
    assert isinstance(pod, Pod)
    return pod


def nodeset_template(marker: str = "v1") -> dict[str, Any]:
    """A NodeSet pod template: the controller adds SLURMD_NODENAME and SLURMD_CONF to
    the slurmd container; `marker` is an env var whose change makes a new revision."""
    return {
        "metadata": {"labels": {SLURMD_LABEL[0]: SLURMD_LABEL[1]}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "slurmd",
                    "image": "registry.sunk.test/sunk/slurm",
                    "command": [
                        "sh",
                        "-c",
                        'exec slurmd -D -Z -N "$SLURMD_NODENAME" --conf "$SLURMD_CONF"',
                    ],
                    "env": [{"name": "MARKER", "value": marker}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }


# -- the pod mirror: a kubelet for slurmd pods ------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _env(pod: Pod) -> dict[str, str]:
    containers = pod.spec.containers if pod.spec else []
    slurmd = next((c for c in containers if c.name == "slurmd"), containers[0])
    return {e.name: e.value or "" for e in slurmd.env or []}


class _Runner:
    """One slurmd pod: its slurmd process from start to the pod's removal."""

    def __init__(self, mirror: SlurmdMirror, pod: Pod) -> None:
        assert pod.metadata is not None
        assert pod.spec is not None
        self.mirror = mirror
        self.pod = pod
        self.name = pod.metadata.name or ""
        self.namespace = pod.metadata.namespace or ""
        env = _env(pod)
        self.node_name = env.get("SLURMD_NODENAME") or self.name
        self.conf = env.get("SLURMD_CONF") or "Feature=dynamic CPUs=1"
        self.grace = pod.spec.terminationGracePeriodSeconds or 0
        self.deleting = asyncio.Event()
        self.gone = False  # the pod object no longer exists: nothing to remove
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task[None] | None = None
        self.started = _now()

    async def run(self) -> None:
        previous = self.mirror.by_node.get(self.node_name)
        if previous is not None and previous.task is not None:
            await asyncio.shield(previous.task)  # one slurmd per Slurm node name
        self.mirror.by_node[self.node_name] = self
        port = self.mirror.port_for(self.node_name)
        restarts = 0
        try:
            while not self.deleting.is_set():
                self.proc = await self.mirror.spawn(self.node_name, f"{self.conf} Port={port}")
                await self._status(ready=False, restarts=restarts)
                probe = asyncio.create_task(self._probe(port, restarts))
                exited = asyncio.create_task(self.proc.wait())
                deleted = asyncio.create_task(self.deleting.wait())
                await asyncio.wait({exited, deleted}, return_when=asyncio.FIRST_COMPLETED)
                probe.cancel()
                deleted.cancel()
                if self.deleting.is_set():
                    await self.mirror.terminate(self.proc, self.grace)
                    break
                restarts += 1
                _log.warning("slurmd %s exited (%s); restarting", self.node_name, exited.result())
                await self._status(ready=False, restarts=restarts)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.deleting.wait(), 1.0)
            if not self.gone:
                with contextlib.suppress(ApiError):
                    await self.mirror.kube.delete(
                        Pod, self.name, namespace=self.namespace, grace_period=0
                    )
        finally:
            if self.proc is not None and self.proc.returncode is None:
                await self.mirror.terminate(self.proc, 0)
            if self.mirror.by_node.get(self.node_name) is self:
                del self.mirror.by_node[self.node_name]

    async def _probe(self, port: int, restarts: int) -> None:
        """The pod turns Ready when slurmd accepts connections (a TCP probe, period 0.5 s)."""
        while not await asyncio.to_thread(port_open, port):  # noqa: ASYNC110 - a probe
            await asyncio.sleep(0.5)
        await self._status(ready=True, restarts=restarts)

    async def _status(self, *, ready: bool, restarts: int) -> None:
        now = _now()
        flag = "True" if ready else "False"
        status = {
            "status": {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "startTime": self.started,
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                    {"type": "Ready", "status": flag, "lastTransitionTime": now},
                ],
                "containerStatuses": [
                    {
                        "name": c.name,
                        "image": c.image or "",
                        "imageID": "",
                        "ready": ready,
                        "started": True,
                        "restartCount": restarts,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in (self.pod.spec.containers if self.pod.spec else [])
                ],
            }
        }
        with contextlib.suppress(ApiError):  # deleted meanwhile
            await self.mirror.kube.patch(Pod.Status, self.name, status, namespace=self.namespace)


class SlurmdMirror:
    """Runs one real slurmd per pod labelled app=slurmd that is bound to a node."""

    def __init__(self, kube: AsyncClient, cluster: SlurmCluster) -> None:
        self.kube = kube
        self.cluster = cluster
        self.runners: dict[str, _Runner] = {}  # by pod uid
        self.by_node: dict[str, _Runner] = {}  # by Slurm node name
        self._ports: dict[str, int] = {}
        self._procs: set[asyncio.subprocess.Process] = set()

    def port_for(self, node: str) -> int:
        if node not in self._ports:
            taken = set(self._ports.values())
            while (port := free_port()) in taken:
                pass
            self._ports[node] = port
        return self._ports[node]

    async def spawn(self, node: str, conf: str) -> asyncio.subprocess.Process:
        (self.cluster.spool_slurmd / node).mkdir(parents=True, exist_ok=True)
        argv = self.cluster.sandbox().argv(["slurmd", "-D", "-Z", "-N", node, "--conf", conf])
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # slurmd logs to its SlurmdLogFile
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs.add(proc)
        return proc

    async def terminate(self, proc: asyncio.subprocess.Process, grace: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), max(grace, 0.1))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        self._procs.discard(proc)

    def _handle(self, kind: str, pod: Pod) -> None:
        meta = pod.metadata
        if meta is None or meta.uid is None:
            return
        runner = self.runners.get(meta.uid)
        if kind == "DELETED":
            if runner is not None:
                runner.gone = True
                runner.deleting.set()
            return
        if meta.deletionTimestamp is not None:
            if runner is not None:
                runner.deleting.set()
            else:  # never ran here (e.g. deleted before it was seen bound): remove it
                asyncio.create_task(self._remove(pod))  # noqa: RUF006 - short, best effort
            return
        if runner is None and pod.spec is not None and pod.spec.nodeName:
            runner = _Runner(self, pod)
            self.runners[meta.uid] = runner
            uid = meta.uid
            runner.task = asyncio.create_task(runner.run())
            runner.task.add_done_callback(lambda _t: self.runners.pop(uid, None))

    async def _remove(self, pod: Pod) -> None:
        assert pod.metadata is not None
        with contextlib.suppress(ApiError):
            await self.kube.delete(
                Pod, pod.metadata.name or "", namespace=pod.metadata.namespace, grace_period=0
            )

    async def run(self) -> None:
        labels: dict[str, Any] = {SLURMD_LABEL[0]: SLURMD_LABEL[1]}
        while True:
            try:
                # After a broken watch, pods that vanished meanwhile: stop their slurmd.
                listed = [p async for p in self.kube.list(Pod, namespace="*", labels=labels)]
                alive = {p.metadata.uid for p in listed if p.metadata}
                for uid, runner in list(self.runners.items()):
                    if uid not in alive:
                        runner.gone = True
                        runner.deleting.set()
                for pod in listed:
                    self._handle("ADDED", pod)
                async for kind, pod in self.kube.watch(Pod, namespace="*", labels=labels):
                    self._handle(kind, pod)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken watch: list again
                _log.warning("pod watch: %s; listing again", exc)
                await asyncio.sleep(1)

    async def stop(self) -> None:
        """Stop every slurmd (the bed goes away; pods are left as they are)."""
        for runner in self.runners.values():
            if runner.task is not None:
                runner.task.cancel()
        await asyncio.gather(
            *(r.task for r in self.runners.values() if r.task is not None), return_exceptions=True
        )
        await asyncio.gather(*(self.terminate(p, 5) for p in list(self._procs)))


async def _mirror_main(state: Path, kubeconfig: Path) -> None:
    cluster = SlurmCluster.attach(state, Supervisor(state))
    kube = async_client(kubeconfig, field_manager="bench-slurmd-mirror")
    mirror = SlurmdMirror(kube, cluster)
    task = asyncio.create_task(mirror.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        await mirror.stop()
        await kube.close()


# -- the bed --------------------------------------------------------------------


@dataclass
class Bed:
    state: Path
    supervisor: Supervisor
    access: KubeAccess
    kube: AsyncClient
    cluster: SlurmCluster
    slurm: SlurmAccess
    nodes: list[str]

    def pid(self, daemon: str) -> int:
        started = self.supervisor.running(daemon)
        if started is None:
            raise RuntimeError(f"{daemon} is not running")
        return started.pid

    def stats(self, daemon: str) -> dict[str, float]:
        """proc_stats of one of the bed's daemons: kwok, slurmd-mirror, kube-apiserver, ..."""
        return proc_stats(self.pid(daemon))

    def slurmd_count(self) -> int:
        return sum(1 for pid in self.cluster.sandboxed_pids() if _comm(pid) == "slurmd")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


async def create_nodes(
    kube: AsyncClient, names: Sequence[str], cpu: str, memory: str, pods: str
) -> None:
    """KWOK nodes with the given allocatable, created 16 at a time."""
    queue = list(reversed(names))

    async def worker() -> None:
        while queue:
            name = queue.pop()
            await kube.create(kwok_node(name))
            await kube.patch(Node.Status, name, node_resources(cpu, memory, pods))

    await asyncio.gather(*(worker() for _ in range(16)))


async def wait_nodes_ready(kube: AsyncClient, names: Sequence[str], limit: float) -> None:
    wanted = set(names)

    async def all_ready() -> bool:
        ready = set()
        async for node in kube.list(Node):
            conds = (node.status.conditions if node.status else None) or []
            if any(c.type == "Ready" and c.status == "True" for c in conds):
                ready.add(node.metadata.name if node.metadata else "")
        return wanted <= ready

    await wait_until(f"{len(wanted)} KWOK nodes Ready", all_ready, limit, every=0.5)


async def ensure_namespace(kube: AsyncClient, namespace: str) -> None:
    body = Namespace.from_dict({"metadata": {"name": namespace}})
    assert isinstance(body, Namespace)
    await kube.create(body)

    async def account() -> bool:
        try:
            await kube.get(ServiceAccount, "default", namespace=namespace)
        except ApiError:
            return False
        return True

    await wait_until(f"the default ServiceAccount of {namespace}", account, 60, every=0.1)


def leftovers(state: Path, cluster: SlurmCluster) -> list[str]:
    """Processes of this bed still alive: in its Slurm sandbox or naming its state directory."""
    found = [f"{pid} {_comm(pid)}" for pid in cluster.sandboxed_pids()]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if str(state) in cmdline:
                    found.append(f"{entry.name} {cmdline[:80]}")
    return found


@contextlib.asynccontextmanager
async def kwok_bed(
    nodes: int,
    *,
    cpu: str = "2",
    memory: str = "4Gi",
    max_pods: str = "110",
    slurm_conf: Sequence[str] = (),
    max_node_count: int = 1024,
    namespaces: Sequence[str] = ("bench",),
    node_grace: str = "50s",
    prefix: str = "bench-",
    keep: bool = False,
    slurm_release: str = DEFAULT_SLURM,
    log: Callable[[str], None] = lambda m: print(m, flush=True),
) -> AsyncIterator[Bed]:
    """A fresh bed: control plane, KWOK with `nodes` nodes, Slurm (no static nodes,
    `slurm_conf` added), the namespaces, and the slurmd mirror; all gone afterwards.

    `node_grace` is kube-controller-manager's node-monitor-grace-period: the
    test bed's 10 s is shorter than KWOK's lease renewal (every 10 s), so the
    benchmarks use Kubernetes' default of 50 s.
    """
    state = Path(tempfile.mkdtemp(prefix="sunk-bench-kwok-", dir="/tmp"))
    supervisor = Supervisor(state)
    cluster: SlurmCluster | None = None
    kube: AsyncClient | None = None
    rootfs = ensure_release_rootfs(slurm_release)
    bin_dir = ensure_node_binaries(log)
    control_plane.NODE_MONITOR_GRACE_PERIOD = node_grace
    log(f"[bed] {STAND_INS}")
    try:
        t = time.monotonic()
        access = KubeControlPlane(state, supervisor, log=lambda m: None).start()
        log(f"[bed] control plane up in {time.monotonic() - t:.1f} s (state {state})")
        (state / "kwok").mkdir()
        config = state / "kwok" / "kwok.yaml"
        config.write_text(KWOK_CONFIG)
        supervisor.spawn(
            "kwok",
            [
                str(bin_dir / "kwok"),
                f"--kubeconfig={access.admin_kubeconfig}",
                f"--config={config}",
            ],
        )
        kube = async_client(access.admin_kubeconfig, field_manager="bench")
        names = [f"{prefix}{i}" for i in range(1, nodes + 1)]
        t = time.monotonic()
        await create_nodes(kube, names, cpu, memory, max_pods)
        await wait_nodes_ready(kube, names, 120 + nodes / 5)
        log(f"[bed] {nodes} KWOK nodes Ready in {time.monotonic() - t:.1f} s")
        cluster = SlurmCluster(
            state,
            supervisor,
            rootfs,
            nodes=0,
            max_node_count=max_node_count,
            extra_conf=list(slurm_conf),
        )
        t = time.monotonic()
        slurm = await asyncio.to_thread(cluster.start)
        log(f"[bed] Slurm {slurm.slurm_version} up in {time.monotonic() - t:.1f} s")
        for namespace in namespaces:
            await ensure_namespace(kube, namespace)
        supervisor.spawn(
            "slurmd-mirror",
            [
                sys.executable,
                str(MODULE),
                "mirror",
                "--state",
                str(state),
                "--kubeconfig",
                str(access.admin_kubeconfig),
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        yield Bed(state, supervisor, access, kube, cluster, slurm, names)
    finally:
        if kube is not None:
            await kube.close()
        # The mirror first (it stops its slurmd), then Slurm (it kills whatever is
        # left in its sandboxes), then KWOK and the control plane.
        supervisor.stop("slurmd-mirror", grace=30)
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
        supervisor.stop_all()
        left = leftovers(state, cluster) if cluster is not None else []
        log(f"[bed] torn down; processes left: {len(left)} {left[:5] if left else ''}")
        if keep:
            log(f"[bed] state kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mirror = sub.add_parser("mirror", help="run the slurmd pod mirror (the bed starts it)")
    mirror.add_argument("--state", type=Path, required=True)
    mirror.add_argument("--kubeconfig", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per request otherwise
    asyncio.run(_mirror_main(args.state, args.kubeconfig))


if __name__ == "__main__":
    main()
