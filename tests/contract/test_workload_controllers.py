"""The real JobSet and LeaderWorkerSet controllers on real nodes.

Both are built from their Go modules and installed from their own charts
(`sunk_testbed.workloads`); their pods are placed by the default
kube-scheduler here. What the pods carry (labels, annotations, owners) is
printed, since sunk's scheduler will read exactly these.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod

from plugins.nodes import RealNodes
from plugins.slurm_pods import wait_for
from sunk_testbed.control_plane import KubeAccess
from sunk_testbed.helm import Helm, ensure_helm
from sunk_testbed.workloads import (
    JobSet,
    LeaderWorkerSet,
    WorkloadImages,
    ensure_workload_images,
    install_controllers,
    uninstall_controllers,
)

# A cold cache builds both managers first (minutes on two cores).
pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]

REAL = {"sunk.test/node": "real"}
JOBSET = "jobset.sigs.k8s.io/"
LWS = "leaderworkerset.sigs.k8s.io/"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"


def _log(message: str) -> None:
    print(f"[workloads] {message}", file=sys.stderr, flush=True)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def workload_controllers(
    kube: AsyncClient,
    kube_access: KubeAccess,
    kubelet_nodes: RealNodes,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[WorkloadImages]:
    scratch = tmp_path_factory.mktemp("workloads")
    helm = Helm(await asyncio.to_thread(ensure_helm, _log), kube_access.admin_kubeconfig, scratch)
    images = await asyncio.to_thread(ensure_workload_images, _log)
    await install_controllers(helm, kube, images, scratch, _log, node_selector=REAL)
    yield images
    await uninstall_controllers(helm)


@pytest.fixture
def busybox(kubelet_nodes: RealNodes) -> str:
    """What the pods run: the bed's BusyBox image (`sunk/container-test`)."""
    return kubelet_nodes.images.container_test.ref


def _container(image: str, command: str) -> dict[str, Any]:
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", command],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
    }


def _pod_spec(image: str, command: str, **extra: Any) -> dict[str, Any]:
    return {
        "nodeSelector": REAL,
        "terminationGracePeriodSeconds": 1,
        "containers": [_container(image, command)],
        **extra,
    }


def _replicated_job(name: str, replicas: int, parallelism: int, image: str) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": parallelism,
                "completions": parallelism,
                "backoffLimit": 0,
                "template": {"spec": _pod_spec(image, "sleep 2", restartPolicy="Never")},
            }
        },
    }


async def _submit(
    kube: AsyncClient, kind: Any, name: str, namespace: str, spec: dict[str, Any]
) -> None:
    """Create a `kind` (a generic resource of sunk_testbed.workloads) named `name`."""
    await kube.create(kind(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec))


async def _pods(kube: AsyncClient, namespace: str, label: str) -> list[Pod]:
    return [pod async for pod in kube.list(Pod, namespace=namespace, labels={label: None})]


def _owners(obj: Any) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": ref.apiVersion,
            "kind": ref.kind,
            "name": ref.name,
            "controller": ref.controller,
        }
        for ref in obj.metadata.ownerReferences or []
    ]


def _report(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n=== {title}")
    for row in rows:
        print(json.dumps(row, indent=1, sort_keys=True))


def _pod_row(pod: Pod, **more: Any) -> dict[str, Any]:
    assert pod.metadata is not None
    assert pod.spec is not None
    return {
        "pod": pod.metadata.name,
        "node": pod.spec.nodeName,
        "schedulerName": pod.spec.schedulerName,
        "labels": pod.metadata.labels,
        "annotations": pod.metadata.annotations,
        "ownerReferences": _owners(pod),
        **more,
    }


async def test_a_jobset_runs_its_replicated_jobs_to_completion(
    kube: AsyncClient, busybox: str, workload_controllers: WorkloadImages, namespace: str
) -> None:
    jobs = [_replicated_job("driver", 1, 1, busybox), _replicated_job("workers", 2, 2, busybox)]
    await _submit(kube, JobSet, "train", namespace, {"replicatedJobs": jobs})

    async def five_pods() -> bool:
        return len(await _pods(kube, namespace, f"{JOBSET}jobset-name")) == 5

    await wait_for("the JobSet's 5 pods", five_pods, 120)

    async def completed() -> bool:
        got = await kube.get(JobSet, "train", namespace=namespace)
        conditions = (got.status or {}).get("conditions") or []
        return any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)

    await wait_for("the JobSet Completed", completed, 180)

    pods = await _pods(kube, namespace, f"{JOBSET}jobset-name")
    rows = []
    for pod in pods:
        assert pod.metadata is not None
        assert pod.status is not None
        labels, annotations = pod.metadata.labels or {}, pod.metadata.annotations or {}
        assert labels[f"{JOBSET}jobset-name"] == "train"
        assert labels[f"{JOBSET}replicatedjob-name"] in ("driver", "workers")
        replicas = "1" if labels[f"{JOBSET}replicatedjob-name"] == "driver" else "2"
        assert labels[f"{JOBSET}replicatedjob-replicas"] == replicas
        assert JOB_INDEX in annotations
        assert pod.status.phase == "Succeeded"
        (owner,) = pod.metadata.ownerReferences or []
        assert (owner.apiVersion, owner.kind, owner.controller) == ("batch/v1", "Job", True)
        job = await kube.get(Job, owner.name, namespace=namespace)
        assert [(o["apiVersion"], o["kind"], o["name"]) for o in _owners(job)] == [
            ("jobset.x-k8s.io/v1alpha2", "JobSet", "train")
        ]
        assert job.metadata is not None
        rows.append(
            _pod_row(pod, job={"labels": job.metadata.labels, "ownerReferences": _owners(job)})
        )
    by_job = sorted(str(r["labels"].get(f"{JOBSET}replicatedjob-name")) for r in rows)
    assert by_job == ["driver", "workers", "workers", "workers", "workers"]
    _report("JobSet pods (and each one's Job)", rows)


async def test_a_leaderworkerset_makes_a_leader_and_its_workers(
    kube: AsyncClient, busybox: str, workload_controllers: WorkloadImages, namespace: str
) -> None:
    template = {"size": 3, "workerTemplate": {"spec": _pod_spec(busybox, "sleep 3600")}}
    spec = {"replicas": 1, "leaderWorkerTemplate": template}
    await _submit(kube, LeaderWorkerSet, "serve", namespace, spec)

    async def three_running() -> bool:
        pods = await _pods(kube, namespace, f"{LWS}name")
        return len(pods) == 3 and all(p.status and p.status.phase == "Running" for p in pods)

    await wait_for("the LeaderWorkerSet's 3 pods Running", three_running, 180)

    async def group_ready() -> bool:
        got = await kube.get(LeaderWorkerSet, "serve", namespace=namespace)
        return bool((got.status or {}).get("readyReplicas") == 1)

    await wait_for("the LeaderWorkerSet's one group Ready", group_ready, 60)

    rows = []
    for pod in await _pods(kube, namespace, f"{LWS}name"):
        assert pod.metadata is not None
        labels, annotations = pod.metadata.labels or {}, pod.metadata.annotations or {}
        assert labels[f"{LWS}name"] == "serve"
        assert labels[f"{LWS}group-index"] == "0"
        assert annotations[f"{LWS}size"] == "3"
        owners = []
        for ref in pod.metadata.ownerReferences or []:
            if ref.kind == "StatefulSet":
                sts = await kube.get(StatefulSet, ref.name, namespace=namespace)
                owners.append({"statefulSet": ref.name, "ownerReferences": _owners(sts)})
        rows.append(_pod_row(pod, owners=owners))
    names = sorted(str(r["pod"]) for r in rows)
    assert names == ["serve-0", "serve-0-1", "serve-0-2"]
    _report("LeaderWorkerSet pods (and each one's StatefulSet)", rows)
