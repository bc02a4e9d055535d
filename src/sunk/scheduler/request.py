"""What a pod asks Slurm for: its placeholder job, read from the pod alone (pure).

A pod's identity travels in the job's comment (`sunk:<namespace>/<uid>`, or
`sunk:<namespace>/gang:<group>` for a gang), sealed (`sunk.scheduler.seal`),
so a restarted scheduler finds the job it submitted before it could write the
job id on the pod, and no one else's job passes for it. A user's comment
annotation follows the seal after a space.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lightkube.resources.core_v1 import Pod

from sunk.api import DOMAIN, GPU_PRODUCT_LABEL, GPU_RESOURCE
from sunk.kube.resources import pod_request
from sunk.scheduler.claims import GpuClass
from sunk.scheduler.seal import JobSeal
from sunk.scheduler.tenancy import MIN_ID, Tenancy
from sunk.slurm.models import JobSpec

SCHEDULER_NAME = "sunk-scheduler"

# Written by the scheduler.
ANNOTATION_JOB_ID = f"{DOMAIN}/slurm-job-id"
# Read from the pod: Slurm options.
ANNOTATION_PARTITION = f"{DOMAIN}/partition"
ANNOTATION_ACCOUNT = f"{DOMAIN}/account"
ANNOTATION_QOS = f"{DOMAIN}/qos"
ANNOTATION_TIME_LIMIT = f"{DOMAIN}/time-limit"
ANNOTATION_RESERVATION = f"{DOMAIN}/reservation"
ANNOTATION_EXCLUSIVE = f"{DOMAIN}/exclusive"
ANNOTATION_COMMENT = f"{DOMAIN}/comment"
ANNOTATION_USER_ID = f"{DOMAIN}/user-id"
ANNOTATION_GROUP_ID = f"{DOMAIN}/group-id"
ANNOTATION_GPU_TYPE = f"{DOMAIN}/gpu-type"
# Gangs: a label or annotation naming the group, and its size.
GANG_NAME = f"{DOMAIN}/gang"
GANG_SIZE = f"{DOMAIN}/gang-size"
# Workloads whose pods are gangs when no sunk gang is named: a JobSet (its
# label on every pod), an indexed Job (the completion index on each pod, the
# Job as the pod's controller) and a LeaderWorkerSet group.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"

# slurm --exclusive modes, by the annotation's value (SUNK's none/user/ok, plus Slurm's words).
SHARING = {
    "none": "none",
    "true": "none",
    "exclusive": "none",
    "user": "user",
    "mcs": "mcs",
    "topo": "topo",
    "ok": "oversubscribe",
    "oversubscribe": "oversubscribe",
}
_TIME = re.compile(r"(?:([0-9]{1,7})-)?([0-9]{1,10})(?::([0-9]{1,10}))?(?::([0-9]{1,10}))?")
# Slurm's largest time limit short of INFINITE, in minutes (a uint32, less its sentinel).
MAX_TIME_LIMIT = 2**32 - 2
# Kubernetes' rule for a label value. Every name a pod gives that reaches a job's
# comment or a Slurm field (gang, JobSet, LeaderWorkerSet, GPU type) must be one:
# an annotation may hold any text (spaces, newlines, `,` or `:` that Slurm
# would read as a separator), a label value cannot.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_VALUE_RULE = (
    "a label value: at most 63 letters, digits, '-', '_' or '.', "
    "beginning and ending with a letter or digit"
)
# A user's note after the seal (sunk.dev/comment): printable text on one line.
MAX_NOTE = 500

# The placeholder's batch script: it holds the allocation while the pod runs.
# SIGTERM is ignored so that on cancel or preemption the allocation lasts until
# Slurm's SIGKILL after KillWait, which is the pod's window to stop. SIGUSR1
# (sent by the scheduler once the pod is gone) ends it at once; `wait` lets
# the trap run without waiting for sleep to return.
PLACEHOLDER_SCRIPT = (
    "#!/bin/sh\ntrap '' TERM\ntrap 'exit 0' USR1\nwhile :; do sleep 3600 & wait $!; done\n"
)


class InvalidPod(ValueError):
    """The pod asks for something the scheduler cannot express or must refuse."""


@dataclass(frozen=True)
class Workload:
    """The Kubernetes object whose spec tells how many pods its gang has: an
    indexed Job ("Job", batch/v1) or a JobSet ("JobSet", jobset.x-k8s.io)."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Gang:
    name: str  # unique within the namespace
    size: int  # 0: its workload's size is not known yet
    workload: Workload | None = None  # where the size comes from, if not the pod


@dataclass(frozen=True)
class Resources:
    cpus: int
    memory_mib: int | None
    gpus: int


@dataclass(frozen=True)
class Options:
    """What the scheduler's configuration adds to every job."""

    partition: str | None = None
    constraint: str | None = None
    gpu_types: Mapping[str, str] = field(default_factory=dict)  # GPU product → GRES type
    # DeviceClasses whose ResourceClaims the scheduler allocates from the job's GPUs.
    gpu_classes: Mapping[str, GpuClass] = field(default_factory=dict)
    kill_wait: int = 30  # Slurm's KillWait, seconds
    grace_margin: int = 1  # a pod's grace period must be at most KillWait minus this


def label_value(value: str, what: str) -> str:
    """`value` if it is a valid label value; InvalidPod naming `what` and the rule."""
    if _LABEL_VALUE.fullmatch(value) is None:
        raise InvalidPod(f"{what}: {value!r} is not {LABEL_VALUE_RULE}")
    return value


def job_key(namespace: str, pod_uid: str, gang: Gang | None) -> str:
    """What the job's comment carries: which pod (or gang) it is for."""
    return f"{namespace}/gang:{gang.name}" if gang is not None else f"{namespace}/{pod_uid}"


def namespace_of_key(key: str) -> str:
    return key.split("/", 1)[0]


def _meta(pod: Pod) -> tuple[dict[str, str], dict[str, str]]:
    meta = pod.metadata
    return (
        dict((meta.labels if meta else None) or {}),
        dict((meta.annotations if meta else None) or {}),
    )


def _controller_job(pod: Pod) -> str | None:
    """The name of the batch/v1 Job that controls the pod, if one does."""
    for owner in (pod.metadata.ownerReferences if pod.metadata else None) or ():
        if owner.controller and owner.kind == "Job" and owner.apiVersion == "batch/v1":
            return owner.name
    return None


def workload_of(pod: Pod) -> Workload | None:
    """The JobSet or indexed Job whose spec sizes the pod's gang; None when the
    pod names a sunk gang itself or belongs to neither."""
    labels, annotations = _meta(pod)
    if GANG_NAME in labels or GANG_NAME in annotations:
        return None
    if jobset := labels.get(JOBSET_NAME):
        return Workload("JobSet", label_value(jobset, JOBSET_NAME))
    if JOB_COMPLETION_INDEX in annotations and (job := _controller_job(pod)) is not None:
        return Workload("Job", label_value(job, "the pod's Job"))
    return None


def gang_of(pod: Pod, sizes: Mapping[Workload, int] | None = None) -> Gang | None:
    """The pod's gang: sunk's label/annotation, else its JobSet, indexed Job or
    LeaderWorkerSet group. A JobSet's or Job's size is read from its spec by the
    caller (`sizes`); without it the gang's size is 0."""
    labels, annotations = _meta(pod)
    both = {**annotations, **labels}
    if name := both.get(GANG_NAME):
        return Gang(label_value(name, GANG_NAME), _positive(both.get(GANG_SIZE), GANG_SIZE))
    if (workload := workload_of(pod)) is not None:
        prefix = "jobset" if workload.kind == "JobSet" else "job"
        return Gang(f"{prefix}-{workload.name}", (sizes or {}).get(workload, 0), workload)
    if (lws := labels.get(LWS_NAME)) and (size := both.get(LWS_SIZE)):
        index = labels.get(LWS_GROUP_INDEX, "0")
        if not (index.isascii() and index.isdigit()):
            raise InvalidPod(f"{LWS_GROUP_INDEX}: {index!r} is not a group index (digits)")
        return Gang(f"lws-{label_value(lws, LWS_NAME)}-{index}", _positive(size, LWS_SIZE))
    return None


def _positive(value: str | None, what: str) -> int:
    """A gang's size: ASCII digits, 1 to 999,999 (no Slurm cluster has more nodes)."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 6:
        raise InvalidPod(f"{what} must be a positive integer, not {value!r}")
    number = int(value)
    if number < 1:
        raise InvalidPod(f"{what} must be a positive integer, not {value!r}")
    return number


def resources_of(pod: Pod) -> Resources:
    """The pod's requests, as Kubernetes counts them: the sum over containers, or the
    largest init container if that is more; CPUs rounded up to whole ones (at least 1)."""
    memory = pod_request(pod.spec, "memory")
    return Resources(
        cpus=max(1, math.ceil(pod_request(pod.spec, "cpu") - 1e-9)),
        memory_mib=math.ceil(memory / (1024 * 1024)) if memory > 0 else None,
        gpus=math.ceil(pod_request(pod.spec, GPU_RESOURCE)),
    )


def time_limit_minutes(value: str) -> int:
    """Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    match = _TIME.fullmatch(value.strip())
    if match is None:
        raise InvalidPod(f"{ANNOTATION_TIME_LIMIT}: invalid time limit {value!r}")
    days, first, second, third = match.groups()
    parts = [int(x) for x in (first, second, third) if x is not None]
    if days is not None:
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
        total = int(days) * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    elif len(parts) == 1:
        total = parts[0]
    elif len(parts) == 2:
        total = parts[0] + (1 if parts[1] else 0)
    else:
        total = parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
    if total < 1:
        raise InvalidPod(f"{ANNOTATION_TIME_LIMIT}: time limit {value!r} is under a minute")
    if total > MAX_TIME_LIMIT:
        raise InvalidPod(f"{ANNOTATION_TIME_LIMIT}: time limit {value!r} is over Slurm's largest")
    return total


def _int_annotation(annotations: Mapping[str, str], name: str) -> int | None:
    value = annotations.get(name)
    if value is None:
        return None
    # ASCII digits only: int() would also take other scripts' digits, " 5001" or "5_001".
    if not (value.isascii() and value.isdigit()) or len(value) > 10:
        raise InvalidPod(f"{name}: {value!r} is not a numeric id")
    return int(value)


def note_of(annotations: Mapping[str, str]) -> str | None:
    """The user's note that follows the seal in the job's comment (sunk.dev/comment)."""
    note = annotations.get(ANNOTATION_COMMENT)
    if note is None:
        return None
    if len(note) > MAX_NOTE or not note.isprintable():
        raise InvalidPod(
            f"{ANNOTATION_COMMENT}: must be printable text on one line, "
            f"at most {MAX_NOTE} characters"
        )
    return note


def grace_seconds(pod: Pod) -> int:
    grace = pod.spec.terminationGracePeriodSeconds if pod.spec else None
    return 30 if grace is None else grace


def gres_type(pod: Pod, options: Options) -> str | None:
    """The GRES type for the pod's GPUs: an annotation, else its GPU product selector
    mapped through the table; None asks for any GPU."""
    _, annotations = _meta(pod)
    if kind := annotations.get(ANNOTATION_GPU_TYPE):
        return label_value(kind, ANNOTATION_GPU_TYPE)
    selector = (pod.spec.nodeSelector if pod.spec else None) or {}
    product = selector.get(GPU_PRODUCT_LABEL)
    if product is None:
        return None
    if product not in options.gpu_types:
        raise InvalidPod(f"no GRES type is configured for GPU product {product!r}")
    return options.gpu_types[product]


@dataclass(frozen=True)
class Identity:
    """Who the job is in Slurm, once the namespace's grant allowed it."""

    user_id: int
    group_id: int | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    reservation: str | None = None


def identity_of(pod: Pod, tenancy: Tenancy, source: str, options: Options) -> Identity:
    """What the pod may be in Slurm: its annotations checked against its
    namespace's grant (`source` names where the tenancy comes from); InvalidPod
    naming the annotation and the rule."""
    assert pod.metadata is not None
    namespace = pod.metadata.namespace or "default"
    _, annotations = _meta(pod)
    grant = tenancy.grant_for(namespace)
    if grant is None:
        raise InvalidPod(f"namespace {namespace} is not served: no tenant in {source} lists it")
    user_id = _int_annotation(annotations, ANNOTATION_USER_ID)
    if user_id is not None and (user_id < MIN_ID or not grant.allows_uid(user_id)):
        raise InvalidPod(
            f"{ANNOTATION_USER_ID}: uid {user_id} is not granted to namespace {namespace} "
            f"(uids {grant.uids}; never below {MIN_ID}, never a reserved id)"
        )
    group_id = _int_annotation(annotations, ANNOTATION_GROUP_ID)
    if group_id is not None and (group_id < MIN_ID or not grant.allows_gid(group_id)):
        raise InvalidPod(
            f"{ANNOTATION_GROUP_ID}: gid {group_id} is not granted to namespace {namespace} "
            f"(gids {grant.gids or 'none'}; never below {MIN_ID}, never a reserved id)"
        )
    chosen: dict[str, str | None] = {}
    for kind, annotation, fallback in (
        ("accounts", ANNOTATION_ACCOUNT, None),
        ("partitions", ANNOTATION_PARTITION, options.partition),
        ("qos", ANNOTATION_QOS, None),
        ("reservations", ANNOTATION_RESERVATION, None),
    ):
        try:
            chosen[kind] = grant.chosen(kind, annotations.get(annotation), fallback)
        except ValueError as error:
            raise InvalidPod(f"{annotation}: {error} to namespace {namespace}") from None
    return Identity(
        user_id=grant.user if user_id is None else user_id,
        group_id=grant.group if group_id is None else group_id,
        account=chosen["accounts"],
        partition=chosen["partitions"],
        qos=chosen["qos"],
        reservation=chosen["reservations"],
    )


def job_spec(
    pods: Sequence[Pod],
    options: Options,
    seal: JobSeal,
    identity: Identity,
    gang: Gang | None = None,
    claim_gpus: Mapping[str, int] | None = None,
) -> JobSpec:
    """The placeholder job for one pod, or for all the pods of a gang (one node each).

    Slurm options come from the first pod's annotations; each node gets the
    largest request of any member. `claim_gpus` (by pod uid) are the GPUs a
    pod asks for through its ResourceClaims (sunk.scheduler.claims)."""
    first = pods[0]
    assert first.metadata is not None
    namespace = first.metadata.namespace or "default"
    _, annotations = _meta(first)
    for pod in pods:
        if (grace := grace_seconds(pod)) > options.kill_wait - options.grace_margin:
            raise InvalidPod(
                f"terminationGracePeriodSeconds {grace} does not fit Slurm's KillWait "
                f"({options.kill_wait}s, minus {options.grace_margin}s to delete the pod): "
                "Slurm would hand the node to the next job while the pod still stops"
            )
    needs = [resources_of(pod) for pod in pods]
    claimed = [
        (claim_gpus or {}).get((pod.metadata.uid if pod.metadata else None) or "", 0)
        for pod in pods
    ]
    for need, asked in zip(needs, claimed, strict=True):
        if need.gpus and asked:
            raise InvalidPod(
                f"the pod asks for GPUs both as {GPU_RESOURCE} ({need.gpus}) and through "
                f"ResourceClaims ({asked}); ask one way"
            )
    cpus = max(n.cpus for n in needs)
    memory = max((n.memory_mib or 0 for n in needs), default=0) or None
    gpus = max(n.gpus + asked for n, asked in zip(needs, claimed, strict=True))
    gres = None
    if gpus:
        kind = gres_type(first, options)
        gres = f"gres/gpu:{kind}:{gpus}" if kind else f"gres/gpu:{gpus}"
    sharing = None
    if (mode := annotations.get(ANNOTATION_EXCLUSIVE)) is not None:
        if mode.lower() not in SHARING:
            raise InvalidPod(
                f"{ANNOTATION_EXCLUSIVE}: {mode!r} is not one of {', '.join(sorted(SHARING))}"
            )
        sharing = SHARING[mode.lower()]
    time_limit = annotations.get(ANNOTATION_TIME_LIMIT)
    key = job_key(namespace, first.metadata.uid or "", gang)
    count = len(pods)
    name = f"{namespace}/{gang.name if gang else first.metadata.name}"
    return JobSpec(
        script=PLACEHOLDER_SCRIPT,
        name=name,
        partition=identity.partition,
        constraints=options.constraint,
        nodes=str(count),
        tasks=count,
        cpus_per_task=cpus,
        memory_per_node_mb=memory,
        tres_per_node=gres,
        time_limit_minutes=time_limit_minutes(time_limit) if time_limit else None,
        account=identity.account,
        qos=identity.qos,
        reservation=identity.reservation,
        comment=seal.comment(key, identity.user_id, note_of(annotations)),
        sharing=sharing,
        requeue=False,
        user_id=identity.user_id,
        group_id=identity.group_id,
        standard_output="/dev/null",
    )
