"""`sunk operator`: the NodeSet controller, leader-elected, talking to one Slurm cluster."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from sunk.api.install import install_crds
from sunk.kube.client import kube_client
from sunk.kube.leader import LeaderElector
from sunk.kube.retry import until_answered
from sunk.nodeset.controller import NodeSetController
from sunk.nodeset.slurm_adapter import SlurmPortForNodeSets
from sunk.slurm.auth import slurm_credentials
from sunk.slurm.client import SlurmClient
from sunk.slurm.view import SlurmView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorConfig:
    slurmrestd_url: str
    jwt_key_file: Path | None  # mint tokens for slurm_user from the key, or
    jwt_token_file: Path | None  # read the tokens `sunk tokens` mints (one of the two)
    # Drains and node deletions need SlurmUser or root (testbed-notes).
    slurm_user: str = "slurm"
    kubeconfig: Path | None = None  # None: in-cluster service account
    namespace: str | None = None  # None: every namespace
    lease_namespace: str = "default"
    lease_name: str = "sunk-operator"
    identity: str = ""
    install_crds: bool = True
    workers: int = 4


async def run_operator(config: OperatorConfig) -> None:
    identity = config.identity or f"{socket.gethostname()}-{os.getpid()}"
    kube = kube_client(config.kubeconfig, "sunk-operator")
    credentials = slurm_credentials(config.jwt_key_file, config.jwt_token_file, config.slurm_user)
    async with SlurmClient(config.slurmrestd_url, credentials) as slurm:
        view = SlurmView(slurm, watch_jobs=False)
        async with view:
            port = SlurmPortForNodeSets(slurm, view)
            if config.install_crds:
                await until_answered(
                    "installing the CRDs",
                    lambda: install_crds(kube, namespace=config.namespace or "default"),
                )

            async def lead() -> None:
                controller = NodeSetController(
                    kube,
                    port,
                    namespace=config.namespace,
                    workers=config.workers,
                    identity=identity,
                )
                async with asyncio.TaskGroup() as group:
                    group.create_task(port.run())
                    group.create_task(controller.run())

            elector = LeaderElector(
                kube,
                namespace=config.lease_namespace,
                name=config.lease_name,
                identity=identity,
            )
            log.info("sunk operator %s waiting to lead", identity)
            await elector.run(lead)
