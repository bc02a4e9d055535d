"""`sunk operator`: the NodeSet controller, leader-elected, talking to one Slurm cluster."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from sunk.api.install import install_crds
from sunk.component import Election, SlurmAccess, Wiring, run_elected
from sunk.kube.client import kube_client
from sunk.kube.retry import until_answered
from sunk.nodeset.controller import NodeSetController
from sunk.nodeset.slurm_adapter import SlurmPortForNodeSets
from sunk.slurm.view import SlurmView


@dataclass(frozen=True)
class OperatorConfig:
    # Drains and node deletions need an Admin, SlurmUser or root (testbed-notes).
    slurm: SlurmAccess
    election: Election
    kubeconfig: Path | None = None  # None: in-cluster service account
    namespace: str | None = None  # None: every namespace
    install_crds: bool = True
    workers: int = 4


async def run_operator(config: OperatorConfig) -> None:
    kube = kube_client(config.kubeconfig, "sunk-operator")
    if config.install_crds:
        await until_answered(
            "installing the CRDs",
            lambda: install_crds(kube, namespace=config.namespace or "default"),
        )

    async def lead(wiring: Wiring) -> None:
        async with SlurmView(wiring.slurm, watch_jobs=False) as view:
            port = SlurmPortForNodeSets(wiring.slurm, view)
            controller = NodeSetController(
                wiring.kube,
                port,
                namespace=config.namespace,
                workers=config.workers,
                identity=wiring.identity,
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(port.run())
                group.create_task(controller.run())

    await run_elected("sunk-operator", kube, config.slurm, config.election, lead)
