"""The scheduler's loop: one work key per Slurm allocation (a pod, or a gang of pods).

Keys are what a job's comment carries (`<namespace>/<pod uid>` or
`<namespace>/gang:<name>`), so pod events, Slurm job events and a restart all
lead to the same key. Each reconcile reads the pods (informer) and the job
(Slurm view, or a direct read when the view has not seen it yet) as they are
now, and carries out what `decide.decide` says, one step towards agreement:

- pending pods, no job → ask for one (after looking for one: never twice):
  an allocation that starts now, bound in the same step, or else a batch
  placeholder that waits in Slurm's queue;
- job pending → PodScheduled=False with Slurm's reason;
- job running → bind every pod to the Kubernetes node behind its Slurm node;
- job preempted (it runs on for its GraceTime) or near its time limit → evict
  the pods, so that they are gone before Slurm ends the job;
- job ended (cancelled, timed out, preempted) → evict the pods;
- pods gone or finished → cancel the job.

Every job is the tenant's: submitted, signalled and cancelled with a token for
the tenant's uid, so the scheduler's own Slurm user needs no right to act for
another. Two kinds of job, because each is fast where the other is not:
- an immediate allocation (`POST /job/allocate`, `salloc --immediate`):
  slurmctld places it within the request, or refuses it at once; a batch job
  would wait for the next scheduling pass (a whole second at best);
- a batch placeholder, when the allocation is refused: it waits in Slurm's
  queue with a pending reason (a waiting allocation would hold slurmrestd's
  request until it starts). Its script ignores SIGTERM, so a cancelled or
  preempted placeholder holds its nodes for KillWait, the pods' window to stop.

Later starts, of jobs that had to wait, come as Slurm job events, which wake
the key at once (the view polls every 0.25 s and costs one small reply while
nothing changes): a bind within a poll, not within a 30 s cycle.

What the loop needs from Slurm is the narrow `SchedulerSlurm` port
(`slurm_port.py`); which pods and jobs belong to each key, the `JobIndex`
(`jobs.py`); its writes to pods, pure builders (`pod_writes.py`). Over 500
lines: what stays here is the loop and its I/O on both APIs, one short
method per action beside the loop that carries it out.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from lightkube import ApiError, AsyncClient, operators
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from sunk.api import ANNOTATION_SLURMD_GPUS, LABEL_NODESET
from sunk.api.nodeset import owning_nodeset
from sunk.gres.plan import slurm_gpu_devices
from sunk.kube.events import EventRecorder
from sunk.kube.informer import Event, Informer
from sunk.kube.raw import bind_pod, delete_pod
from sunk.kube.workqueue import Result, WorkQueue, run_workers
from sunk.scheduler.claim_allocator import ClaimAllocator, ClaimNotReady, asks_claims
from sunk.scheduler.claims import InvalidClaim
from sunk.scheduler.decide import (
    Bind,
    Cancel,
    Drop,
    Evict,
    Pending,
    Submit,
    active,
    bound,
    bound_to,
    decide,
    deleting,
    gated,
    pod_annotations,
    terminal,
)
from sunk.scheduler.gpu_binds import awaiting_admission, blocking
from sunk.scheduler.jobs import IDS_KEPT, CancelsSent, JobIndex, RecentIds
from sunk.scheduler.metrics import SchedulerMetrics
from sunk.scheduler.pod_writes import (
    job_id_patch,
    lock_toleration_patch,
    pending_job_patch,
    slurm_gpus_patch,
    unschedulable_patch,
)
from sunk.scheduler.request import (
    ANNOTATION_JOB_ID,
    SCHEDULER_NAME,
    Gang,
    InvalidPod,
    Options,
    Workload,
    identity_of,
    job_spec,
    namespace_of_key,
    workload_of,
)
from sunk.scheduler.seal import JobSeal
from sunk.scheduler.slurm_port import JobChange, NoTenantToken, SchedulerSlurm
from sunk.scheduler.tenancy import MIN_ID, Tenancy
from sunk.scheduler.workloads import WorkloadSizes, WorkloadUnreadable
from sunk.slurm.errors import SlurmApiError, SlurmError, SlurmUnavailableError
from sunk.slurm.hostlist import expand
from sunk.slurm.models import Job

log = logging.getLogger(__name__)

# Every key is looked at again this often: what events missed (orphans on
# either side) is found within it.
SWEEP_INTERVAL = 10.0
# While the Slurm view is stale, a key is looked at again this late.
STALE_RETRY = 1.0
# After an invalid request, try again this late (Slurm's configuration may change).
INVALID_RETRY = 60.0
# After a submit that may or may not have been taken, look again this late
# (more than slurmrestd's MessageTimeout-bound wait) before submitting anew.
UNCERTAIN_WAIT = 15.0
# A tenant's token not there yet (its uid just granted): looked for again after this.
TOKEN_RETRY = 5.0
# A JobSet or Job that could not be read for its gang's size: read again after this.
WORKLOAD_RETRY = 5.0
# A job this process submitted is waited for this long to appear in the view
# before it is read directly.
UNSEEN_WAIT = 5.0
# A job this process cancelled that the view still shows running is cancelled
# again only this late (the view shows the cancel within seconds).
CANCEL_RESEND = 10.0
# A GPU pod waiting for the kubelet to admit the one bound before it on its
# node is looked at again this late, if the admission's pod event missed it.
GPU_BIND_RETRY = 1.0
# A pod whose ResourceClaim is not made yet, or whose driver has not published
# the devices Slurm chose: looked at again this soon.
CLAIM_RETRY = 2.0
# The informer's index of the scheduler's pods by node.
BY_NODE = "node"


# What `_job_of` returns for a job just submitted that the view has not polled yet.
NOT_SEEN_YET = Job(job_id=0, job_state=("PENDING",), state_reason="not polled yet")


def _pod_uid(pod: Pod) -> str:
    return (pod.metadata.uid if pod.metadata else None) or ""


def _node_of(pod: Pod) -> list[str]:
    return [pod.spec.nodeName] if pod.spec and pod.spec.nodeName else []


def _pod_name(pod: Pod) -> str:
    return (pod.metadata.name if pod.metadata else None) or ""


class Scheduler:
    def __init__(
        self,
        kube: AsyncClient,
        slurm: SchedulerSlurm,
        *,
        seal: JobSeal,
        tenancy: Callable[[], Tenancy],
        tenancy_source: str = "the scheduler's tenancy",
        options: Options | None = None,
        scheduler_name: str = SCHEDULER_NAME,
        namespace: str | None = None,
        slurmd_namespace: str | None = None,
        workers: int = 16,
        settle: float = 5.0,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.options = options or Options()
        self.scheduler_name = scheduler_name
        self._kube = kube
        self._slurm = slurm
        self._seal = seal
        self._tenancy = tenancy  # read at each submit: a change applies to the next pod
        self._tenancy_source = tenancy_source
        self._namespace = namespace
        self._workers = workers
        # A predecessor killed mid-submit may have a job still in slurmctld's
        # hands: nothing is submitted until `settle` seconds after start (more than
        # slurmrestd's MessageTimeout-bound wait), and a full read then.
        self._settle = settle
        self.ready = asyncio.Event()  # set once submits are allowed
        # A bind's Event waits while pods wait to be placed (at most a few seconds).
        self._events = EventRecorder(
            kube, scheduler_name, busy=lambda: self.queue.busy or self.urgent.busy
        )
        self._pods: Informer[Pod] = Informer(
            kube, Pod, namespace=namespace, fields={"spec.schedulerName": scheduler_name}
        )
        # slurmd pods: a Slurm node's name is its pod's name; the pod's node is behind it.
        self._slurmd: Informer[Pod] = Informer(
            kube,
            Pod,
            namespace=slurmd_namespace,
            labels={LABEL_NODESET: operators.exists()},
        )
        self.queue: WorkQueue[str] = WorkQueue()
        # Keys Slurm woke (a job started or ended) have their own queue and
        # workers: a bind must not wait behind a burst of pods waiting to be
        # submitted. A per-key lock keeps the two from working on one key at once.
        self.urgent: WorkQueue[str] = WorkQueue()
        self._locks: dict[str, asyncio.Lock] = {}
        self.index = JobIndex(seal)
        self._reported: dict[str, str] = {}  # key → last problem reported as an Event
        self._unwritable: set[str] = set()  # namespaces whose pods it may not write (logged once)
        self._pods.subscribe(self._on_pod)
        self.metrics = metrics or SchedulerMetrics()
        self.metrics.slurm_requests.set_function(lambda: slurm.requests)
        self.metrics.view_fresh.set_function(lambda: 1 if slurm.fresh else 0)
        self.metrics.pending_pods.set_function(self._count_pending)
        self.metrics.waiting_on_slurm.set_function(lambda: len(self._waiting_on_slurm()))
        self.metrics.slurm_wait_seconds.set_function(
            lambda: max((time.time() - t for t in self._waiting_on_slurm()), default=0.0)
        )
        # Pod uid → when this process first saw it pending: the bind latency's start.
        self._first_seen: dict[str, float] = {}
        # Pods this process asked the apiserver to delete: the informer may still
        # show one without its deletionTimestamp, and a second delete of a
        # terminating pod succeeds again (one eviction, one Event, one count).
        self._evicted: RecentIds[str] = RecentIds(IDS_KEPT)
        # Pod uid → the node this process bound it to, until the informer shows
        # the bind (as kube-scheduler "assumes" a pod): a job event right after
        # the bind must not bind the pod again (a second Binding only gets a 409).
        self._assumed: dict[str, str] = {}
        self._cancelled = CancelsSent(CANCEL_RESEND)
        # GPU pods go to a node one at a time (gpu_binds): per node, a lock
        # over the check and the bind; the GPU pods bound by this process that
        # the informer does not show bound yet (uid → node, name); the keys
        # waiting for the pod before theirs to be admitted.
        self._pods.add_index(BY_NODE, _node_of)
        self._gpu_locks: dict[str, asyncio.Lock] = {}
        self._gpu_binding: dict[str, tuple[str, str]] = {}
        self._gpu_waiters: dict[str, set[str]] = {}
        self._workloads = WorkloadSizes(kube)
        self._claims = ClaimAllocator(kube, self.options.gpu_classes)

    # -- indexes and wake-ups -------------------------------------------------------

    def _on_pod(self, event: Event[Pod]) -> None:
        for key in self.index.pod_changed(event.key, event.new):
            if key is not None:
                self.queue.add(key)
        uid = _pod_uid(event.obj)
        if event.new is None or bound(event.new):
            self._assumed.pop(uid, None)
            self._gpu_binding.pop(uid, None)
        node = event.obj.spec.nodeName if event.obj.spec else None
        if node in self._gpu_waiters and (event.new is None or not awaiting_admission(event.new)):
            for key in self._gpu_waiters.pop(node, ()):
                self.urgent.add(key)
        if event.new is None or deleting(event.new):
            self._first_seen.pop(uid, None)
        elif not bound(event.new):  # popped by the bind (its event may come first)
            self._first_seen.setdefault(uid, time.monotonic())

    def _in_scope(self, key: str) -> bool:
        return self._namespace is None or namespace_of_key(key) == self._namespace

    def _on_job_change(self, change: JobChange | None) -> None:
        if change is None:  # everything may have changed
            self._reindex_jobs()
            self._requeue_all()
            return
        key = self.index.job_changed(change.job_id, change.old, change.new)
        if key is not None and self._in_scope(key):
            self.urgent.add(key)

    def _reindex_jobs(self) -> None:
        self.index.reindex(self._slurm.jobs(allow_stale=True))

    def tenancy_changed(self) -> None:
        """Pods refused under the old tenancy are looked at again now."""
        self._reported.clear()
        self._requeue_all()

    def kill_wait_changed(self, seconds: int) -> None:
        """Slurm's KillWait is now `seconds`: the next pod is checked against
        it, and pods refused under the old value are looked at again."""
        self.options = replace(self.options, kill_wait=seconds)
        self.tenancy_changed()

    def _requeue_all(self) -> None:
        for key in self.index.known_keys():
            if self._in_scope(key):
                self.queue.add(key)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            self._requeue_all()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._pods.run())
            group.create_task(self._slurmd.run())
            await asyncio.gather(self._pods.synced.wait(), self._slurmd.synced.wait())
            # Changes followed from before the full read below (the task starts
            # at the read's first wait), so none falls between the two.
            group.create_task(self._slurm.follow(self._on_job_change))
            # A full read that began after this process started, indexed before
            # any reconcile: a job a predecessor submitted just before it died is
            # found, never submitted again.
            await self._refresh()
            self._reindex_jobs()
            group.create_task(self._settle_then_submit())
            group.create_task(self._sweep())
            group.create_task(run_workers(self.queue, self.reconcile, self._workers))
            group.create_task(run_workers(self.urgent, self.reconcile, self._workers))

    async def _settle_then_submit(self) -> None:
        await asyncio.sleep(self._settle)
        started = time.monotonic()
        await self._refresh()
        self._reindex_jobs()
        self.ready.set()
        # When the first submits may go (a pod created before waits until then).
        log.info(
            "submitting from now on (full read of Slurm's jobs: %.1fs)", time.monotonic() - started
        )
        self._requeue_all()

    async def _refresh(self) -> None:
        while True:
            try:
                await self._slurm.refresh()
                return
            except SlurmError as exc:  # e.g. 24.11's passing "Unable to query partitions"
                log.warning("reading Slurm failed (%s); trying again", exc)
                await asyncio.sleep(0.5)

    # -- the reconcile ---------------------------------------------------------------

    def _members(self, key: str) -> list[Pod]:
        pods = [self._pods.get(k) for k in self.index.pods_of(key)]
        return sorted((self._as_bound(p) for p in pods if p is not None), key=_pod_name)

    def _as_bound(self, pod: Pod) -> Pod:
        """The pod with the node this process bound it to, while the informer
        has not shown that bind yet."""
        node = self._assumed.get(_pod_uid(pod))
        return pod if node is None else bound_to(pod, node)

    async def _job_of(self, key: str, pods: Sequence[Pod]) -> tuple[int | None, Job | None]:
        """The job for `key` (the live one if several), with its id; (None, None) if none.

        Only a job sealed for `key` counts: a job id on a pod is a hint (anyone who
        can edit the pod can write one), never a claim on that job."""
        known = self.index.candidates(key, pods, self._slurm.jobs())
        for job_id, job in known:
            if active(job):
                return job_id, job
        foreign: set[int] = set()
        for job_id, job in reversed(known):
            if job is not None:
                return job_id, job
            if self.index.awaited(key, job_id):
                return job_id, NOT_SEEN_YET  # the view's next poll brings it
            if self.index.forgotten(job_id):
                continue
            fetched = await self._slurm.read_job(job_id)
            if fetched is None:
                self.index.forget(job_id)
            elif self.index.key_of(job_id, fetched) == key:
                return job_id, fetched
            else:
                foreign.add(job_id)
        forgotten = [i for i, job in known if job is None and i not in foreign]
        return (max(forgotten), None) if forgotten else (None, None)

    async def reconcile(self, key: str) -> Result | None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            with self.metrics.reconciling():
                return await self._reconcile(key)

    def _count_pending(self) -> int:
        return sum(1 for pod in self._pods.items() if not bound(pod) and not deleting(pod))

    def _waiting_on_slurm(self) -> list[float]:
        """When each pod that waits on Slurm was created (Unix seconds): not bound,
        not being deleted, and with a Slurm job (its id on the pod) that has not
        placed it. From the pod, not from this process, so a new leader tells the
        same ages."""
        return [
            pod.metadata.creationTimestamp.timestamp()
            for pod in self._pods.items()
            if not bound(pod)
            and not deleting(pod)
            and pod.metadata is not None
            and pod.metadata.creationTimestamp is not None
            and ANNOTATION_JOB_ID in pod_annotations(pod)
        ]

    async def _reconcile(self, key: str) -> Result | None:
        if not self._slurm.fresh:
            log.debug("%s waits for a fresh view of Slurm", key)
            # Look again soon: a view that was only slow turns fresh again without
            # an event (a StateEvent requeues every key after an outage).
            return Result(requeue_after=STALE_RETRY)
        for unsealed_id, unsealed in self.index.unsealed(key):
            if active(unsealed):
                await self._cancel(key, unsealed_id, unsealed, "it lost the scheduler's seal")
        pods = self._members(key)
        job_id, job = await self._job_of(key, pods)
        if job is NOT_SEEN_YET:
            return Result(requeue_after=UNSEEN_WAIT)  # a JobEvent comes first, normally
        try:
            sizes = await self._gang_sizes(key, pods)
            decision = decide(pods, job_id, job, time.time(), sizes)
        except InvalidPod as exc:  # e.g. a gang named in an annotation that no label could hold
            return await self._invalid(key, pods, job_id, job, str(exc))
        except WorkloadUnreadable as exc:
            await self._pending([p for p in pods if not bound(p) and not gated(p)], str(exc))
            return Result(requeue_after=WORKLOAD_RETRY)
        result = None
        if decision.requeue_after is not None:
            result = Result(requeue_after=decision.requeue_after)
        for action in decision.actions:
            match action:
                case Cancel(why=why):
                    if (wait := await self._cancel(key, job_id, job, why)) is not None:
                        earlier = result.requeue_after if result else None
                        soonest = wait if earlier is None else min(wait, earlier)
                        result = Result(requeue_after=soonest)
                case Evict(pods=evicted, why=why):
                    await self._evict(evicted, job_id, job, why)
                case Bind(pods=unbound):
                    assert job is not None  # a running job's pods are bound
                    if (wait := await self._bind(key, unbound, job_id, job)) is not None:
                        result = Result(requeue_after=wait)
                case Submit(pods=waiting, gang=gang):
                    result = await self._submit(key, waiting, gang)
                case Pending(pods=waiting, message=message, job_id=pending_job):
                    await self._pending(waiting, message, pending_job)
                case Drop(job_id=dropped, carriers=carriers):
                    self.index.drop(dropped)
                    for pod in carriers:
                        await self._patch_pod(pod, job_id_patch(None))
        return result

    async def _gang_sizes(self, key: str, pods: Sequence[Pod]) -> dict[Workload, int]:
        """The gang size of the JobSet or indexed Job the key's pods belong to
        (read from its spec), if they belong to one."""
        live = [p for p in pods if not terminal(p) and not deleting(p)]
        if not live or (workload := workload_of(live[0])) is None:
            return {}
        return {workload: await self._workloads.size(namespace_of_key(key), workload)}

    # -- actions -----------------------------------------------------------------------

    async def _submit(self, key: str, pods: Sequence[Pod], gang: Gang | None) -> Result | None:
        if not self.ready.is_set():
            log.debug("%s waits for the first full read of Slurm", key)
            return None  # every key is looked at again once it is
        try:
            claim_gpus = {_pod_uid(pod): await self._claims.gpus(pod) for pod in pods}
            identity = identity_of(pods[0], self._tenancy(), self._tenancy_source, self.options)
            spec = job_spec(pods, self.options, self._seal, identity, gang, claim_gpus)
        except (InvalidPod, InvalidClaim) as exc:
            await self._refuse(key, pods, str(exc))
            return Result(requeue_after=INVALID_RETRY)
        except ClaimNotReady as exc:
            await self._pending(pods, f"waiting: {exc}")
            return Result(requeue_after=CLAIM_RETRY)
        if (left := self.index.uncertain_for(key)) is not None:
            if left > 0:
                return Result(requeue_after=left)
            # Long enough for slurmctld to have finished whatever it was doing:
            # a full read shows the job if the earlier submit was taken.
            await self._slurm.refresh()
            self._reindex_jobs()
            self.queue.add(key)
            return None
        try:
            await self._slurm.check_owner(identity.user_id)
        except NoTenantToken as exc:
            # A uid granted a moment ago: `sunk tokens` writes its token at
            # once, and the kubelet brings it to this pod within a minute.
            await self._pending(pods, f"no Slurm token for uid {exc.uid} yet: {exc.reason}")
            return Result(requeue_after=TOKEN_RETRY)
        try:
            placed = await self._slurm.place(identity.user_id, spec)
        except SlurmUnavailableError as exc:
            if exc.maybe_applied:
                self.index.uncertain(key, UNCERTAIN_WAIT)
            raise
        except SlurmApiError as exc:
            if exc.transient:
                # A busy slurmctld times out (5004) but may still take the job later.
                self.index.uncertain(key, UNCERTAIN_WAIT)
                raise
            await self._refuse(key, pods, f"Slurm refused the job: {exc.message}")
            return Result(requeue_after=INVALID_RETRY)
        self.index.submitted(key, placed.job_id, UNSEEN_WAIT)
        self._reported.pop(key, None)
        self.metrics.jobs.labels(kind="allocation" if placed.allocated else "batch").inc()
        log.info("submitted job %d for %s", placed.job_id, key)
        tolerated = asyncio.gather(*(self._tolerate_lock(pod, placed.job_id) for pod in pods))
        if not placed.allocated:
            await tolerated
            return None  # a placeholder in the queue: its start comes as a job event
        # The allocation runs already: one read of it (a few ms, while the pods'
        # tolerations are written) and the pods are bound now, not a view poll
        # later; never before their tolerations are in.
        _, job = await asyncio.gather(tolerated, self._read_placed(placed.job_id))
        if job is None or job.state != "RUNNING" or job.preempt_time:
            return None
        wait = await self._bind(key, pods, placed.job_id, job)
        return None if wait is None else Result(requeue_after=wait)

    async def _read_placed(self, job_id: int) -> Job | None:
        try:
            return await self._slurm.read_job(job_id)
        except SlurmError as exc:
            log.info("reading job %d failed (%s): the view brings it", job_id, exc)
            return None

    async def _tolerate_lock(self, pod: Pod, job_id: int) -> None:
        if (patch := lock_toleration_patch(pod, job_id)) is not None:
            await self._patch_pod(pod, patch)

    async def _patch_pod(self, pod: Pod, patch: dict[str, Any], *, status: bool = False) -> None:
        """Merge-patch the pod (strategic for its status: conditions merge by type);
        a pod gone meanwhile is no error, nor a pod in a namespace the scheduler
        may not write (the chart gives it pod writes in tenant namespaces only:
        there, the Event it emitted is what the pod's owner sees)."""
        assert pod.metadata is not None
        namespace = pod.metadata.namespace or "default"
        try:
            await self._kube.patch(
                Pod.Status if status else Pod,
                pod.metadata.name or "",
                patch,
                namespace=namespace,
                patch_type=PatchType.STRATEGIC if status else PatchType.MERGE,
            )
        except ApiError as exc:
            if exc.status.code == 403:
                if namespace not in self._unwritable:
                    self._unwritable.add(namespace)
                    log.warning("may not write pods in namespace %s: %s", namespace, exc)
                return
            if exc.status.code != 404:
                raise

    def _slurmd_pod(self, slurm_node: str) -> Pod | None:
        for pod in self._slurmd.items():
            if (
                pod.metadata
                and pod.metadata.name == slurm_node
                and not deleting(pod)
                # A label alone (anyone's to write) makes no pod a slurmd's.
                and owning_nodeset(pod) is not None
            ):
                return pod
        return None

    def _kube_node(self, slurm_node: str) -> str | None:
        pod = self._slurmd_pod(slurm_node)
        return pod.spec.nodeName if pod and pod.spec else None

    def _gpu_devices(self, job: Job) -> dict[str, tuple[int, ...]]:
        """The GPUs the job holds on each Slurm node, as device indices
        (Slurm's own indices count the GPUs of the node's gres.conf line).
        ValueError if a node's line cannot say."""
        devices: dict[str, tuple[int, ...]] = {}
        for slurm_node, indices in job.gpu_indices().items():
            pod = self._slurmd_pod(slurm_node)
            annotations = (pod.metadata.annotations if pod and pod.metadata else None) or {}
            try:
                devices[slurm_node] = slurm_gpu_devices(
                    indices, annotations.get(ANNOTATION_SLURMD_GPUS)
                )
            except ValueError as error:
                raise ValueError(f"node {slurm_node}: {error}") from error
        return devices

    async def _bind(
        self, key: str, pods: Sequence[Pod], job_id: int | None, job: Job
    ) -> float | None:
        """Bind the pods to their job's nodes; seconds until the key is to be
        looked at again if some wait for a GPU pod's admission or a claim."""
        slurm_nodes = expand(job.nodes)
        targets = [self._kube_node(name) for name in slurm_nodes]
        if None in targets or len(targets) < len(pods):
            missing = [n for n, t in zip(slurm_nodes, targets, strict=True) if t is None]
            await self._pending(
                pods,
                f"Slurm job {job_id} runs on {job.nodes}, not a NodeSet "
                f"node with a Kubernetes node: {', '.join(missing)}",
            )
            return None
        taken = {p.spec.nodeName for p in self._members(key) if p.spec and p.spec.nodeName}
        free = [(s, t) for s, t in zip(slurm_nodes, targets, strict=True) if t not in taken]
        try:
            gpus = self._gpu_devices(job)
        except ValueError as error:
            await self._pending(pods, f"Slurm job {job_id} runs on {job.nodes}; {error}")
            return GPU_BIND_RETRY
        chosen = list(zip(pods, free, strict=False))
        results = await asyncio.gather(
            *(
                self._bind_one(pod, node, job_id, gpus.get(slurm_node, ()))
                for pod, (slurm_node, node) in chosen
            ),
            return_exceptions=True,
        )
        retry: float | None = None
        for (pod, (_, node)), result in zip(chosen, results, strict=True):
            if isinstance(result, ClaimNotReady | InvalidClaim):
                # Slurm's job stands: the claim is looked at again until it
                # can be allocated (an invalid one is the pod's to fix).
                retry = min(retry, CLAIM_RETRY) if retry else CLAIM_RETRY
                await self._pending([pod], f"Slurm job {job_id} runs on {node}; {result}")
                continue
            if isinstance(result, BaseException):
                raise result
            if result:
                retry = GPU_BIND_RETRY
                self._gpu_waiters.setdefault(node or "", set()).add(key)
                await self._pending(
                    [pod],
                    f"Slurm job {job_id} runs on {node}; the pod waits for the kubelet to "
                    f"admit {', '.join(result)} there first (GPU pods are bound to a node "
                    "one at a time)",
                )
        return retry

    async def _bind_one(
        self, pod: Pod, node: str | None, job_id: int | None, gpus: tuple[int, ...]
    ) -> list[str]:
        """Bind the pod; with GPUs, only once no GPU pod bound to the node
        before it awaits admission: else nothing, and the names of those pods."""
        assert pod.metadata is not None
        assert node is not None
        if asks_claims(pod):
            # Each pod has claims of its own: nothing for the device plugin to
            # tell apart, so no wait for the pod bound before it.
            await self._claims.allocate(pod, node, gpus)
            await self._bind_now(pod, node, job_id)
            return []
        if not gpus:
            await self._bind_now(pod, node, job_id)
            return []
        async with self._gpu_locks.setdefault(node, asyncio.Lock()):
            binding = [name for n, name in self._gpu_binding.values() if n == node]
            if waiting := blocking(self._pods.by_index(BY_NODE, node), binding):
                return waiting
            # Before the bind: the kubelet admits the pod (and asks the device
            # plugin for its GPUs) as soon as it is bound.
            now = datetime.datetime.now(datetime.UTC)
            await self._patch_pod(pod, slurm_gpus_patch(gpus, now), status=True)
            await self._bind_now(pod, node, job_id)
            self._gpu_binding[_pod_uid(pod)] = (node, _pod_name(pod))
        return []

    async def _bind_now(self, pod: Pod, node: str, job_id: int | None) -> None:
        assert pod.metadata is not None
        await bind_pod(
            self._kube,
            pod.metadata.namespace or "default",
            _pod_name(pod),
            node,
            _pod_uid(pod),
            annotations={ANNOTATION_JOB_ID: str(job_id)},
        )
        self._assumed[_pod_uid(pod)] = node
        self.metrics.binds.inc()
        if (seen := self._first_seen.pop(_pod_uid(pod), None)) is not None:
            self.metrics.bind_seconds.observe(time.monotonic() - seen)
        log.info("bound %s/%s to %s (job %s)", pod.metadata.namespace, _pod_name(pod), node, job_id)
        self._events.emit_soon(
            pod, "Scheduled", f"Slurm job {job_id} allocated {node}; bound", action="Binding"
        )

    async def _cancel(
        self, key: str, job_id: int | None, job: Job | None, why: str
    ) -> float | None:
        """End the key's job; the seconds to look again if a cancel already sent
        is not in the view yet."""
        if job_id is None or not active(job):
            if job_id is not None:
                self._cancelled.ended(job_id)
            if self.index.retire(key):
                self._reported.pop(key, None)
                self._locks.pop(key, None)
            return None
        if (wait := self._cancelled.wait(job_id, time.monotonic())) is not None:
            return wait
        log.info("cancel job %d (%s): %s", job_id, key, why)
        self.metrics.cancels.inc()
        assert job is not None  # an active job was read
        if job.user_id is None or job.user_id < MIN_ID:
            # Never a cancel in another user's name: Slurm refuses it, and
            # slurmctld then stops answering job reads (docs/slurm-port.md).
            log.warning("cannot end job %d: it is not a tenant's (uid %s)", job_id, job.user_id)
            return None
        try:
            await self._slurm.end(job.user_id, job_id, job)
        except NoTenantToken as exc:
            # Its uid is no longer granted: the scheduler may not act as it.
            log.warning("cannot end job %d: %s", job_id, exc)
            return None
        self._cancelled.sent(job_id, time.monotonic())
        return None

    async def _evict(
        self, pods: Sequence[Pod], job_id: int | None, job: Job | None, why: str
    ) -> None:
        for pod in pods:
            if deleting(pod) or _pod_uid(pod) in self._evicted:
                continue
            assert pod.metadata is not None
            self._evicted.add(_pod_uid(pod))
            log.info("evict %s/%s: %s", pod.metadata.namespace, pod.metadata.name, why)
            self.metrics.evictions.labels(state=job.state if job is not None else "GONE").inc()
            await self._events.emit(pod, "Evicted", why, action="Evicting", type_="Warning")
            # The pod's own grace period: it fits Slurm's (checked at submit).
            await delete_pod(
                self._kube, pod.metadata.namespace or "default", _pod_name(pod), _pod_uid(pod)
            )

    async def _invalid(
        self, key: str, pods: Sequence[Pod], job_id: int | None, job: Job | None, message: str
    ) -> Result:
        """Pods whose labels or annotations no job can be made of: refused with an
        Event; one already running (its gang renamed since) stops, with its job."""
        if running := [p for p in pods if bound(p)]:
            await self._cancel(key, job_id, job, message)
            await self._evict(running, job_id, job, message)
        await self._refuse(key, [p for p in pods if not bound(p)], message)
        return Result(requeue_after=INVALID_RETRY)

    async def _refuse(self, key: str, pods: Sequence[Pod], message: str) -> None:
        self.metrics.refusals.inc()
        await self._pending(pods, message)
        if self._reported.get(key) != message:
            self._reported[key] = message
            log.warning("not placing %s: %s", key, message)
            for pod in pods:
                await self._events.emit(
                    pod,
                    "FailedScheduling",
                    message,
                    action="Scheduling",
                    type_="Warning",
                )

    async def _pending(self, pods: Iterable[Pod], message: str, job_id: int | None = None) -> None:
        """Tell the pods why they wait (PodScheduled=False), with the pending job's id."""
        now = datetime.datetime.now(datetime.UTC)
        for pod in pods:
            if (patch := pending_job_patch(pod, job_id)) is not None:
                await self._patch_pod(pod, patch)
            if (patch := unschedulable_patch(pod, message, now)) is not None:
                log.info("pod %s waits: %s", _pod_name(pod), message)
                await self._patch_pod(pod, patch, status=True)
