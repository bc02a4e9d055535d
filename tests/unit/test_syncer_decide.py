"""The syncer's decisions: sunk's drains come and go with their cause; nobody else's are touched."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from lightkube.models.core_v1 import PodCondition, PodStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from sunk.api import TAINT_NODE_LOCK
from sunk.syncer.decide import (
    ANNOTATION_SLURM_REASON,
    ANNOTATION_SLURM_STATE,
    CORDON_REASON_ANNOTATION,
    LABEL_SLURM_BUSY,
    LABEL_SLURM_DRAIN,
    NOT_READY_GRACE,
    Drain,
    KubeNodeState,
    Resume,
    SetComment,
    SetTaint,
    SlurmdPodState,
    SlurmState,
    cause,
    decide,
    pod_comment,
    stale,
)
from sunk.syncer.kube_state import pod_state

ADMIN = "bad DIMM, ticket 42"


def node(**kw: Any) -> KubeNodeState:
    return KubeNodeState(**{"name": "n1", "cordoned": False, "ready": True, **kw})


def pod(**kw: Any) -> SlurmdPodState:
    defaults = {"name": "gpu-n1", "ready": True, "terminating": False, "namespace": "hpc"}
    return SlurmdPodState(**{**defaults, "node": "n1", **kw})


def slurm(**kw: Any) -> SlurmState:
    defaults = {
        "name": "gpu-n1",
        "base_state": "IDLE",
        "drained": False,
        "reason": "",
        "responding": True,
        "busy": False,
        "comment": "k8s pod hpc/gpu-n1 on node n1",
    }
    return SlurmState(**{**defaults, **kw})


@pytest.mark.parametrize(
    ("k8s", "p", "expected"),
    [
        (node(cordoned=True), pod(), "sunk/syncer: node cordoned"),
        (
            node(cordoned=True, annotations={CORDON_REASON_ANNOTATION: "replace PSU"}),
            pod(),
            "sunk/syncer: node cordoned: replace PSU",
        ),
        (node(ready=False), pod(), "sunk/syncer: node NotReady"),
        (
            node(bad_conditions={"GPUUnhealthy": "XID 79 on GPU 3"}),
            pod(),
            "sunk/syncer: node condition GPUUnhealthy: XID 79 on GPU 3",
        ),
        (node(), pod(ready=False), "sunk/syncer: slurmd pod gpu-n1 not ready"),
        (node(), pod(ready=False, not_ready_for=2.0), None),  # starting
        (node(), pod(terminating=True), "sunk/syncer: slurmd pod gpu-n1 terminating"),
        (node(), pod(), None),
        (node(), None, None),
    ],
)
def test_causes_and_their_reasons(
    k8s: KubeNodeState, p: SlurmdPodState | None, expected: str | None
) -> None:
    assert cause(k8s, p) == expected


def test_a_cordon_drains_and_an_uncordon_resumes() -> None:
    drained = decide(node(cordoned=True), pod(), slurm())
    assert drained.slurm == [Drain("sunk/syncer: node cordoned")]
    reason = "sunk/syncer: node cordoned"
    resumed = decide(node(), pod(), slurm(drained=True, reason=reason))
    assert resumed.slurm == [Resume(reason)]


def test_a_drain_removed_in_slurm_while_its_cause_lasts_comes_back() -> None:
    reason = "sunk/syncer: node cordoned"
    # The mirror on the node still shows sunk's drain: it was removed in Slurm.
    mirrored = node(cordoned=True, annotations={ANNOTATION_SLURM_REASON: reason})
    assert decide(mirrored, pod(), slurm(drained=False)).slurm == [Drain(reason, put_back=True)]
    # A first drain is not a put-back.
    assert decide(node(cordoned=True), pod(), slurm()).slurm == [Drain(reason)]


def test_our_drain_follows_a_changed_cause() -> None:
    old = "sunk/syncer: node cordoned"
    result = decide(node(ready=False), pod(), slurm(drained=True, reason=old))
    assert result.slurm == [Drain("sunk/syncer: node NotReady")]


@pytest.mark.parametrize("reason", [ADMIN, "sunk/nodeset: replacing the pod for an update"])
def test_drains_made_by_others_are_never_resumed_or_overwritten(reason: str) -> None:
    assert decide(node(), pod(), slurm(drained=True, reason=reason)).slurm == []
    assert decide(node(cordoned=True), pod(), slurm(drained=True, reason=reason)).slurm == []


def test_slurm_state_shows_on_kubernetes_and_origin_is_told_apart() -> None:
    admin = decide(
        node(), pod(), slurm(drained=True, reason=ADMIN, base_state="ALLOCATED", busy=True)
    )
    assert admin.annotations == {
        ANNOTATION_SLURM_STATE: "ALLOCATED+DRAIN",
        ANNOTATION_SLURM_REASON: ADMIN,
    }
    assert admin.labels == {LABEL_SLURM_DRAIN: "true", LABEL_SLURM_BUSY: "true"}
    idle = decide(node(), pod(), slurm())
    assert idle.labels == {LABEL_SLURM_DRAIN: "false", LABEL_SLURM_BUSY: "false"}
    conditions = {c.type: c for c in admin.conditions}
    assert conditions["SlurmDrain"].status == "True"
    assert conditions["SlurmDrain"].reason == "SlurmDrain"  # began in Slurm
    assert conditions["SlurmAllocated"].status == "True"
    ours = decide(
        node(cordoned=True), pod(), slurm(drained=True, reason="sunk/syncer: node cordoned")
    )
    assert {c.type: c for c in ours.conditions}["SlurmDrain"].reason == "SunkDrain"


def test_not_responding_and_down() -> None:
    result = decide(
        node(), pod(), slurm(base_state="DOWN", responding=False, reason="Not responding")
    )
    conditions = {c.type: c.status for c in result.conditions}
    assert conditions["SlurmDown"] == "True"
    assert conditions["SlurmNotResponding"] == "True"
    assert result.annotations[ANNOTATION_SLURM_STATE] == "DOWN+NOT_RESPONDING"


def test_the_node_lock_follows_jobs() -> None:
    assert decide(node(), pod(), slurm(busy=True)).taint == SetTaint(True, "NoExecute")
    locked = node(taints=[(TAINT_NODE_LOCK, "NoExecute")])
    assert decide(locked, pod(), slurm(busy=True)).taint is None
    assert decide(locked, pod(), slurm(busy=False)).taint == SetTaint(False, "NoExecute")
    assert decide(node(), pod(), slurm(busy=True), lock_effect="NoSchedule").taint == SetTaint(
        True, "NoSchedule"
    )


def test_a_node_without_slurm_loses_its_mirror_and_lock() -> None:
    locked = node(taints=[(TAINT_NODE_LOCK, "NoExecute")])
    result = decide(locked, None, None)
    assert result.slurm == []
    assert result.taint == SetTaint(False, "NoExecute")
    assert result.annotations == {ANNOTATION_SLURM_STATE: None, ANNOTATION_SLURM_REASON: None}
    assert result.labels == {LABEL_SLURM_DRAIN: None, LABEL_SLURM_BUSY: None}


def test_the_slurm_comment_names_the_pod() -> None:
    assert pod_comment(pod()) == "k8s pod hpc/gpu-n1 on node n1"
    assert decide(node(), pod(), slurm()).slurm == []
    moved = decide(node(), pod(node="n2"), slurm())
    assert moved.slurm == [SetComment("k8s pod hpc/gpu-n1 on node n2")]


def test_the_mirror_says_whether_it_is_current() -> None:
    fresh = {c.type: c for c in decide(node(), pod(), slurm()).conditions}
    assert fresh["SlurmSynced"].status == "True"
    paused = stale("Slurm cannot be read: connection refused")
    assert paused.slurm == []
    assert paused.taint is None
    assert paused.annotations == {}
    assert [(c.type, c.status, c.reason) for c in paused.conditions] == [
        ("SlurmSynced", "False", "SlurmStale")
    ]


def test_a_starting_slurmd_pod_is_not_drained_before_the_grace_but_rechecked() -> None:
    # slurmd registers before its readiness probe first passes: a drain then
    # would flap every node at every start and update.
    starting = decide(node(), pod(ready=False, not_ready_for=3.0), slurm())
    assert starting.slurm == []
    assert starting.recheck_after == NOT_READY_GRACE - 3.0
    failing = decide(node(), pod(ready=False, not_ready_for=NOT_READY_GRACE), slurm())
    assert failing.slurm == [Drain("sunk/syncer: slurmd pod gpu-n1 not ready")]
    assert decide(node(), pod(), slurm()).recheck_after is None


def test_how_long_a_pod_has_been_not_ready_comes_from_its_ready_condition() -> None:
    now = datetime.datetime(2026, 11, 22, 9, 0, 10, tzinfo=datetime.UTC)
    since = now - datetime.timedelta(seconds=4)
    not_ready = Pod(
        metadata=ObjectMeta(name="gpu-n1", namespace="hpc"),
        status=PodStatus(
            conditions=[PodCondition(type="Ready", status="False", lastTransitionTime=since)]
        ),
    )
    assert pod_state(not_ready, now).not_ready_for == 4.0
    assert pod_state(Pod(metadata=ObjectMeta(name="x")), now).not_ready_for == float("inf")
