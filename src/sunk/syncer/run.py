"""`sunk syncer`: the syncer, leader-elected, talking to one Slurm cluster."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import start_http_server

from sunk.kube.client import kube_client
from sunk.kube.leader import LeaderElector
from sunk.service import run_until_terminated
from sunk.slurm.auth import slurm_credentials
from sunk.slurm.client import SlurmClient
from sunk.slurm.view import SlurmView
from sunk.syncer.controller import Syncer
from sunk.syncer.metrics import SyncerMetrics
from sunk.syncer.ratelimit import WriteLimits


@dataclass(frozen=True)
class SyncerConfig:
    slurmrestd_url: str
    jwt_key_file: Path | None  # mint tokens for slurm_user from the key, or
    jwt_token_file: Path | None  # read the tokens `sunk tokens` mints (one of the two)
    slurm_user: str = "slurm"
    kubeconfig: Path | None = None
    namespace: str | None = None  # where slurmd pods live; None: every namespace
    watched_conditions: Sequence[str] = ()
    lock_effect: str = "NoExecute"
    poll_interval: float = 0.25
    lease_namespace: str = "default"
    lease_name: str = "sunk-syncer"
    identity: str = ""
    metrics_port: int | None = 9090  # None: no /metrics endpoint
    limits: WriteLimits = field(default_factory=WriteLimits)


async def run_syncer(config: SyncerConfig) -> None:
    identity = config.identity or f"{socket.gethostname()}-{os.getpid()}"
    metrics = SyncerMetrics()
    if config.metrics_port is not None:
        start_http_server(config.metrics_port, registry=metrics.registry)
    kube = kube_client(config.kubeconfig, "sunk-syncer")
    credentials = slurm_credentials(config.jwt_key_file, config.jwt_token_file, config.slurm_user)
    async with (
        SlurmClient(config.slurmrestd_url, credentials) as slurm,
        SlurmView(slurm, interval=config.poll_interval, watch_jobs=False) as view,
    ):

        async def lead() -> None:
            syncer = Syncer(
                kube,
                slurm,
                view,
                watched_conditions=config.watched_conditions,
                lock_effect=config.lock_effect,
                namespace=config.namespace,
                metrics=metrics,
                limits=config.limits,
                lease=(config.lease_namespace, config.lease_name),
            )
            await syncer.run()

        elector = LeaderElector(
            kube, namespace=config.lease_namespace, name=config.lease_name, identity=identity
        )
        await elector.run(lead)


def main(config: SyncerConfig) -> None:
    run_until_terminated(run_syncer(config))
