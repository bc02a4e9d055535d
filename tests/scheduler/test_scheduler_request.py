"""What a pod asks Slurm for (pure): resources, annotations, gangs, the job's identity."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from sunk.scheduler.controller import _refused_allocation, _time_to_stop
from sunk.scheduler.request import (
    ANNOTATION_EXCLUSIVE,
    ANNOTATION_GPU_TYPE,
    ANNOTATION_PARTITION,
    ANNOTATION_QOS,
    ANNOTATION_TIME_LIMIT,
    GANG_NAME,
    GANG_SIZE,
    GPU_PRODUCT_LABEL,
    LWS_NAME,
    LWS_SIZE,
    Gang,
    InvalidPod,
    Options,
    gang_of,
    job_key,
    job_spec,
    resources_of,
    time_limit_minutes,
)
from sunk.scheduler.seal import JobSeal
from sunk.slurm.models import Job

SEAL = JobSeal(b"k" * 32, "slurm")


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
            },
            "spec": spec,
        },
    )


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
    spec = job_spec(
        [
            pod(
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
        ],
        Options(partition="k8s"),
        SEAL,
    )
    assert spec.partition == "gpu"
    assert spec.qos == "high"
    assert spec.time_limit_minutes == 60
    assert spec.sharing == "user"
    assert (spec.cpus_per_task, spec.memory_per_node_mb, spec.tres_per_node) == (
        2,
        512,
        "gres/gpu:2",
    )
    assert spec.comment == SEAL.comment("ns/uid-p", None, "inference")
    assert (spec.comment or "").startswith("sunk:ns/uid-p seal=@:")
    assert (spec.comment or "").endswith(" inference")
    job = Job(job_id=1, comment=spec.comment or "", user_name="slurm")
    assert SEAL.key_of(job) == job_key("ns", "uid-p", None)
    assert spec.name == "ns/p"


def test_gpu_types_come_from_an_annotation_or_the_product_table() -> None:
    options = Options(gpu_types={"NVIDIA-H100-80GB-HBM3": "h100"})
    gpus = {"nvidia.com/gpu": "4"}
    by_product = job_spec(
        [pod(limits=gpus, selector={GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"})], options, SEAL
    )
    assert by_product.tres_per_node == "gres/gpu:h100:4"
    by_annotation = job_spec(
        [pod(limits=gpus, annotations={ANNOTATION_GPU_TYPE: "a100"})], options, SEAL
    )
    assert by_annotation.tres_per_node == "gres/gpu:a100:4"
    with pytest.raises(InvalidPod, match="no GRES type"):
        job_spec([pod(limits=gpus, selector={GPU_PRODUCT_LABEL: "unknown"})], options, SEAL)


def test_a_grace_period_longer_than_killwait_is_refused() -> None:
    options = Options(kill_wait=30, grace_margin=1)
    job_spec([pod(grace=29)], options, SEAL)
    with pytest.raises(InvalidPod, match="KillWait"):
        job_spec([pod(grace=None)], options, SEAL)  # Kubernetes' default: 30 s


def test_an_unknown_exclusive_mode_is_refused() -> None:
    with pytest.raises(InvalidPod, match="exclusive"):
        job_spec([pod(annotations={ANNOTATION_EXCLUSIVE: "sometimes"})], Options(), SEAL)


def test_gangs_from_sunk_labels_and_leaderworkersets() -> None:
    assert gang_of(pod(labels={GANG_NAME: "g", GANG_SIZE: "3"})) == Gang("g", 3)
    assert gang_of(pod(labels={LWS_NAME: "w", LWS_SIZE: "4"})) == Gang("lws-w-0", 4)
    assert gang_of(pod()) is None
    with pytest.raises(InvalidPod):
        gang_of(pod(labels={GANG_NAME: "g", GANG_SIZE: "zero"}))
    members = [pod(f"m{i}", requests={"cpu": str(i + 1)}) for i in range(3)]
    spec = job_spec(members, Options(), SEAL, Gang("g", 3))
    assert (spec.nodes, spec.tasks, spec.cpus_per_task) == ("3", 3, 3)
    assert spec.comment == SEAL.comment("ns/gang:g", None)


def test_pods_stop_before_slurm_ends_their_allocation() -> None:
    pods = [pod(grace=10), pod("q", grace=20)]
    running = Job(job_id=1, job_state=("RUNNING",), end_time=1_000)
    # No time limit: Slurm's end_time (a year out) is no deadline.
    assert _time_to_stop(running, pods, now=500) is None
    limited = running.model_copy(update={"time_limit": 10})
    assert _time_to_stop(limited, pods, now=900) == 80  # the longest grace before the end
    assert _time_to_stop(limited, pods, now=990) == 0
    preempted = running.model_copy(update={"preempt_time": 950})
    assert _time_to_stop(preempted, pods, now=950) == 0


def test_a_refused_immediate_allocation_is_nobodys_job() -> None:
    assert _refused_allocation(Job(job_id=1, job_state=("FAILED",)))
    assert not _refused_allocation(Job(job_id=1, job_state=("FAILED",), nodes="n1"))
    assert not _refused_allocation(Job(job_id=1, job_state=("FAILED",), batch_flag=True))
    assert not _refused_allocation(Job(job_id=1, job_state=("PENDING",)))
