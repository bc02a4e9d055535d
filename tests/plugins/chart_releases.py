"""Both charts as the chart modules install them in a namespace of their own,
and everything they leave taken away again (the session's nodes are shared)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Namespace, PersistentVolume, Pod

from plugins.slurm_pods import NodeState, restore_nodes
from sunk_testbed import charts
from sunk_testbed.helm import Helm, HelmError

CLUSTER_RELEASE = "sunk"


async def install_both(
    helm: Helm,
    kube: AsyncClient,
    namespace: str,
    state: Path,
    cluster_values: Mapping[str, Any],
    release: str,
    values: Mapping[str, Any],
) -> None:
    """sunk-cluster, then the slurm chart as `release`; values files in `state`."""
    await charts.install(
        helm,
        kube,
        CLUSTER_RELEASE,
        "sunk-cluster",
        namespace,
        cluster_values,
        values_file=state / "cluster-values.yaml",
    )
    await charts.install(
        helm, kube, release, "slurm", namespace, values, values_file=state / "values.yaml"
    )


async def remove_both(
    helm: Helm,
    kube: AsyncClient,
    namespace: str,
    release: str,
    state: Path,
    nodes_before: Mapping[str, NodeState],
    volumes: Sequence[str] = (),
) -> None:
    """Both releases, the namespace, the volumes (`apply_volumes`' and `volumes`)
    and the state directory gone; the nodes as they were."""
    for name in (release, CLUSTER_RELEASE):
        with contextlib.suppress(HelmError):
            await asyncio.to_thread(helm.uninstall, name, namespace)
    with contextlib.suppress(Exception):
        await kube.deletecollection(Pod, namespace=namespace, grace_period=0)
    with contextlib.suppress(Exception):
        await kube.delete(Namespace, namespace)
    for pv in [*volumes, *(f"{charts.STORAGE_CLASS}-{i}" for i in range(1, 5))]:
        with contextlib.suppress(Exception):
            await kube.delete(PersistentVolume, pv)
    await restore_nodes(kube, nodes_before)
    shutil.rmtree(state, ignore_errors=True)
