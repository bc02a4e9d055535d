"""`sunk operator`: the NodeSet controller, leader-elected, talking to one Slurm cluster."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import start_http_server

from sunk.api.install import install_crds
from sunk.component import Election, SlurmAccess, Wiring, run_elected
from sunk.kube.client import kube_client
from sunk.kube.retry import until_answered
from sunk.nodeset.controller import NodeSetController
from sunk.nodeset.metrics import NodeSetMetrics
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
    metrics_port: int | None = 9090  # None: no /metrics endpoint


async def run_operator(config: OperatorConfig) -> None:
    metrics = NodeSetMetrics()
    if config.metrics_port is not None:
        start_http_server(config.metrics_port, registry=metrics.registry)
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
                metrics=metrics,
            )
            await controller.run()

    await run_elected("sunk-operator", kube, config.slurm, config.election, lead)
