"""The JobSet and LeaderWorkerSet controllers, real, on a running bed.

Both are built here from their official Go modules (`testbed/workloads/build.sh`:
`sigs.k8s.io/jobset`, `sigs.k8s.io/lws`, at the versions below) into a cache
directory keyed by the versions, together with each module's own Helm chart
copied out of Go's read-only module cache. Their images (`sunk/jobset`,
`sunk/lws`: a scratch image around the one static manager, as the projects'
own distroless images are) are built by `sunk_testbed.images` only when a
caller asks for them, and cached from then on.

`install_controllers` installs both charts with helm, as shipped, pointed at
the bed's registry, and returns once each controller is Ready and its
admission webhooks answer. Both manage their webhooks' certificates
themselves (open-policy-agent's cert-controller): no cert-manager. The
bed's apiserver calls webhooks at their pods' addresses
(`--enable-aggregator-routing`, `sunk_testbed.control_plane`), since the host
has no route to a Service's ClusterIP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment

from sunk_testbed import charts
from sunk_testbed.control_plane import ensure_built
from sunk_testbed.helm import Helm
from sunk_testbed.images import Image, ensure_images
from sunk_testbed.paths import SCRIPTS, cache_dir

Log = Callable[[str], None]

JOBSET_VERSION = "v0.10.1"
LWS_VERSION = "v0.7.0"
# Bumped whenever testbed/workloads/build.sh changes what it produces.
WORKLOADS_BUILD_REVISION = 1

# Release (the chart's name) and namespace of each, as their projects install them.
NAMESPACES = {"jobset": "jobset-system", "lws": "lws-system"}

JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
LeaderWorkerSet = create_namespaced_resource(
    "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"
)


def workload_binaries_dir() -> Path:
    name = f"jobset-{JOBSET_VERSION}-lws-{LWS_VERSION}-r{WORKLOADS_BUILD_REVISION}"
    return cache_dir() / "workloads" / name


def ensure_workload_binaries(log: Log) -> Path:
    """The managers `jobset` and `lws` and their charts (`charts/jobset`,
    `charts/lws`), built into the cache unless a finished build is there."""
    out = workload_binaries_dir()
    script = [str(SCRIPTS / "workloads" / "build.sh"), str(out), JOBSET_VERSION, LWS_VERSION]
    return ensure_built(
        out, script, f"the JobSet {JOBSET_VERSION} and LWS {LWS_VERSION} managers", log
    )


@dataclass(frozen=True)
class WorkloadImages:
    jobset: Image
    lws: Image


def ensure_workload_images(log: Log) -> WorkloadImages:
    """`sunk/jobset` and `sunk/lws` in the registry storage (built the first
    time, a cache hit after)."""
    built = ensure_images(log, workloads=ensure_workload_binaries(log))
    if built.jobset is None or built.lws is None:
        raise RuntimeError("ensure_images made no JobSet or LWS image")
    return WorkloadImages(built.jobset, built.lws)


@dataclass(frozen=True)
class Controller:
    """One controller as installed: its chart's release, namespace and values."""

    name: str  # "jobset": the chart, the release and the image's name
    namespace: str
    values: dict[str, Any]
    probe: dict[str, Any]  # apiVersion, kind, spec: what a dry run sends through its webhooks


# The charts ask for 0.5 (JobSet) and 1 CPU and 1 GiB (LWS): the bed has two
# cores in all.
_RESOURCES = {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}

_PROBE_CONTAINER = {"name": "probe", "image": "registry.sunk.test/none:probe"}


def controllers(
    images: WorkloadImages, node_selector: Mapping[str, str] | None = None
) -> list[Controller]:
    """Both controllers' releases; `node_selector` keeps their pods on those nodes."""
    selector = dict(node_selector or {})
    jobset = Controller(
        "jobset",
        NAMESPACES["jobset"],
        {
            "image": charts.image_values(images.jobset),
            "controller": {"resources": _RESOURCES, "nodeSelector": selector},
        },
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "probe",
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [_PROBE_CONTAINER],
                                    }
                                }
                            }
                        },
                    }
                ]
            },
        },
    )
    lws = Controller(
        "lws",
        NAMESPACES["lws"],
        {
            "image": {"manager": charts.image_values(images.lws)},
            "resources": _RESOURCES,
            "nodeSelector": selector,
        },
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "spec": {
                "leaderWorkerTemplate": {
                    "size": 1,
                    "workerTemplate": {"spec": {"containers": [_PROBE_CONTAINER]}},
                }
            },
        },
    )
    return [jobset, lws]


async def install_controllers(
    helm: Helm,
    kube: AsyncClient,
    images: WorkloadImages,
    values_dir: Path,
    log: Log,
    *,
    node_selector: Mapping[str, str] | None = None,
    within: float = 240,
) -> None:
    """Install (or upgrade) both controllers from their modules' charts and
    wait until each one's Deployment is Ready and its webhooks answer;
    idempotent. `values_dir` keeps the values files."""
    chart_dir = workload_binaries_dir() / "charts"
    await asyncio.to_thread(values_dir.mkdir, parents=True, exist_ok=True)
    for controller in controllers(images, node_selector):
        started = time.monotonic()
        await charts.install(
            helm,
            kube,
            controller.name,
            chart_dir / controller.name,
            controller.namespace,
            controller.values,
            values_file=values_dir / f"{controller.name}-values.yaml",
        )
        await _wait_ready(kube, controller, within)
        log(
            f"{controller.name} ready, its webhooks answering, in {time.monotonic() - started:.1f}s"
        )


async def _wait_ready(kube: AsyncClient, controller: Controller, within: float) -> None:
    async def deployed() -> bool:
        found = [d async for d in kube.list(Deployment, namespace=controller.namespace)]
        return bool(found) and all(
            d.status is not None and (d.status.readyReplicas or 0) >= (d.spec.replicas or 1)
            for d in found
            if d.spec is not None
        )

    last_error = ["(none yet)"]

    async def webhooks_answer() -> bool:
        # A server-side dry run goes through the kind's mutating and
        # validating webhooks (failurePolicy Fail): it passes only once the
        # apiserver reaches the manager at its pod's address and trusts the
        # certificate its cert-controller made.
        metadata = {"name": "webhook-probe", "namespace": controller.namespace}
        probe: Any = codecs.from_dict({**controller.probe, "metadata": metadata})
        try:
            await kube.create(probe, dry_run=True)
        except ApiError as error:
            last_error[0] = error.status.message or str(error)
            return False
        return True

    try:
        await charts.wait_until(f"{controller.name}'s Deployment Ready", deployed, within, 1)
        await charts.wait_until(f"{controller.name}'s webhooks", webhooks_answer, within, 1)
    except TimeoutError as timed_out:
        pods = await charts.unready_pods(kube, controller.namespace)
        raise TimeoutError(
            f"{timed_out}; last answer: {last_error[0]}\npods of {controller.namespace}:\n{pods}"
        ) from None


async def uninstall_controllers(helm: Helm) -> None:
    """Both releases gone. JobSet's CRD stays (helm never deletes a chart's
    `crds/`); LWS's goes, with every LeaderWorkerSet (its chart templates it)."""
    for name, namespace in NAMESPACES.items():
        await asyncio.to_thread(helm.uninstall, name, namespace)
