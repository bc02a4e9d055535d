"""`sunk scheduler`: the scheduler, leader-elected, placing pods through one Slurm cluster."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret
from prometheus_client import start_http_server

from sunk.component import Election, SlurmAccess, Wiring, run_elected
from sunk.kube.client import kube_client
from sunk.kube.retry import until_answered
from sunk.scheduler.claims import GpuClass
from sunk.scheduler.controller import Scheduler
from sunk.scheduler.kill_wait_watch import KillWaitWatch
from sunk.scheduler.metrics import SchedulerMetrics
from sunk.scheduler.request import SCHEDULER_NAME, Options
from sunk.scheduler.seal import JobSeal, new_secret
from sunk.scheduler.slurm_adapter import SlurmPortForScheduler
from sunk.scheduler.tenancy_watch import TenancyWatch
from sunk.service import run_until_terminated
from sunk.slurm.auth import tenant_credentials
from sunk.slurm.view import SlurmView

log = logging.getLogger(__name__)

SEAL_KEY = "seal"
# Full job listings grow with the queue (seconds at thousands of jobs on a
# loaded slurmrestd): a slow read is not an outage.
VIEW_STALE_AFTER = 15.0
# At most this share of the time goes to reading the job list while it changes.
READ_SHARE = 0.1
# Between list reads, jobs' starts and ends come from a state probe; the list
# (a preemption's preempt_time, a pending job's reason) is read at least this often.
DETAIL_EVERY = 1.0


@dataclass(frozen=True)
class SchedulerConfig:
    slurm: SlurmAccess  # its own user only reads jobs and nodes
    # The Lease; its namespace also holds the seal Secret and the tenancy ConfigMap.
    election: Election
    # The tokens `sunk tokens` keeps for each granted uid (a mounted Secret); without
    # it, they are minted from the Slurm access's key file.
    tenant_tokens_dir: Path | None = None
    kubeconfig: Path | None = None
    scheduler_name: str = SCHEDULER_NAME
    namespace: str | None = None  # pods of one namespace; None: every namespace
    slurmd_namespace: str | None = None  # where NodeSet pods live; None: every namespace
    partition: str | None = None
    constraint: str | None = None
    gpu_types: Mapping[str, str] = field(default_factory=dict)
    # DeviceClass → what the scheduler needs to allocate its claims (sunk.scheduler.claims).
    gpu_classes: Mapping[str, GpuClass] = field(default_factory=dict)
    kill_wait: int = 30  # unless slurm_config is given
    # (namespace, name) of the ConfigMap with slurm.conf: KillWait from there, followed.
    slurm_config: tuple[str, str] | None = None
    grace_margin: int = 1
    poll_interval: float = 0.25
    metrics_port: int | None = 9090  # None: no /metrics endpoint
    # The Secret (in the Lease's namespace) with the job seal's secret; made on first start.
    seal_secret_name: str = "sunk-scheduler-seal"  # noqa: S105 - a name, not a secret
    # The ConfigMap (in the Lease's namespace) with the tenancy, key `tenancy.yaml`.
    tenancy_configmap: str = "sunk-scheduler-tenancy"


async def job_seal_secret(kube: AsyncClient, namespace: str, name: str) -> bytes:
    """The seal's secret from its Secret, created (immutable) on the first start.

    Made here rather than by the chart: a chart that generates keys makes a new
    one on every `helm template` (so every GitOps sync), and a new secret would
    disown every job already sealed. It outlives `helm uninstall` on purpose, so
    a reinstall still knows the jobs of running pods."""
    try:
        secret = await kube.get(Secret, name, namespace=namespace)
    except ApiError as error:
        if error.status.code != 404:
            raise
        fresh = Secret(
            metadata=ObjectMeta(name=name, namespace=namespace),
            data={SEAL_KEY: base64.b64encode(new_secret()).decode()},
            immutable=True,
        )
        try:
            secret = await kube.create(fresh)
        except ApiError as raced:
            if raced.status.code != 409:  # another replica made it first
                raise
            secret = await kube.get(Secret, name, namespace=namespace)
    encoded = (secret.data or {}).get(SEAL_KEY)
    if not encoded:
        raise ValueError(f"Secret {namespace}/{name} has no {SEAL_KEY!r}")
    return base64.b64decode(encoded)


async def run_scheduler(config: SchedulerConfig) -> None:
    metrics = SchedulerMetrics()
    if config.metrics_port is not None:
        start_http_server(config.metrics_port, registry=metrics.registry)
    tenants = tenant_credentials(config.slurm.jwt_key_file, config.tenant_tokens_dir)
    options = Options(
        partition=config.partition,
        constraint=config.constraint,
        gpu_types=dict(config.gpu_types),
        gpu_classes=dict(config.gpu_classes),
        kill_wait=config.kill_wait,
        grace_margin=config.grace_margin,
    )
    home = config.election.namespace
    kube = kube_client(config.kubeconfig, config.scheduler_name)
    secret = await until_answered(
        "reading the job seal's Secret",
        lambda: job_seal_secret(kube, home, config.seal_secret_name),
    )
    seal = JobSeal(secret, config.slurm.user)

    async def lead(wiring: Wiring) -> None:
        async with SlurmView(
            wiring.slurm,
            interval=config.poll_interval,
            stale_after=VIEW_STALE_AFTER,
            watch_nodes=False,  # Slurm nodes come from the NodeSet pods
            # A burst of pods changes jobs on every poll: reading them all must not
            # starve the allocations (the pods bound at once do not need the view).
            read_share=READ_SHARE,
            job_probe=True,
            detail_every=DETAIL_EVERY,
        ) as view:
            tenancy = TenancyWatch(wiring.kube, home, config.tenancy_configmap)
            port = SlurmPortForScheduler(wiring.slurm, view, tenants)
            scheduler = Scheduler(
                wiring.kube,
                port,
                seal=seal,
                tenancy=tenancy.current,
                tenancy_source=tenancy.source,
                options=options,
                scheduler_name=config.scheduler_name,
                namespace=config.namespace,
                slurmd_namespace=config.slurmd_namespace,
                metrics=metrics,
            )
            tenancy.on_change = scheduler.tenancy_changed
            async with asyncio.TaskGroup() as group:
                group.create_task(tenancy.run())
                await tenancy.ready.wait()  # no pod is refused for a tenancy not yet read
                if config.slurm_config is not None:
                    kill_wait = KillWaitWatch(
                        wiring.kube, *config.slurm_config, on_change=scheduler.kill_wait_changed
                    )
                    group.create_task(kill_wait.run())
                    await kill_wait.ready.wait()  # nor for a KillWait not yet read
                group.create_task(scheduler.run())

    await run_elected(config.scheduler_name, kube, config.slurm, config.election, lead)


def main(config: SchedulerConfig) -> None:
    run_until_terminated(run_scheduler(config))
