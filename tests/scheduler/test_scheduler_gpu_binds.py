"""One GPU pod at a time per node until the kubelet admits it (pure): which
pods a GPU bind waits for."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from sunk.api import CONDITION_SLURM_GPUS
from sunk.scheduler.gpu_binds import awaiting_admission, blocking

pytestmark = pytest.mark.unit

T = "2026-11-29T01:00:00Z"
GPUS = {"type": CONDITION_SLURM_GPUS, "status": "True", "reason": "AllocatedBySlurm"}


def pod(name: str = "p", **status: Any) -> Pod:
    node = status.pop("node", "kn-1")
    deleting = status.pop("deleting", False)
    gpus = status.pop("gpus", "0,1")
    conditions = [{**GPUS, "message": gpus}] if gpus else []
    return Pod.from_dict(
        {
            "metadata": {
                "name": name,
                "namespace": "team",
                **({"deletionTimestamp": T} if deleting else {}),
            },
            "spec": {"containers": [{"name": "main"}], **({"nodeName": node} if node else {})},
            "status": {"phase": "Pending", "conditions": conditions, **status},
        }
    )


@pytest.mark.parametrize(
    ("given", "waiting"),
    [
        (pod(), True),  # bound with GPUs, not admitted yet
        (pod(startTime=T), False),  # the kubelet admitted it: devices allocated
        (pod(phase="Failed"), False),  # refused at admission
        (pod(phase="Running", startTime=T), False),
        (pod(deleting=True), False),
        (pod(node=None), False),  # not bound: the kubelet has not seen it
        (pod(gpus=None), False),  # no GPUs from Slurm
        (pod(gpus="x"), False),  # no GPUs the plugin would read
    ],
)
def test_a_pod_awaits_admission_while_bound_with_gpus_and_not_started(
    given: Pod, waiting: bool
) -> None:
    assert awaiting_admission(given) is waiting


def test_a_gpu_bind_waits_for_every_pod_not_admitted_yet_and_for_its_own_binds() -> None:
    node_pods = [pod("a"), pod("b", startTime=T), pod("c", phase="Failed")]
    assert blocking(node_pods, []) == ["a"]
    # A pod this process bound a moment ago, which its cache shows unbound.
    assert blocking([pod("b", startTime=T)], ["d"]) == ["d"]
    assert blocking([pod("b", startTime=T)], []) == []
    assert blocking([], []) == []
