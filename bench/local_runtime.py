"""Benchmark: 100 slurmd pods on 10 local nodes, until all are Ready and registered in Slurm.

    sudo .venv/bin/python bench/local_runtime.py [--pods 100] [--nodes 10] [--direct]

Starts its own bed in a fresh state directory (control plane, then the local
runtime as `sunk local nodes` in a child process, then a Slurm without static
nodes whose controller address is the runtime's gateway), creates the pods
(placed by the scheduler, or bound directly with --direct), and prints:

- time until every pod is Ready, and until every one is an idle Slurm node;
- `srun -N<pods> hostname`: how many distinct host names answered;
- the runtime process's own CPU time and memory (its containers are separate
  processes and not counted; short-lived helpers it ran - ip, nsenter - are
  shown apart);
- time to delete all pods, and that nothing is left after the runtime stops.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Namespace, Node, Pod, Secret, Service, ServiceAccount
from lightkube.resources.discovery_v1 import EndpointSlice

from sunk.kube.client import pod_ready
from sunk.local import slurmpods
from sunk.local.net import bed_tag, link_names, netns_names
from sunk.local.port import build
from sunk.local.system import pids_rooted_at
from sunk.testbed.kube import KubeControlPlane, async_client
from sunk.testbed.procs import Supervisor
from sunk.testbed.slurm import SlurmAccess, SlurmCluster, ensure_rootfs

TICKS = os.sysconf("SC_CLK_TCK")
NAMESPACE = "bench"


def proc_stats(pid: int) -> dict[str, float]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    status = {
        line.split(":")[0]: line.split(":")[1].strip()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    }
    return {
        "cpu_s": (int(fields[11]) + int(fields[12])) / TICKS,
        "children_cpu_s": (int(fields[13]) + int(fields[14])) / TICKS,
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
        "threads": int(status["Threads"]),
    }


def spawn_nodes(state: Path, count: int, cpu: str, memory: str) -> subprocess.Popen[bytes]:
    """`sunk local nodes` for `count` nodes named bench-N, logging to state/runtime.log."""
    argv = [
        str(Path(sys.executable).parent / "sunk"),
        "local",
        "nodes",
        "--state",
        str(state),
        "--count",
        str(count),
        "--prefix",
        "bench-",
        "--cpu",
        cpu,
        "--memory",
        memory,
    ]
    with (state / "runtime.log").open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def gateway(state: Path) -> str:
    """The runtime's bridge address, where pods reach the bed's slurmctld."""
    network = json.loads((state / "nodes" / "network.json").read_text())
    return str(next(ipaddress.ip_network(network["subnet"]).hosts()))


async def serve_slurm(kube: AsyncClient, namespace: str, slurm: SlurmAccess, address: str) -> None:
    """The namespace, and what slurmd pods need in it: the munge key and slurmctld's Service."""
    await kube.create(build(Namespace, {"metadata": {"name": namespace}}))
    while True:
        try:
            await kube.get(ServiceAccount, "default", namespace=namespace)
            break
        except ApiError:
            await asyncio.sleep(0.1)
    port = slurm.slurmctld_port
    await kube.create(build(Secret, slurmpods.munge_secret(namespace, slurm.munge_key)))
    await kube.create(build(Service, slurmpods.controller_service(namespace, port)))
    await kube.create(
        build(EndpointSlice, slurmpods.controller_endpoints(namespace, address, port))
    )


async def wait_nodes(kube: AsyncClient, names: list[str], limit: float) -> None:
    deadline = time.monotonic() + limit
    while True:
        up = 0
        for name in names:
            try:
                node = await kube.get(Node, name)
            except ApiError:
                continue
            conds = node.status.conditions if node.status else None
            up += any(c.type == "Ready" and c.status == "True" for c in conds or [])
        if up == len(names):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {up}/{len(names)} nodes Ready")
        await asyncio.sleep(0.2)


async def tear_down(
    kube: AsyncClient | None,
    runtime: subprocess.Popen[bytes] | None,
    cluster: SlurmCluster | None,
    supervisor: Supervisor,
) -> None:
    """Stop a benchmark's bed: the client, the node runtime (its pods go with it), Slurm,
    then every other daemon (the control plane)."""
    if kube is not None:
        await kube.close()
    if runtime is not None and runtime.poll() is None:
        runtime.send_signal(signal.SIGTERM)
        runtime.wait(120)
    if cluster is not None:
        await asyncio.to_thread(cluster.stop)
    supervisor.stop_all()


def idle_nodes(cluster: SlurmCluster) -> int:
    out = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=30).stdout
    return sum(1 for line in out.splitlines() if line.split()[1:] == ["idle"])


async def bench(pods: int, nodes: int, direct: bool) -> None:
    state = Path(tempfile.mkdtemp(prefix="sunk-bench-", dir="/tmp"))
    supervisor = Supervisor(state)
    control_plane = KubeControlPlane(state, supervisor, log=lambda m: None)
    cluster: SlurmCluster | None = None
    runtime: subprocess.Popen[bytes] | None = None
    kube: AsyncClient | None = None
    rootfs = ensure_rootfs()
    try:
        t = time.monotonic()
        access = control_plane.start()
        print(f"control plane up in {time.monotonic() - t:.1f}s", flush=True)
        names = [f"bench-{i}" for i in range(1, nodes + 1)]
        t = time.monotonic()
        runtime = spawn_nodes(state, nodes, "16", "32Gi")
        kube = async_client(access.admin_kubeconfig, field_manager="bench")
        await wait_nodes(kube, names, 60)
        print(f"{nodes} nodes Ready in {time.monotonic() - t:.1f}s", flush=True)
        idle = proc_stats(runtime.pid)
        address = gateway(state)
        cluster = SlurmCluster(
            state,
            supervisor,
            rootfs,
            nodes=0,
            controller_address=address,
            extra_conf=["SlurmctldParameters=enable_configless"],
        )
        slurm = await asyncio.to_thread(cluster.start)

        await serve_slurm(kube, NAMESPACE, slurm, address)

        before = proc_stats(runtime.pid)
        started = time.monotonic()
        for i in range(pods):
            node = names[i % nodes] if direct else None
            body = slurmpods.slurmd_pod(
                f"slurmd-{i:03d}", NAMESPACE, slurm.slurmctld_port, node=node
            )
            await kube.create(build(Pod, body))
        created = time.monotonic() - started
        all_ready = all_registered = None
        peak_rss = 0.0
        while all_ready is None or all_registered is None:
            now = time.monotonic() - started
            if now > 600:
                raise TimeoutError("not all pods Ready and registered after 10 min")
            if all_ready is None:
                listed = [p async for p in kube.list(Pod, namespace=NAMESPACE)]
                if sum(map(pod_ready, listed)) == pods:
                    all_ready = time.monotonic() - started
            if all_registered is None and await asyncio.to_thread(idle_nodes, cluster) == pods:
                all_registered = time.monotonic() - started
            peak_rss = max(peak_rss, proc_stats(runtime.pid)["rss_mib"])
            await asyncio.sleep(0.25)
        after = proc_stats(runtime.pid)

        t = time.monotonic()
        srun = await asyncio.to_thread(
            cluster.run, ["srun", f"-N{pods}", "hostname"], check=False, timeout=120
        )
        srun_s = time.monotonic() - t
        distinct = len(set(srun.stdout.split()))

        await asyncio.sleep(10)  # steady state: heartbeats, probes, volume refresh
        steady = proc_stats(runtime.pid)

        t = time.monotonic()
        await kube.deletecollection(Pod, namespace=NAMESPACE)
        for _ in range(3000):
            if not [p async for p in kube.list(Pod, namespace=NAMESPACE)]:
                break
            await asyncio.sleep(0.2)
        deleted_s = time.monotonic() - t

        runtime.send_signal(signal.SIGTERM)
        t = time.monotonic()
        runtime.wait(60)
        stop_s = time.monotonic() - t
        tag = bed_tag(state / "nodes")
        left = (
            len(pids_rooted_at(state / "nodes" / "root"))
            + len(netns_names(f"sk-{tag}-"))
            + len(link_names(f"sk{tag}"))
        )

        mode = "bound directly" if direct else "placed by kube-scheduler"
        print(f"\n{pods} slurmd pods on {nodes} nodes ({mode}), 2 cores:")
        print(f"  pods created (API calls)            {created:6.1f} s")
        print(f"  all pods Ready                      {all_ready:6.1f} s")
        print(f"  all registered idle in Slurm        {all_registered:6.1f} s")
        print(f"  srun -N{pods} hostname                {srun_s:6.1f} s, {distinct} distinct names")
        print(f"  delete all pods (grace honoured)    {deleted_s:6.1f} s")
        print(f"  runtime stop (SIGTERM to exit)      {stop_s:6.1f} s, leftovers: {left}")
        print("runtime process (containers not included):")
        print(f"  cpu idle, {nodes} nodes, 0 pods      {idle['cpu_s']:6.1f} s since start")
        print(f"  cpu to start {pods} pods             {after['cpu_s'] - before['cpu_s']:6.1f} s")
        print(f"  cpu, 10 s steady state              {steady['cpu_s'] - after['cpu_s']:6.2f} s")
        print(f"  helpers run (ip, nsenter, ...)      {steady['children_cpu_s']:6.1f} s cpu")
        print(
            f"  rss idle / with {pods} pods / peak   {idle['rss_mib']:.0f}"
            f" / {steady['rss_mib']:.0f}"
            f" / {max(peak_rss, steady['peak_rss_mib']):.0f} MiB, {steady['threads']} threads"
        )
    finally:
        await tear_down(kube, runtime, cluster, supervisor)
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--direct", action="store_true", help="bind pods to nodes, no scheduler")
    args = parser.parse_args()
    asyncio.run(bench(args.pods, args.nodes, args.direct))


if __name__ == "__main__":
    main()
