"""How many pods a JobSet's or an indexed Job's gang has, read from its spec.

Kubernetes puts neither a Job's parallelism nor a JobSet's shape on the pods,
so the scheduler reads the object (`get` in the tenant's namespace, which the
chart grants) and keeps the answer a few seconds: a gang's pods come in a
burst, and each wakes its key.

A gang is all of its pods at once, so a workload that would run its pods in
waves (completions above parallelism) or one Job after another (a JobSet's
`startupPolicyOrder: InOrder`) could never start: it is refused, naming the
field, rather than left waiting for pods that come only after the first ones ran.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.batch_v1 import Job as KubeJob

from sunk.scheduler.request import InvalidPod, Workload

JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")

# How long a size read is kept: a Job's parallelism may change, and the sweep
# looks at every key again within seconds.
SIZE_TTL = 5.0


class WorkloadUnreadable(Exception):
    """The workload could not be read (gone, not yet seen, or not granted)."""


def _count(value: Any, field: str, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidPod(f"{field}: {value!r} is not a count")
    return value


def job_gang_size(spec: Mapping[str, Any], where: str) -> int:
    """Pods a Job runs at once when all its indexes run together: its parallelism
    (default 1), or its completions if fewer; refused when completions exceed it."""
    parallelism = _count(spec.get("parallelism"), f"{where}.parallelism", 1)
    completions = _count(spec.get("completions"), f"{where}.completions", parallelism)
    if completions > parallelism:
        raise InvalidPod(
            f"{where}: completions ({completions}) exceed parallelism ({parallelism}): its "
            "pods would run in waves, and a gang is placed all at once; set parallelism "
            "to completions, or use completionMode NonIndexed for pods placed one by one"
        )
    return min(parallelism, completions)


def jobset_gang_size(spec: Mapping[str, Any], name: str) -> int:
    """Every pod of the JobSet: the sum over its replicated Jobs of replicas times
    each Job's gang size."""
    where = f"JobSet {name}"
    startup = spec.get("startupPolicy") or {}
    if startup.get("startupPolicyOrder") == "InOrder":
        raise InvalidPod(
            f"{where}: spec.startupPolicy.startupPolicyOrder InOrder starts each "
            "replicated Job only once the one before runs, and a gang is placed all at once"
        )
    total = 0
    for index, replicated in enumerate(spec.get("replicatedJobs") or ()):
        field = f"{where}: spec.replicatedJobs[{index}]"
        replicas = _count(replicated.get("replicas"), f"{field}.replicas", 1)
        job_spec = ((replicated.get("template") or {}).get("spec")) or {}
        total += replicas * job_gang_size(job_spec, f"{field}.template.spec")
    if total < 1:
        raise InvalidPod(f"{where}: its replicated Jobs have no pods")
    return total


class WorkloadSizes:
    """Gang sizes of workloads, read from the apiserver and kept SIZE_TTL seconds."""

    def __init__(self, kube: AsyncClient, ttl: float = SIZE_TTL) -> None:
        self._kube = kube
        self._ttl = ttl
        # (namespace, workload) → (until when, its size or why it is refused)
        self._known: dict[tuple[str, Workload], tuple[float, int | str]] = {}

    async def size(self, namespace: str, workload: Workload) -> int:
        """The gang size; InvalidPod if the workload's spec cannot be one gang,
        WorkloadUnreadable if it cannot be read now."""
        now = time.monotonic()
        cached = self._known.get((namespace, workload))
        if cached is None or cached[0] <= now:
            cached = (now + self._ttl, await self._read(namespace, workload))
            self._known = {k: v for k, v in self._known.items() if v[0] > now}
            self._known[(namespace, workload)] = cached
        if isinstance(cached[1], str):
            raise InvalidPod(cached[1])
        return cached[1]

    async def _read(self, namespace: str, workload: Workload) -> int | str:
        try:
            if workload.kind == "JobSet":
                found = await self._kube.get(JobSet, workload.name, namespace=namespace)
                return jobset_gang_size(found.spec or {}, workload.name)
            job = await self._kube.get(KubeJob, workload.name, namespace=namespace)
            spec = job.spec.to_dict() if job.spec is not None else {}
            return job_gang_size(spec, f"Job {workload.name}: spec")
        except InvalidPod as exc:
            return str(exc)
        except ApiError as exc:
            raise WorkloadUnreadable(
                f"cannot read {workload} for its gang's size: {exc.status.message}"
            ) from None
