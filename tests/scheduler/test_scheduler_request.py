"""What a pod asks Slurm for (pure): resources, annotations, gangs, the job's identity."""

from __future__ import annotations

import re
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from sunk.api import GPU_PRODUCT_LABEL
from sunk.scheduler.decide import STOP_MARGIN, time_to_stop
from sunk.scheduler.jobs import refused_allocation
from sunk.scheduler.request import (
    ANNOTATION_COMMENT,
    ANNOTATION_EXCLUSIVE,
    ANNOTATION_GPU_TYPE,
    ANNOTATION_PARTITION,
    ANNOTATION_QOS,
    ANNOTATION_TIME_LIMIT,
    GANG_NAME,
    GANG_SIZE,
    JOB_COMPLETION_INDEX,
    JOBSET_NAME,
    LWS_GROUP_INDEX,
    LWS_NAME,
    LWS_SIZE,
    Gang,
    Identity,
    InvalidPod,
    Options,
    Workload,
    gang_of,
    identity_of,
    job_key,
    job_spec,
    resources_of,
    time_limit_minutes,
)
from sunk.scheduler.seal import JobSeal
from sunk.scheduler.tenancy import Grant, Tenancy
from sunk.slurm.models import Job

SEAL = JobSeal(b"k" * 32, "slurm")
ME = Identity(user_id=5000)
TENANCY = Tenancy(
    tenants=[
        Grant(
            namespaces=["ns"], uids="5000-5009", user=5000, partitions=["k8s", "gpu"], qos=["high"]
        )
    ]
)


def pod(
    name: str = "p",
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    grace: int | None = 10,
    init: list[dict[str, Any]] | None = None,
    selector: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
) -> Pod:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "image": "x",
                "resources": {"requests": requests or {}, "limits": limits or {}},
            }
        ],
        "initContainers": init or [],
        "nodeSelector": selector or {},
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return Pod.from_dict(
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": f"uid-{name}",
                "annotations": annotations or {},
                "labels": labels or {},
                "ownerReferences": [owner] if owner else [],
            },
            "spec": spec,
        },
    )


def job_owner(name: str = "train", *, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name,
        "uid": "u",
        "controller": controller,
    }


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("90", 90), ("5:30", 6), ("1:00:00", 60), ("2-0", 2880), ("1-2:30", 1590), ("0-0:0:1", 1)],
)
def test_time_limits_in_slurms_formats(text: str, minutes: int) -> None:
    assert time_limit_minutes(text) == minutes


@pytest.mark.parametrize("text", ["soon", "1h", "", "0"])
def test_bad_time_limits_are_refused(text: str) -> None:
    with pytest.raises(InvalidPod):
        time_limit_minutes(text)


def test_resources_round_cpus_up_and_count_init_containers_like_kubernetes() -> None:
    got = resources_of(
        pod(
            requests={"cpu": "1500m", "memory": "1Gi"},
            limits={"nvidia.com/gpu": "2"},
            init=[{"name": "i", "image": "x", "resources": {"requests": {"cpu": "3"}}}],
        )
    )
    assert (got.cpus, got.memory_mib, got.gpus) == (3, 1024, 2)
    assert resources_of(pod()).cpus == 1  # at least one CPU
    assert resources_of(pod()).memory_mib is None


def test_the_job_carries_the_pods_identity_and_options() -> None:
    first = pod(
        requests={"cpu": "2", "memory": "512Mi"},
        limits={"nvidia.com/gpu": "2"},
        annotations={
            ANNOTATION_PARTITION: "gpu",
            ANNOTATION_QOS: "high",
            ANNOTATION_TIME_LIMIT: "1:00:00",
            ANNOTATION_EXCLUSIVE: "user",
            "sunk.dev/comment": "inference",
        },
    )
    options = Options(partition="k8s")
    identity = identity_of(first, TENANCY, "the test's tenancy", options)
    spec = job_spec([first], options, SEAL, identity)
    assert spec.user_id == 5000  # the namespace's default user
    assert spec.partition == "gpu"
    assert spec.qos == "high"
    assert spec.time_limit_minutes == 60
    assert spec.sharing == "user"
    assert (spec.cpus_per_task, spec.memory_per_node_mb, spec.tres_per_node) == (
        2,
        512,
        "gres/gpu:2",
    )
    assert spec.comment == SEAL.comment("ns/uid-p", 5000, "inference")
    assert (spec.comment or "").startswith("sunk:ns/uid-p seal=5000:")
    assert (spec.comment or "").endswith(" inference")
    job = Job(job_id=1, comment=spec.comment or "", user_name="u5000", user_id=5000)
    assert SEAL.key_of(job) == job_key("ns", "uid-p", None)
    assert spec.name == "ns/p"


def test_gpu_types_come_from_an_annotation_or_the_product_table() -> None:
    options = Options(gpu_types={"NVIDIA-H100-80GB-HBM3": "h100"})
    gpus = {"nvidia.com/gpu": "4"}
    by_product = job_spec(
        [pod(limits=gpus, selector={GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"})], options, SEAL, ME
    )
    assert by_product.tres_per_node == "gres/gpu:h100:4"
    by_annotation = job_spec(
        [pod(limits=gpus, annotations={ANNOTATION_GPU_TYPE: "a100"})], options, SEAL, ME
    )
    assert by_annotation.tres_per_node == "gres/gpu:a100:4"
    with pytest.raises(InvalidPod, match="no GRES type"):
        job_spec([pod(limits=gpus, selector={GPU_PRODUCT_LABEL: "unknown"})], options, SEAL, ME)


def test_gpus_a_pods_claims_ask_for_go_to_slurm_and_never_beside_nvidia_gpu() -> None:
    """The GPUs of a pod's ResourceClaims (counted by the scheduler, by pod
    uid) are its job's GRES, typed as any GPU pod's; a gang's node asks the
    most of any member; a pod asking both ways is refused."""
    options = Options(gpu_types={"NVIDIA-H100-80GB-HBM3": "h100"})
    one = job_spec([pod()], options, SEAL, ME, claim_gpus={"uid-p": 2})
    assert one.tres_per_node == "gres/gpu:2"
    typed = job_spec(
        [pod(selector={GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"})],
        options,
        SEAL,
        ME,
        claim_gpus={"uid-p": 3},
    )
    assert typed.tres_per_node == "gres/gpu:h100:3"
    gang = job_spec([pod("a"), pod("b")], options, SEAL, ME, Gang("g", 2), claim_gpus={"uid-b": 4})
    assert gang.tres_per_node == "gres/gpu:4"
    assert job_spec([pod()], options, SEAL, ME, claim_gpus={"uid-p": 0}).tres_per_node is None
    with pytest.raises(
        InvalidPod, match=r"both as nvidia\.com/gpu \(1\) and through ResourceClaims \(2\)"
    ):
        job_spec([pod(limits={"nvidia.com/gpu": "1"})], options, SEAL, ME, claim_gpus={"uid-p": 2})


def test_a_grace_period_longer_than_killwait_is_refused() -> None:
    options = Options(kill_wait=30, grace_margin=1)
    job_spec([pod(grace=29)], options, SEAL, ME)
    with pytest.raises(InvalidPod, match="KillWait"):
        job_spec([pod(grace=None)], options, SEAL, ME)  # Kubernetes' default: 30 s


def test_an_unknown_exclusive_mode_is_refused() -> None:
    with pytest.raises(InvalidPod, match="exclusive"):
        job_spec([pod(annotations={ANNOTATION_EXCLUSIVE: "sometimes"})], Options(), SEAL, ME)


def test_gangs_from_sunk_labels_and_leaderworkersets() -> None:
    assert gang_of(pod(labels={GANG_NAME: "g", GANG_SIZE: "3"})) == Gang("g", 3)
    assert gang_of(pod(labels={LWS_NAME: "w", LWS_SIZE: "4"})) == Gang("lws-w-0", 4)
    assert gang_of(pod()) is None
    with pytest.raises(InvalidPod):
        gang_of(pod(labels={GANG_NAME: "g", GANG_SIZE: "zero"}))


INDEXED = {JOB_COMPLETION_INDEX: "0"}


@pytest.mark.parametrize(
    ("meta", "gang"),
    [
        # An indexed Job's pods: the Job that controls them, sized by its spec.
        (
            {"annotations": INDEXED, "owner": job_owner()},
            Gang("job-train", 4, Workload("Job", "train")),
        ),
        # A JobSet's pods (each also an indexed Job's): the whole JobSet.
        (
            {"labels": {JOBSET_NAME: "js"}, "annotations": INDEXED, "owner": job_owner("js-w-0")},
            Gang("jobset-js", 0, Workload("JobSet", "js")),
        ),
        # sunk's own gang wins over the workload's.
        (
            {
                "labels": {GANG_NAME: "g", GANG_SIZE: "2"},
                "annotations": INDEXED,
                "owner": job_owner(),
            },
            Gang("g", 2),
        ),
        # A NonIndexed Job's pods (no index) are placed one by one.
        ({"owner": job_owner()}, None),
        # Only the controlling owner counts.
        ({"annotations": INDEXED, "owner": job_owner(controller=False)}, None),
    ],
)
def test_gangs_of_workloads_are_sized_by_their_spec(
    meta: dict[str, Any], gang: Gang | None
) -> None:
    sizes = {Workload("Job", "train"): 4}
    assert gang_of(pod(**meta), sizes) == gang
    members = [pod(f"m{i}", requests={"cpu": str(i + 1)}) for i in range(3)]
    spec = job_spec(members, Options(), SEAL, ME, Gang("g", 3))
    assert (spec.nodes, spec.tasks, spec.cpus_per_task) == ("3", 3, 3)
    assert spec.comment == SEAL.comment("ns/gang:g", 5000)


def test_pods_stop_before_slurm_ends_their_allocation() -> None:
    pods = [pod(grace=10), pod("q", grace=20)]
    running = Job(job_id=1, job_state=("RUNNING",), end_time=1_000)
    # No time limit: Slurm's end_time (a year out) is no deadline.
    assert time_to_stop(running, pods, now=500) is None
    limited = running.model_copy(update={"time_limit": 10})
    # The longest grace period, and the margin for the removal, before the end.
    assert time_to_stop(limited, pods, now=900) == 80 - STOP_MARGIN
    assert time_to_stop(limited, pods, now=990) == 0
    preempted = running.model_copy(update={"preempt_time": 950})
    assert time_to_stop(preempted, pods, now=950) == 0


def test_a_refused_immediate_allocation_is_nobodys_job() -> None:
    assert refused_allocation(Job(job_id=1, job_state=("FAILED",)))
    assert not refused_allocation(Job(job_id=1, job_state=("FAILED",), nodes="n1"))
    assert not refused_allocation(Job(job_id=1, job_state=("FAILED",), batch_flag=True))
    assert not refused_allocation(Job(job_id=1, job_state=("PENDING",)))


@pytest.mark.parametrize(
    ("namespace", "annotations", "refusal"),
    [
        ("elsewhere", {}, "namespace elsewhere is not served: no tenant in the test's tenancy"),
        ("ns", {"sunk.dev/user-id": "0"}, "sunk.dev/user-id: uid 0 is not granted"),
        ("ns", {"sunk.dev/user-id": "5010"}, "uid 5010 is not granted to namespace ns"),
        ("ns", {"sunk.dev/group-id": "5000"}, "gid 5000 is not granted to namespace ns"),
        ("ns", {"sunk.dev/account": "other"}, "'other' is not granted (granted: none)"),
        ("ns", {ANNOTATION_PARTITION: "debug"}, "'debug' is not granted (granted: k8s, gpu)"),
        ("ns", {ANNOTATION_QOS: "root"}, "sunk.dev/qos: 'root' is not granted"),
    ],
)
def test_a_pod_asks_only_what_its_namespace_is_granted(
    namespace: str, annotations: dict[str, str], refusal: str
) -> None:
    asking = pod(annotations=annotations)
    assert asking.metadata is not None
    asking.metadata.namespace = namespace
    with pytest.raises(InvalidPod, match=re.escape(refusal)):
        identity_of(asking, TENANCY, "the test's tenancy", Options(partition="k8s"))


def test_what_a_pod_does_not_ask_comes_from_its_grant() -> None:
    got = identity_of(pod(), TENANCY, "t", Options(partition="k8s"))
    assert got == Identity(user_id=5000, partition="k8s", qos="high")
    asked = identity_of(pod(annotations={"sunk.dev/user-id": "5009"}), TENANCY, "t", Options())
    assert asked.user_id == 5009


@pytest.mark.parametrize(
    ("meta", "refusal"),
    [
        (
            {"annotations": {GANG_NAME: "a b", GANG_SIZE: "2"}},
            "sunk.dev/gang: 'a b' is not a label",
        ),
        ({"annotations": {GANG_NAME: "é", GANG_SIZE: "2"}}, "sunk.dev/gang: 'é' is not a label"),
        ({"annotations": {GANG_NAME: "x" * 64, GANG_SIZE: "2"}}, "is not a label value"),
        ({"labels": {GANG_NAME: "g", GANG_SIZE: "٣"}}, "must be a positive integer"),
        ({"labels": {LWS_NAME: "w", LWS_SIZE: "2", LWS_GROUP_INDEX: "x"}}, "group index"),
    ],
)
def test_a_gang_name_no_label_could_hold_is_refused_naming_the_rule(
    meta: dict[str, dict[str, str]], refusal: str
) -> None:
    with pytest.raises(InvalidPod, match=re.escape(refusal)):
        gang_of(pod(**meta))


@pytest.mark.parametrize(
    ("annotations", "refusal"),
    [
        ({ANNOTATION_GPU_TYPE: "h100:8,gres/gpu"}, "sunk.dev/gpu-type: 'h100:8,gres/gpu' is not"),
        ({ANNOTATION_COMMENT: "two\nlines"}, "sunk.dev/comment: must be printable text"),
        ({ANNOTATION_COMMENT: "x" * 501}, "at most 500 characters"),
        ({ANNOTATION_TIME_LIMIT: "9999999-00"}, "over Slurm's largest"),
        ({ANNOTATION_TIME_LIMIT: "1 2"}, "invalid time limit"),
    ],
)
def test_an_annotation_that_would_reach_slurm_as_more_than_asked_is_refused(
    annotations: dict[str, str], refusal: str
) -> None:
    with pytest.raises(InvalidPod, match=re.escape(refusal)):
        job_spec(
            [pod(annotations=annotations, limits={"nvidia.com/gpu": "1"})], Options(), SEAL, ME
        )
