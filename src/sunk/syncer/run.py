"""`sunk syncer`: the syncer, leader-elected, talking to one Slurm cluster."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import start_http_server

from sunk.component import Election, SlurmAccess, Wiring, run_elected
from sunk.kube.client import kube_client
from sunk.service import run_until_terminated
from sunk.slurm.view import SlurmView
from sunk.syncer.controller import Syncer
from sunk.syncer.metrics import SyncerMetrics
from sunk.syncer.ratelimit import WriteLimits
from sunk.syncer.slurm_adapter import SlurmPortForSyncer


@dataclass(frozen=True)
class SyncerConfig:
    slurm: SlurmAccess  # an Admin, SlurmUser or root: it drains and resumes nodes
    election: Election
    kubeconfig: Path | None = None
    namespace: str | None = None  # where slurmd pods live; None: every namespace
    watched_conditions: Sequence[str] = ()
    lock_effect: str = "NoExecute"
    poll_interval: float = 0.25
    metrics_port: int | None = 9090  # None: no /metrics endpoint
    limits: WriteLimits = field(default_factory=WriteLimits)


async def run_syncer(config: SyncerConfig) -> None:
    metrics = SyncerMetrics()
    if config.metrics_port is not None:
        start_http_server(config.metrics_port, registry=metrics.registry)

    async def lead(wiring: Wiring) -> None:
        async with SlurmView(wiring.slurm, interval=config.poll_interval, watch_jobs=False) as view:
            syncer = Syncer(
                wiring.kube,
                SlurmPortForSyncer(wiring.slurm, view, limits=config.limits),
                watched_conditions=config.watched_conditions,
                lock_effect=config.lock_effect,
                namespace=config.namespace,
                metrics=metrics,
                limits=config.limits,
                lease=(config.election.namespace, config.election.name),
            )
            await syncer.run()

    kube = kube_client(config.kubeconfig, "sunk-syncer")
    await run_elected("sunk-syncer", kube, config.slurm, config.election, lead)


def main(config: SyncerConfig) -> None:
    run_until_terminated(run_syncer(config))
