"""One pod on one node: a level-triggered loop that makes the host match the pod.

Every pass (`_sync`) looks at the latest Pod object and at what runs, and
does the next steps: admit, set up the sandbox (network namespace, volumes,
/etc/hosts), run init containers in order, run the containers with their
restart policy and back-off, act on probe results, write the status, and on
deletion stop everything within the grace period and finalize the delete.
Anything that changes (a watch event, a process exit, a probe result, a
timer) only wakes the loop; the pass itself decides what to do, so a missed
or repeated wake-up is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lightkube.models.core_v1 import Container, LifecycleHandler
from lightkube.resources.core_v1 import Pod

from sunk.local import plan
from sunk.local.apiproxy import SERVICE_HOST, SERVICE_PORT
from sunk.local.container import ContainerProcess, exit_code
from sunk.local.logs import write_containers
from sunk.local.probes import ProbeLoop, Target, wait_entered
from sunk.local.status import (
    BackOff,
    ContainerView,
    Phase,
    Terminated,
    now_utc,
    pod_conditions,
    pod_phase,
    rfc3339,
    should_restart,
)
from sunk.local.volumes import empty_dir, host_path, write_atomic, write_file_in_place
from sunk.testbed.sandbox import Bind, Sandbox

if TYPE_CHECKING:
    from sunk.local.node import NodeAgent

_log = logging.getLogger(__name__)

MIN_KILL_GRACE = 2.0  # kubelet never kills a container with less than 2 s of grace
RETRY = 1.0  # seconds before retrying a step that failed (fetch, mount, ...)
RESOLV_CONF = (
    "# sunk local runtime: no DNS server; names come from /etc/hosts\n"
    "options timeout:1 attempts:1\n"
)


def pod_key(pod: Pod) -> str:
    meta = pod.metadata
    assert meta is not None
    return f"{meta.namespace}_{meta.name}_{meta.uid}"


def involved(pod: Pod, container: str | None = None) -> dict[str, Any]:
    meta = pod.metadata
    assert meta is not None
    ref: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": meta.name,
        "namespace": meta.namespace,
        "uid": meta.uid,
    }
    if container:
        ref["fieldPath"] = f"spec.containers{{{container}}}"
    return ref


@dataclass
class Running:
    """A started container: its process, its probes and how to reach it."""

    proc: ContainerProcess
    target: Target
    probe_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    liveness_failed: str | None = None  # message of the failing liveness/startup probe
    stopping: asyncio.Task[int] | None = None


class PodWorker:
    def __init__(self, node: NodeAgent, pod: Pod) -> None:
        self.node = node
        self.pod = pod
        meta = pod.metadata
        assert meta is not None
        self.uid = meta.uid or ""
        self.namespace = meta.namespace or ""
        self.name = meta.name or ""
        self.key = pod_key(pod)
        self.dir = node.env.pods_dir / self.key
        self.gone = False  # removed from the API (force-deleted, or finalized by us)
        self.done = False  # the loop ends
        self.finalized = False  # the pod is gone for good (its uid will not come back)
        self._kick = asyncio.Event()
        self._wake_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        env = node.env
        self._backoff = BackOff(
            env.config.backoff_initial, env.config.backoff_max, asyncio.get_running_loop().time
        )
        self._admitted: bool | None = None
        self._rejection: plan.Rejection | None = None
        self._terminal: Phase | None = None
        self._sandbox_ready = False
        self._sandbox_error: str | None = None
        self.pod_ip: str | None = None
        self._netns: str | None = None
        self._start_time: datetime.datetime | None = None
        self._views: dict[str, ContainerView] = {}
        self._running: dict[str, Running] = {}
        self._fetched = plan.Fetched()
        self._fetched_at = -1e9
        self._token_renew: dict[plan.TokenSpec, float] = {}
        self._volume_digests: dict[str, str] = {}
        self._volume_dirs: dict[str, Path] = {}
        self._read_only_volumes: set[str] = set()
        self._last_status: dict[str, Any] | None = None
        self._limits_reported = False
        self._terminating_since: float | None = None
        self._status_frozen = False  # a pod that was already terminal when we got it
        self._initialized = False  # init containers all done once (stays so: sidecar restarts
        # do not hold the app containers back, as in kubelet)
        self._init_views(pod)

    # ------------------------------------------------------------ plumbing

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name=f"pod {self.key}")

    def update(self, pod: Pod) -> None:
        self.pod = pod
        self.kick()

    def removed(self) -> None:
        """The pod is gone from the API (or from this node's watch)."""
        self.gone = True
        self.kick()

    def kick(self) -> None:
        self._kick.set()

    def _wake_in(self, seconds: float) -> None:
        at = asyncio.get_running_loop().time() + max(0.0, seconds)
        if self._wake_at is None or at < self._wake_at:
            self._wake_at = at

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.done:
            self._kick.clear()
            self._wake_at = None
            try:
                await self._sync()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("pod %s: sync failed", self.key)
                self._wake_in(RETRY)
            if self.done:
                break
            timeout = None if self._wake_at is None else max(0.0, self._wake_at - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout)

    def _emit(self, kind: str, reason: str, message: str, container: str | None = None) -> None:
        self.node.emit(involved(self.pod, container), kind, reason, message)

    # ------------------------------------------------------------- views

    def _spec(self) -> Any:
        assert self.pod.spec is not None
        return self.pod.spec

    def _containers(self) -> list[tuple[Container, bool]]:
        spec = self._spec()
        return [(c, True) for c in spec.initContainers or []] + [
            (c, False) for c in spec.containers
        ]

    def _init_views(self, pod: Pod) -> None:
        # Restart counts continue from what the API shows (e.g. after a node restart).
        previous: dict[str, Mapping[str, Any]] = {}
        if pod.status is not None:
            for status in [
                *(pod.status.initContainerStatuses or []),
                *(pod.status.containerStatuses or []),
            ]:
                previous[status.name] = status.to_dict()
        for container, init in self._containers():
            view = ContainerView(
                name=container.name,
                image=container.image or "",
                init=init,
                sidecar=init and container.restartPolicy == "Always",
                waiting_reason="PodInitializing"
                if not init and self._spec().initContainers
                else "ContainerCreating",
            )
            before = previous.get(container.name)
            if before is not None:
                ran = "running" in (before.get("state") or {}) or "terminated" in (
                    before.get("state") or {}
                )
                view.restart_count = int(before.get("restartCount", 0)) + (1 if ran else 0)
            self._views[container.name] = view

    def _container(self, name: str) -> Container:
        return next(c for c, _ in self._containers() if c.name == name)

    # ---------------------------------------------------------------- sync

    async def _sync(self) -> None:
        meta = self.pod.metadata
        assert meta is not None
        if self.gone or meta.deletionTimestamp is not None:
            await self._terminate()
            return
        if self._admitted is None:
            self._admit()
        if self._rejection is not None:
            await self._write_status()
            return
        if self._terminal is not None:
            await self._write_status()
            return
        if not self._sandbox_ready and not await self._setup_sandbox():
            await self._write_status()
            self._wake_in(RETRY)
            return
        await self._refresh_volumes()
        init_done = await self._step_containers()
        phase = self._phase(init_done)
        if phase in ("Succeeded", "Failed"):
            self._terminal = phase
            await self._stop_all(self._grace_seconds())
            await self._teardown_sandbox()
        await self._write_status(init_done)

    def _admit(self) -> None:
        phase = self.pod.status.phase if self.pod.status else None
        if phase in ("Succeeded", "Failed"):
            # Finished before (e.g. before a node restart): never run it again, and
            # leave its final status alone.
            self._admitted = True
            self._terminal = cast(Phase, phase)
            self._status_frozen = True
            return
        rejection = self.node.admit(self.pod)
        self._admitted = rejection is None
        self._rejection = rejection
        self._start_time = now_utc()
        if rejection is not None:
            _log.info("pod %s rejected: %s", self.key, rejection.message)
            self._emit("Warning", rejection.reason, rejection.message)

    def _grace_seconds(self) -> float:
        meta = self.pod.metadata
        spec = self._spec()
        grace: float | None = None
        if meta is not None and meta.deletionGracePeriodSeconds is not None:
            grace = float(meta.deletionGracePeriodSeconds)
        elif spec.terminationGracePeriodSeconds is not None:
            grace = float(spec.terminationGracePeriodSeconds)
        if grace is None:
            grace = 30.0
        return max(grace, MIN_KILL_GRACE)

    # ------------------------------------------------------------ sandbox

    def _context(self) -> plan.PodContext:
        return plan.PodContext(
            pod_ip=self.pod_ip or "",
            host_ip=self.node.address,
            node_allocatable=self.node.allocatable,
        )

    async def _setup_sandbox(self) -> bool:
        """Network, /etc files and volumes; False (with a reason recorded) to retry later."""
        env = self.node.env
        try:
            for sub in ("volumes", "etc", "logs"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
            write_containers(
                self.dir,
                [c.name for c, init in self._containers() if init],
                [c.name for c, init in self._containers() if not init],
            )
            if self._netns is None and self.pod_ip is None:
                if self._spec().hostNetwork:
                    self.pod_ip = self.node.address
                else:
                    address = self.node.allocate_ip(self.uid)
                    self._netns = await env.network.add_pod(self.key, address)
                    self.pod_ip = address
            self._write_etc()
            await self._fetch(force=True)
            await self._resolve_claims()
            self._mount_volumes()
        except plan.ConfigError as exc:
            self._sandbox_error = f"{exc.reason}: {exc}"
            self._emit("Warning", "FailedMount", str(exc))
            return False
        except Exception as exc:
            _log.warning(
                "pod %s: sandbox not ready: %s",
                self.key,
                exc,
                exc_info=_log.isEnabledFor(logging.DEBUG),
            )
            self._sandbox_error = f"FailedCreatePodSandBox: {exc}"
            self._emit("Warning", "FailedCreatePodSandBox", str(exc))
            return False
        self._sandbox_error = None
        self._sandbox_ready = True
        return True

    def _hostname(self) -> str:
        if self._spec().hostNetwork:
            return self.node.name
        return plan.pod_hostname(self.pod)

    def _write_etc(self) -> None:
        etc = self.dir / "etc"
        write_file_in_place(etc / "hostname", self._hostname() + "\n")
        write_file_in_place(etc / "resolv.conf", RESOLV_CONF)
        hosts = etc / "hosts"
        self.node.env.hosts.register(self.uid, self.pod, self.pod_ip or "", self._hostname(), hosts)

    async def _fetch(self, force: bool = False) -> None:
        """(Re)read referenced ConfigMaps/Secrets and renew tokens when due."""
        loop = asyncio.get_running_loop()
        api = self.node.api
        refresh = self.node.env.config.volume_refresh
        if force or loop.time() - self._fetched_at >= refresh:
            fetched = plan.Fetched(tokens=self._fetched.tokens)
            for ref in plan.references(self.pod):
                data = await self.node.fetch(ref.kind, self.namespace, ref.name)
                table = fetched.config_maps if ref.kind == "ConfigMap" else fetched.secrets
                table[ref.name] = data
            self._fetched = fetched
            self._fetched_at = loop.time()
        for spec in plan.token_requests(self.pod):
            if spec in self._fetched.tokens and loop.time() < self._token_renew.get(spec, 0):
                continue
            token, expires = await api.token(self.pod, spec)
            lifetime = max(60.0, (expires - now_utc()).total_seconds())
            # kubelet renews at 80% of the lifetime.
            self._token_renew[spec] = loop.time() + 0.8 * lifetime
            self._fetched.tokens[spec] = token

    def _mount_volumes(self) -> None:
        """Create or update every volume's host directory."""
        ctx = self._context()
        spec = self._spec()
        group = spec.securityContext.fsGroup if spec.securityContext else None
        for volume in spec.volumes or []:
            files = plan.volume_files(volume, self.pod, self._fetched, ctx)
            path = self.dir / "volumes" / volume.name
            if files is not None:
                digest = hashlib.sha256(
                    json.dumps({k: [v.hex(), m] for k, (v, m) in sorted(files.items())}).encode()
                ).hexdigest()
                if self._volume_digests.get(volume.name) != digest:
                    write_atomic(path, files, group)
                    self._volume_digests[volume.name] = digest
                self._volume_dirs[volume.name] = path
                self._read_only_volumes.add(volume.name)
            elif volume.emptyDir is not None:
                self._volume_dirs[volume.name] = empty_dir(path, group)
            elif volume.hostPath is not None:
                self._volume_dirs[volume.name] = host_path(
                    volume.hostPath.path, volume.hostPath.type
                )
            elif volume.persistentVolumeClaim is not None:
                if volume.name not in self._volume_dirs:
                    raise plan.ConfigError(
                        f"persistentVolumeClaim {volume.persistentVolumeClaim.claimName!r} "
                        "not resolved yet",
                        reason="FailedMount",
                    )
                if volume.persistentVolumeClaim.readOnly:
                    self._read_only_volumes.add(volume.name)
            else:
                raise plan.ConfigError(
                    f"volume {volume.name!r}: unsupported volume type on the local runtime",
                    reason="FailedMount",
                )

    async def _resolve_claims(self) -> None:
        for volume in self._spec().volumes or []:
            claim = volume.persistentVolumeClaim
            if claim is None or volume.name in self._volume_dirs:
                continue
            self._volume_dirs[volume.name] = await self.node.claim_path(
                self.namespace, claim.claimName
            )

    async def _refresh_volumes(self) -> None:
        """ConfigMap/Secret/token changes reach running containers (whole-volume mounts)."""
        loop = asyncio.get_running_loop()
        due = loop.time() - self._fetched_at >= self.node.env.config.volume_refresh
        tokens_due = any(loop.time() >= t for t in self._token_renew.values())
        if due or tokens_due:
            try:
                await self._fetch()
                self._mount_volumes()
            except Exception as exc:  # keep running with the old contents
                _log.debug("pod %s: volume refresh failed: %s", self.key, exc)
        self._wake_in(self.node.env.config.volume_refresh)

    async def _teardown_sandbox(self) -> None:
        env = self.node.env
        env.hosts.unregister(self.uid)
        if self._netns is not None:
            await env.network.remove_pod(self.key)
            self._netns = None
        # Off the loop: removing a cgroup may wait for killed processes to be reaped.
        await asyncio.to_thread(env.cgroups.remove_pod, self.uid)
        self.node.release(self.uid)
        self._sandbox_ready = False
        # Volumes go with the pod (emptyDir semantics); logs stay for `sunk local logs`.
        await asyncio.to_thread(shutil.rmtree, self.dir / "volumes", True)

    # -------------------------------------------------------- containers

    def _restart_policy(self) -> str:
        return str(self._spec().restartPolicy or "Always")

    async def _step_containers(self) -> bool:
        """Start, restart or wait for containers; True when all init containers are done."""
        spec = self._spec()
        policy = self._restart_policy()
        for container in spec.initContainers or []:
            view = self._views[container.name]
            if view.sidecar:
                await self._ensure_running(container, view, "Always")
                if not view.started and not self._initialized:
                    return False
                continue
            if self._initialized:
                continue
            if view.ever_succeeded:
                continue
            if container.name in self._running:
                return False
            if view.state == "terminated" and view.terminated is not None:
                # A failed init container: restarted unless the pod's policy is Never.
                if policy != "Never":
                    await self._ensure_running(container, view, "OnFailure")
                return False
            await self._ensure_running(container, view, "OnFailure")
            return False
        self._initialized = True
        for container in spec.containers:
            await self._ensure_running(container, self._views[container.name], policy)
        return True

    async def _ensure_running(self, container: Container, view: ContainerView, policy: str) -> None:
        running = self._running.get(container.name)
        if running is not None:
            if running.liveness_failed and running.stopping is None:
                self._emit(
                    "Normal",
                    "Killing",
                    f"Container {container.name} failed {running.liveness_failed}, "
                    "will be restarted",
                    container.name,
                )
                running.stopping = asyncio.create_task(running.proc.stop(self._grace_seconds()))
            return
        if view.state == "terminated" and view.terminated is not None:
            if not should_restart(policy, view.terminated.exit_code):
                return
            key = container.name
            finished = view.extra.get("finished_mono", 0.0)
            if self._backoff.in_backoff_since(key, finished):
                delay = self._backoff.delay(key)
                view.last = view.terminated
                view.state = "waiting"
                view.waiting_reason = "CrashLoopBackOff"
                view.waiting_message = (
                    f"back-off {delay:g}s restarting failed container={container.name} "
                    f"pod={self.name}_{self.namespace}({self.uid})"
                )
                self._emit(
                    "Warning",
                    "BackOff",
                    f"Back-off restarting failed container {container.name} in pod {self.name}",
                    container.name,
                )
                self._wake_in(self._backoff.remaining(key, finished))
                return
            self._backoff.next(key)
        elif view.state == "waiting" and view.waiting_reason == "CrashLoopBackOff":
            key = container.name
            finished = view.extra.get("finished_mono", 0.0)
            if self._backoff.in_backoff_since(key, finished):
                self._wake_in(self._backoff.remaining(key, finished))
                return
            self._backoff.next(key)
        await self._start_container(container, view)

    def _user(self, container: Container) -> tuple[int, int] | None:
        spec = self._spec()
        pod_ctx = spec.securityContext
        ctx = container.securityContext
        uid = (ctx.runAsUser if ctx else None) or (pod_ctx.runAsUser if pod_ctx else None)
        gid = (ctx.runAsGroup if ctx else None) or (pod_ctx.runAsGroup if pod_ctx else None)
        if uid is None:
            return None
        return int(uid), int(gid if gid is not None else uid)

    async def _start_container(self, container: Container, view: ContainerView) -> None:
        env = self.node.env
        try:
            variables = plan.container_env(self.pod, container, self._fetched, self._context())
            variables.setdefault("HOSTNAME", self._hostname())
            # As kubelet does for the `kubernetes` Service; here the apiserver relay.
            variables.setdefault("KUBERNETES_SERVICE_HOST", SERVICE_HOST)
            variables.setdefault("KUBERNETES_SERVICE_PORT", str(SERVICE_PORT))
            variables.setdefault("KUBERNETES_SERVICE_PORT_HTTPS", str(SERVICE_PORT))
            gpus = self.node.gpus_for(self.uid, container)
            if gpus is not None:
                variables.setdefault("NVIDIA_VISIBLE_DEVICES", gpus)
            argv = plan.container_argv(container, variables)
            binds = [
                Bind(self.dir / "etc" / "hosts", "/etc/hosts"),
                Bind(self.dir / "etc" / "hostname", "/etc/hostname"),
                Bind(self.dir / "etc" / "resolv.conf", "/etc/resolv.conf"),
                *plan.container_binds(container, self._volume_dirs, self._read_only_volumes),
            ]
        except plan.ConfigError as exc:
            if view.state == "terminated" and view.terminated is not None:
                view.last = view.terminated
            view.state = "waiting"
            view.waiting_reason = exc.reason
            view.waiting_message = str(exc)
            self._emit("Warning", "Failed", f"Error: {exc}", container.name)
            self._wake_in(RETRY)
            return
        workdir = container.workingDir or "/"
        sandbox = Sandbox(
            env.rootfs,
            env.mountpoint,
            binds=binds,
            hostname=self._hostname(),
            netns=self._netns,
            user=self._user(container),
            env=variables,
            workdir=workdir,
            mkdirs=(workdir,) if workdir != "/" else (),
        )
        cgroup = env.cgroups.prepare(self.uid, container.name)
        cpu, memory = plan.container_limits(container)
        if not env.cgroups.set_limits(cgroup, cpu, memory) and not self._limits_reported:
            self._limits_reported = True
            self._emit(
                "Warning",
                "LimitsNotEnforced",
                "cpu/memory limits are not enforced on this machine (no delegated "
                "cgroup v2 memory and cpu controllers)",
            )
        # The first instance in this worker keeps the count the API showed (already
        # one more if it had run before, e.g. before a node restart); later ones add one.
        instances = int(view.extra.get("instances", 0))
        attempt = view.restart_count + (1 if instances > 0 else 0)
        view.extra["instances"] = instances + 1
        log = self.dir / "logs" / container.name / f"{attempt}.log"
        proc = ContainerProcess.spawn(sandbox.argv(argv), log, cgroup)
        if view.state == "terminated" and view.terminated is not None:
            view.last = view.terminated
        view.restart_count = attempt
        view.state = "running"
        view.terminated = None
        view.waiting_reason = ""
        view.waiting_message = None
        view.started_at = now_utc()
        view.ready = False
        view.container_id = f"sunk://{secrets.token_hex(16)}"
        view.started = False
        target = Target(
            pid=proc.pid,
            root=str(env.mountpoint),
            pod_ip=self.pod_ip or "",
            env=variables,
            user=self._user(container),
            cgroup=cgroup,
            allowed=self.node.env.allowed_address,
        )
        running = Running(proc, target)
        self._running[container.name] = running
        # Running means the command runs: wait until the process is in its sandbox
        # (kubelet reports a container after the runtime has started it, likewise).
        await wait_entered(target, 10.0)
        name = container.name

        def exited(_: asyncio.Future[int]) -> None:
            self._on_exit(name, running)

        proc.exited.add_done_callback(exited)
        self._emit("Normal", "Started", f"Started container {container.name}", container.name)
        lifecycle = container.lifecycle
        if lifecycle is not None and lifecycle.postStart is not None:
            # Like kubelet, the container counts as started only after its postStart hook.
            ok, message = await self._hook(container, target, lifecycle.postStart, 30.0)
            if not ok:
                self._emit(
                    "Warning",
                    "FailedPostStartHook",
                    f"PostStartHook failed: {message}",
                    container.name,
                )
                running.stopping = asyncio.create_task(proc.stop(MIN_KILL_GRACE))
                return
        # Started: after postStart, or (with a startup probe) when that succeeds.
        view.started = container.startupProbe is None
        self._start_probes(container, view, running)
        if container.readinessProbe is None and container.startupProbe is None:
            view.ready = True

    async def _hook(
        self, container: Container, target: Target, handler: LifecycleHandler, budget: float
    ) -> tuple[bool, str]:
        if handler.sleep is not None:
            await asyncio.sleep(min(float(handler.sleep.seconds), budget))
            return True, ""
        return await self.node.env.checker.action(
            container, target, handler.exec, handler.httpGet, handler.tcpSocket, budget
        )

    def _start_probes(self, container: Container, view: ContainerView, running: Running) -> None:
        checker = self.node.env.checker
        name = container.name
        labels = {"readiness": "Readiness", "liveness": "Liveness", "startup": "Startup"}

        def on_change(loop: ProbeLoop, ok: bool, message: str) -> None:
            if self._running.get(name) is not running:
                return
            if not ok:
                self._emit(
                    "Warning", "Unhealthy", f"{labels[loop.kind]} probe failed: {message}", name
                )
            state = loop.state
            if loop.kind == "startup":
                if state.result:
                    view.started = True
                    view.ready = container.readinessProbe is None
                elif state.failing:
                    running.liveness_failed = "startup probe"
            elif loop.kind == "liveness":
                if state.failing:
                    running.liveness_failed = "liveness probe"
            else:
                view.ready = state.result
            self.kick()

        for kind, probe in (
            ("startup", container.startupProbe),
            ("liveness", container.livenessProbe),
            ("readiness", container.readinessProbe),
        ):
            if probe is None:
                continue

            async def check(p: Any = probe) -> tuple[bool, str]:
                return await checker.probe(container, running.target, p)

            def gate() -> bool:
                # Liveness and readiness wait for the startup probe, as in kubelet.
                return view.started

            loop = ProbeLoop(
                kind, probe, check, on_change, (lambda: True) if kind == "startup" else gate
            )
            running.probe_tasks.append(
                asyncio.create_task(loop.run(), name=f"{kind} {self.key}/{name}")
            )

    def _on_exit(self, name: str, running: Running) -> None:
        if self._running.get(name) is not running:
            return
        del self._running[name]
        for task in running.probe_tasks:
            task.cancel()
        returncode = running.proc.exited.result()
        code, sig = exit_code(returncode)
        view = self._views[name]
        oom = self.node.env.cgroups.oom_killed(running.proc.cgroup)
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        view.state = "terminated"
        view.terminated = Terminated(code, reason, view.started_at, now_utc(), signal=sig)
        view.extra["finished_mono"] = asyncio.get_running_loop().time()
        view.ready = False
        view.started = False
        if view.init and not view.sidecar and code == 0:
            view.ever_succeeded = True
        _log.info("pod %s: container %s exited %s", self.key, name, code)
        # The rest of the container (forked children) goes with its main process.
        asyncio.get_running_loop().create_task(running.proc.finish())
        self.kick()

    def _phase(self, init_done: bool) -> Phase:
        views = list(self._views.values())
        return pod_phase(
            self._restart_policy(),
            init_done,
            [v for v in views if v.init],
            [v for v in views if not v.init],
        )

    async def _stop_all(self, grace: float) -> None:
        """Stop main containers, then sidecars in reverse order, within `grace` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        mains = [n for n, v in self._views.items() if not v.init and n in self._running]
        await asyncio.gather(*(self._stop_one(n, deadline) for n in mains))
        sidecars = [n for n, v in self._views.items() if v.init and n in self._running]
        for name in reversed(sidecars):
            await self._stop_one(name, max(deadline, loop.time() + MIN_KILL_GRACE))

    async def _stop_one(self, name: str, deadline: float) -> None:
        running = self._running.get(name)
        if running is None:
            return
        for task in running.probe_tasks:
            task.cancel()
        remaining = max(MIN_KILL_GRACE, deadline - asyncio.get_running_loop().time())
        if running.stopping is None:
            running.stopping = asyncio.create_task(running.proc.stop(remaining))
        with contextlib.suppress(Exception):
            await running.stopping
        await asyncio.sleep(0)  # let the exit callback record the termination

    # --------------------------------------------------------- termination

    async def _terminate(self) -> None:
        """preStop hooks, SIGTERM, SIGKILL at the deadline; then the final status and delete."""
        loop = asyncio.get_running_loop()
        if self._terminating_since is None:
            self._terminating_since = loop.time()
            for name in self._running:
                self._emit("Normal", "Killing", f"Stopping container {name}", name)
        grace = MIN_KILL_GRACE if self.gone else self._grace_seconds()
        deadline = self._terminating_since + grace
        if self._running:
            await self._pre_stop(deadline)
            await self._stop_all(max(0.0, deadline - loop.time()))
        await self._teardown_sandbox()
        if self._admitted and self._rejection is None and self._terminal is None:
            self._terminal = self._final_phase()
        if not self.gone:
            await self._write_status()
            await self.node.api.delete_pod(self.pod)
        self.node.release(self.uid)
        self.finalized = True
        self.done = True

    async def _pre_stop(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()

        async def run_hook(name: str) -> None:
            container = self._container(name)
            running = self._running.get(name)
            lifecycle = container.lifecycle
            if running is None or lifecycle is None or lifecycle.preStop is None:
                return
            budget = max(0.1, deadline - loop.time())
            try:
                ok, message = await asyncio.wait_for(
                    self._hook(container, running.target, lifecycle.preStop, budget), budget
                )
            except TimeoutError:
                ok, message = False, "preStop hook timed out"
            if not ok:
                self._emit("Warning", "FailedPreStopHook", f"PreStopHook failed: {message}", name)

        await asyncio.gather(*(run_hook(n) for n in list(self._running)))

    def _final_phase(self) -> Phase:
        mains = [v for v in self._views.values() if not v.init]
        if mains and all(v.terminated is not None and v.terminated.exit_code == 0 for v in mains):
            return "Succeeded"
        return "Failed"

    async def shutdown(self, grace: float) -> None:
        """The node stops: stop every container (no API writes), tear the sandbox down."""
        self.done = True
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        await self._stop_all(grace)
        for running in list(self._running.values()):
            await running.proc.finish()
        await self._teardown_sandbox()

    # ----------------------------------------------------------- status

    def _status(self, init_done: bool) -> dict[str, Any]:
        now = now_utc()
        previous = self.pod.status.conditions if self.pod.status else None
        prev_conditions = [c.to_dict() for c in previous or []]
        if self._rejection is not None:
            return {
                "phase": "Failed",
                "reason": self._rejection.reason,
                "message": self._rejection.message,
                "startTime": rfc3339(self._start_time),
            }
        views = list(self._views.values())
        phase: Phase = self._terminal or self._phase(init_done)
        if self._terminal is not None:
            init_done = init_done or all(v.ever_succeeded or v.sidecar for v in views if v.init)
        spec = self._spec()
        gates = [g.conditionType for g in spec.readinessGates or []]
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": pod_conditions(
                prev_conditions,
                sandbox_ready=self._sandbox_ready,
                init_done=init_done,
                init=[v for v in views if v.init],
                main=[v for v in views if not v.init],
                phase=phase,
                readiness_gates=gates,
                now=now,
            ),
            "hostIP": self.node.address,
            "hostIPs": [{"ip": self.node.address}],
            "startTime": rfc3339(self._start_time or now),
            "containerStatuses": [v.to_json() for v in views if not v.init],
        }
        if any(v.init for v in views):
            status["initContainerStatuses"] = [v.to_json() for v in views if v.init]
        if self.pod_ip:
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}]
        if self._sandbox_error and not self._sandbox_ready:
            for view in views:
                if view.state == "waiting":
                    view.waiting_message = self._sandbox_error
        return status

    def _api_agrees(self, status: Mapping[str, Any]) -> bool:
        """Does the API's status show what we would write? (Others may have changed it,
        e.g. the node lifecycle controller marks pods NotReady on a NotReady node.)"""
        api = self.pod.status
        if api is None:
            return False
        if api.phase != status.get("phase") or api.podIP != status.get("podIP"):
            return False
        have = {c.type: c.status for c in api.conditions or []}
        return all(have.get(c["type"]) == c["status"] for c in status.get("conditions", []))

    async def _write_status(self, init_done: bool = False) -> None:
        if self._status_frozen:
            return
        status = self._status(init_done)
        if status == self._last_status and self._api_agrees(status):
            return
        try:
            await self.node.api.patch_pod_status(self.pod, status)
        except Exception as exc:
            _log.debug("pod %s: status not written: %s", self.key, exc)
            self._wake_in(RETRY)
            return
        self._last_status = status

    # ---------------------------------------------------------- for node

    def container_pids(self, name: str) -> list[int]:
        """Every process of a running container (for tests and debugging)."""
        running = self._running.get(name)
        return running.proc.leftovers() if running is not None else []

    @property
    def admitted_requests(self) -> dict[str, Decimal]:
        return plan.pod_requests(self.pod)
