"""`sunk operator`: the NodeSet controller, leader-elected, talking to one Slurm cluster,
and beside it (same Lease) the topology and gres controllers when their ConfigMaps are named."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import start_http_server

from sunk.api.install import install_crds
from sunk.component import Election, SlurmAccess, Wiring, run_elected
from sunk.gres.controller import GresController, GresMetrics
from sunk.kube.client import kube_client
from sunk.kube.retry import until_answered
from sunk.nodeset.controller import NodeSetController
from sunk.nodeset.metrics import NodeSetMetrics
from sunk.nodeset.slurm_adapter import SlurmPortForNodeSets
from sunk.slurm.view import SlurmView
from sunk.topology.controller import TopologyController, slurm_node_names
from sunk.topology.metrics import TopologyMetrics


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
    # The slurm chart's topology ConfigMap (namespace, name); None: no topology controller.
    topology_configmap: tuple[str, str] | None = None
    # The slurm chart's gres ConfigMap (namespace, name); None: no gres controller.
    gres_configmap: tuple[str, str] | None = None


async def run_operator(config: OperatorConfig) -> None:
    metrics = NodeSetMetrics()
    topology_metrics = TopologyMetrics(metrics.registry)
    gres_metrics = GresMetrics(metrics.registry)
    if config.metrics_port is not None:
        start_http_server(config.metrics_port, registry=metrics.registry)
    kube = kube_client(config.kubeconfig, "sunk-operator")
    if config.install_crds:
        await until_answered(
            "installing the CRDs",
            lambda: install_crds(kube, namespace=config.namespace or "default"),
        )

    async def lead(wiring: Wiring) -> None:
        # One view of Slurm's nodes for both: the topology controller asks it
        # which nodes Slurm still has.
        async with SlurmView(wiring.slurm, watch_jobs=False) as view, asyncio.TaskGroup() as group:
            gres: GresController | None = None
            controller = NodeSetController(
                wiring.kube,
                SlurmPortForNodeSets(wiring.slurm, view),
                namespace=config.namespace,
                workers=config.workers,
                identity=wiring.identity,
                metrics=metrics,
                gres_listed=lambda: gres.listed() if gres is not None else None,
            )
            # The NodeSet controller's Node and pod caches serve all three.
            nodes, pods = controller.node_cache, controller.pod_cache
            if config.topology_configmap is not None:
                namespace, name = config.topology_configmap
                topology = TopologyController(
                    wiring.kube,
                    namespace=namespace,
                    configmap=name,
                    identity=wiring.identity,
                    metrics=topology_metrics,
                    slurm_nodes=slurm_node_names(view),
                    nodes=nodes,
                    pods=pods,
                )
                group.create_task(topology.run())
            if config.gres_configmap is not None:
                namespace, name = config.gres_configmap
                gres = GresController(
                    wiring.kube,
                    namespace=namespace,
                    configmap=name,
                    identity=wiring.identity,
                    metrics=gres_metrics,
                    nodes=nodes,
                    pods=pods,
                )
                group.create_task(gres.run())
            group.create_task(controller.run())

    await run_elected("sunk-operator", kube, config.slurm, config.election, lead)
