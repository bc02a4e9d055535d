"""Benchmark: a NodeSet over N KWOK nodes, with the real Slurm and the controller in-process.

    sudo .venv/bin/python bench/nodeset.py [--nodes 50] [--max-unavailable 10%]

Kubernetes nodes: KWOK (simulated); slurmd: real processes started by the
bench, one per pod (see kwok_bed.py). Starts its own bed in a fresh state
directory (control plane; KWOK with N fake nodes of 2 CPUs and 4 GiB; a Slurm
without static nodes, with a partition over the NodeSet; the slurmd pod
mirror), runs the NodeSet controller in this process with the real Slurm port
(SlurmClient + SlurmView), and prints:

- time from creating the NodeSet to every Slurm node idle (and every pod Ready,
  which the mirror reports once its slurmd accepts connections);
- time for a full rolling update of idle nodes (template change until every
  pod is of the new revision, Ready, and idle and undrained in Slurm);
- this process's CPU time and memory over each phase (the controller is most
  of what runs here; the benchmark's own polling is one `sinfo` subprocess and
  one pod LIST every 0.5 s, every 2 s at 200 nodes), and the peak of Python
  allocations (tracemalloc); KWOK's and the mirror's CPU apart.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

sys.path.insert(0, str(Path(__file__).parent))
from kwok_bed import STAND_INS, kwok_bed, load_average, nodeset_template
from sunk.api import LABEL_NODESET, LABEL_TEMPLATE_HASH
from sunk.api import nodeset as api
from sunk.api.install import install_crds
from sunk.kube.client import pod_ready
from sunk.nodeset.controller import NodeSetController
from sunk.nodeset.slurm_adapter import SlurmPortForNodeSets
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.view import SlurmView
from sunk_testbed.images import DEFAULT_SLURM
from sunk_testbed.slurm_cluster import ROOTFS_SUITES, SlurmCluster

NAMESPACE = "bench"
NAME = "compute"


def slurm_states(cluster: SlurmCluster) -> dict[str, str]:
    out = cluster.run(["sinfo", "-h", "-N", "-p", NAME, "-o", "%N %t"], check=False, timeout=30)
    return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)


def usage() -> tuple[float, float]:
    """(cpu seconds of this process, max RSS MiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime, own.ru_maxrss / 1024


async def wait_settled(
    kube: AsyncClient, cluster: SlurmCluster, count: int, revision: str | None, limit: float
) -> float:
    started = time.monotonic()
    while True:
        pods = [p async for p in kube.list(Pod, namespace=NAMESPACE, labels={LABEL_NODESET: NAME})]
        ready = sum(
            1
            for p in pods
            if pod_ready(p)
            and (
                revision is None
                or ((p.metadata and p.metadata.labels) or {}).get(LABEL_TEMPLATE_HASH) == revision
            )
        )
        if ready == count:
            states = await asyncio.to_thread(slurm_states, cluster)
            if len(states) == count and all(s == "idle" for s in states.values()):
                return time.monotonic() - started
        if time.monotonic() - started > limit:
            raise TimeoutError(f"{ready}/{count} pods ready after {limit}s")
        await asyncio.sleep(max(0.5, count / 100))


async def bench(
    nodes: int, max_unavailable: str, node_grace: str, keep: bool, release: str
) -> None:
    # A benchmark run in the background ignores SIGINT: let SIGTERM clean up too.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    controller_task: asyncio.Task[None] | None = None
    slurm_conf = [
        f"NodeSet={NAME} Feature={NAME}",
        f"PartitionName={NAME} Nodes={NAME} MaxTime=INFINITE State=UP",
    ]
    async with kwok_bed(
        nodes,
        cpu="2",
        memory="4Gi",
        slurm_conf=slurm_conf,
        max_node_count=nodes * 2 + 100,
        namespaces=[NAMESPACE],
        node_grace=node_grace,
        keep=keep,
        slurm_release=release,
    ) as bed:
        kube, cluster, slurm = bed.kube, bed.cluster, bed.slurm
        try:
            await install_crds(kube)
            tracemalloc.start()
            cpu0, _ = usage()
            side0 = {d: bed.stats(d)["cpu_s"] for d in ("kwok", "slurmd-mirror")}
            client = SlurmClient(slurm.restd_url, JwtMinter(FileKey(slurm.jwt_key), "root"))
            view = SlurmView(client, watch_jobs=False)
            await view.start()
            port_ = SlurmPortForNodeSets(client, view)
            controller = NodeSetController(kube, port_, namespace=NAMESPACE)

            controller_task = asyncio.create_task(controller.run())
            NodeSet = api.resource()
            body = {
                "metadata": {"name": NAME, "namespace": NAMESPACE},
                "spec": {
                    "template": nodeset_template("v1"),
                    "updateStrategy": {
                        "type": "RollingUpdate",
                        "rollingUpdate": {"maxUnavailable": max_unavailable},
                    },
                },
            }
            loads = [load_average()]
            t = time.monotonic()
            await kube.create(NodeSet(body))
            await wait_settled(kube, cluster, nodes, None, 900)
            created_s = time.monotonic() - t
            cpu1, rss1 = usage()
            _, heap1 = tracemalloc.get_traced_memory()
            side1 = {d: bed.stats(d)["cpu_s"] for d in side0}
            loads.append(load_average())

            await asyncio.sleep(10)
            cpu2, _ = usage()
            side2 = {d: bed.stats(d)["cpu_s"] for d in side0}

            patch = {"spec": {"template": nodeset_template("v2")}}
            t = time.monotonic()
            await kube.patch(NodeSet, NAME, patch, namespace=NAMESPACE, patch_type=PatchType.MERGE)
            await asyncio.sleep(1)
            obj: Any = await kube.get(NodeSet, NAME, namespace=NAMESPACE)
            revision = obj["status"]["templateHash"]
            await wait_settled(kube, cluster, nodes, revision, 1800)
            rolled_s = time.monotonic() - t
            cpu3, rss3 = usage()
            _, heap3 = tracemalloc.get_traced_memory()
            side3 = {d: bed.stats(d)["cpu_s"] for d in side0}
            loads.append(load_average())

            print(
                f"\nNodeSet over {nodes} KWOK nodes (maxUnavailable {max_unavailable},"
                f" node-monitor-grace-period {node_grace}), 2 cores:"
            )
            print(f"  ({STAND_INS})")
            print(f"  creation → all {nodes} Slurm nodes idle     {created_s:7.1f} s")
            print(f"  full rolling update, idle nodes          {rolled_s:7.1f} s")
            print("controller process (in-process controller + benchmark polling):")
            print(f"  cpu, creation phase                      {cpu1 - cpu0:7.1f} s")
            print(f"  cpu, 10 s steady state                   {cpu2 - cpu1:7.2f} s")
            print(f"  cpu, rolling update                      {cpu3 - cpu2:7.1f} s")
            print(f"  max rss after creation / after update    {rss1:.0f} / {rss3:.0f} MiB")
            print(f"  python heap peak (tracemalloc)           {max(heap1, heap3) / 2**20:.1f} MiB")
            print(f"  slurmrestd requests                      {client.stats!r}")
            print("stand-ins (their own processes), cpu creation / 10 s steady / update:")
            for daemon in side0:
                print(
                    f"  {daemon:40s} {side1[daemon] - side0[daemon]:.1f} /"
                    f" {side2[daemon] - side1[daemon]:.2f} / {side3[daemon] - side2[daemon]:.1f} s"
                )
            print(f"load average before / after creation / after update: {' | '.join(loads)}")
        finally:
            if controller_task is not None:
                controller_task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--max-unavailable", default="10%")
    parser.add_argument(
        "--node-grace",
        default="50s",
        help="kube-controller-manager --node-monitor-grace-period (Kubernetes' default: 50s)",
    )
    parser.add_argument("--log", type=Path, help="write the controller's and Slurm view's log here")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs)")
    parser.add_argument("--slurm", default=DEFAULT_SLURM, choices=sorted(ROOTFS_SUITES))
    args = parser.parse_args()
    if args.log:
        logging.basicConfig(
            filename=args.log, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
        )
    asyncio.run(bench(args.nodes, args.max_unavailable, args.node_grace, args.keep, args.slurm))


if __name__ == "__main__":
    main()
