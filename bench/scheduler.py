"""Benchmark: create→bound latency and throughput, sunk's scheduler against kube-scheduler.

    sudo .venv/bin/python bench/scheduler.py [--nodes 10] [--bursts 100,1000] [--slurm-conf LINE]
        [--slurm 26.05|24.11] [--pods policy|plain|tolerant]

One run, one bed (fresh state directory). Kubernetes nodes: KWOK (simulated);
slurmd: real processes started by the bench, one per pod (see kwok_bed.py).
The real control plane (its stock kube-scheduler included), `sunk scheduler`
as a process of its own, KWOK with N fake nodes (1,000 CPUs each for
Kubernetes, so a thousand one-CPU pods fit), and a real Slurm whose N dynamic
nodes `tb1`… are slurmd processes that the bench's pod mirror starts for N
NodeSet-style slurmd pods (pod `tbK` on KWOK node `bench-K`: the mapping the
scheduler reads), in a partition with `OverSubscribe=FORCE` so that 1,000
one-CPU placeholder jobs fit on a few 2-CPU nodes. KWOK marks bound pods
Running (no container runs: this measures placement, not pod start-up).

For each burst size, and for each scheduler in turn, the burst's pods (1 CPU;
with `--pods policy`, the default, no toleration, as most pods are, and the
chart's MutatingAdmissionPolicy installed, which adds the node lock's at
creation, as the chart does on Kubernetes 1.36+; `plain`: no toleration and
no policy, so sunk PATCHes each pod with it, as on older clusters; `tolerant`:
pods that tolerate every taint, so sunk has no toleration to add, the
bench's pods before session 21) are created by 16 concurrent clients; a watch
records when each pod's `spec.nodeName` appears. Printed per burst:
create→bound p50 / p99 (from just before the create call) and pods/s (pods
over first create to last bound), and sunk / kube-scheduler throughput.
Between bursts the pods are deleted and, for sunk, every job is left to end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import httpx2
import yaml
from lightkube import AsyncClient, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Pod

sys.path.insert(0, str(Path(__file__).parent))
from kwok_bed import (
    STAND_INS,
    apiserver_requests,
    cpu_by_command,
    cpu_spent,
    kwok_bed,
    load_average,
    proc_stats,
    requests_made,
    slurmd_pod,
    wait_until,
)
from sunk.api import TAINT_NODE_LOCK
from sunk.scheduler.request import SCHEDULER_NAME
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk_testbed.helm import CHARTS, Helm, ensure_helm
from sunk_testbed.images import DEFAULT_SLURM
from sunk_testbed.procs import free_port
from sunk_testbed.slurm_cluster import ROOTFS_SUITES, SlurmCluster
from sunk_testbed.slurmpods import owned, standing_nodeset

NAMESPACE = "bench"
NODESET_NAMESPACE = "bench-nodeset"
PARTITION = "bench"
CREATORS = 16
# How long the scheduler process gets to start: its 5 s settle before submitting, and more.
SETTLE = 10.0


def slurm_nodes_idle(cluster: SlurmCluster, count: int) -> bool:
    out = cluster.run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t"], check=False).stdout
    return sum(1 for line in out.splitlines() if line.split()[1:] == ["idle"]) == count


def bench_pod(name: str, scheduler: str | None, tolerant: bool) -> Pod:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "tolerations": [{"operator": "Exists"}] if tolerant else [],
        "containers": [
            {
                "name": "main",
                "image": "slurm",
                "command": ["sleep", "3600"],
                # No memory: the bed's static Slurm nodes have RealMemory=1 (unset).
                "resources": {"requests": {"cpu": "1"}},
            }
        ],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    pod = Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench": "1"}},
            "spec": spec,
        }
    )
    assert isinstance(pod, Pod)
    return pod


async def burst(
    kube: AsyncClient, prefix: str, count: int, scheduler: str | None, tolerant: bool
) -> dict[str, float]:
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    done = asyncio.Event()

    async def watch() -> None:
        async for _, pod in kube.watch(Pod, namespace=NAMESPACE, labels={"bench": "1"}):
            name = pod.metadata.name if pod.metadata else ""
            if name and name.startswith(prefix) and pod.spec and pod.spec.nodeName:
                bound.setdefault(name, time.monotonic())
                if len(bound) == count:
                    done.set()

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.5)  # the watch is open
    names = [f"{prefix}-{i:04d}" for i in range(count)]
    queue = list(reversed(names))

    async def creator() -> None:
        while queue:
            name = queue.pop()
            created[name] = time.monotonic()
            await kube.create(bench_pod(name, scheduler, tolerant))
            logging.getLogger("bench").info("created %s", name)

    await asyncio.gather(*(creator() for _ in range(CREATORS)))
    try:
        await asyncio.wait_for(done.wait(), 300)
    except TimeoutError:
        raise TimeoutError(f"{len(bound)} of {count} pods bound after 300 s") from None
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    latencies = sorted(bound[n] - created[n] for n in names)
    span = max(bound.values()) - min(created.values())
    return {
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "rate": count / span,
        "span": span,
    }


async def clear(kube: AsyncClient) -> None:
    while True:
        if not [p async for p in kube.list(Pod, namespace=NAMESPACE)]:
            return
        # A thousand deletions can outlast the client's timeout: delete what is left.
        with contextlib.suppress(httpx2.TimeoutException):
            await kube.deletecollection(Pod, namespace=NAMESPACE, grace_period=0)
        await asyncio.sleep(0.5)


async def scheduler_metrics(port: int, name: str) -> list[str]:
    """The lines of the scheduler's /metrics that start with `name`."""
    async with httpx2.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return [line for line in text.splitlines() if line.startswith(name)]


async def jobs_by_kind(port: int) -> str:
    """The scheduler's own count of allocations and queued placeholders."""
    return (
        ", ".join(await scheduler_metrics(port, "sunk_scheduler_jobs_total")) or "no jobs counted"
    )


async def metric_value(port: int, name: str) -> float:
    """One unlabelled series of the scheduler's /metrics."""
    line = (await scheduler_metrics(port, f"{name} "))[0]
    return float(line.split()[1])


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def profile(pid: int, name: str) -> subprocess.Popen[bytes] | None:
    """With BENCH_PYSPY=<py-spy binary> and BENCH_PROFILE_DIR=<dir>: sample the
    scheduler while it places a burst (py-spy's raw collapsed stacks, <dir>/<name>.txt)."""
    spy, out = os.environ.get("BENCH_PYSPY"), os.environ.get("BENCH_PROFILE_DIR")
    if not spy or not out:
        return None
    target = Path(out) / f"{name}.txt"
    argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--nonblocking", "-o", str(target)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def live_jobs(cluster: SlurmCluster) -> int:
    out = cluster.run(["squeue", "-h", "-t", "PD,R,CG", "-o", "%i"], check=False, timeout=60)
    return len(out.stdout.split())


async def wait_no_jobs(cluster: SlurmCluster) -> None:
    while True:
        if not await asyncio.to_thread(live_jobs, cluster):
            return
        await asyncio.sleep(1)


async def lock_toleration_policy(kube: AsyncClient, state: Path) -> None:
    """The chart's MutatingAdmissionPolicy that gives sunk's pods the node
    lock's toleration when they are created, rendered by helm as installed."""
    helm = Helm(ensure_helm(print), None, state / "helm")
    api = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
    template = "templates/scheduler-admission.yaml"
    out = helm.run(["template", "bench", str(CHARTS / "sunk-cluster"), "--api-versions", api,
                    "--show-only", template])  # fmt: skip
    for doc in yaml.safe_load_all(out):
        if doc:
            await kube.create(codecs.from_dict(doc))
    # In effect once a pod (a dry run) comes back with the toleration. The
    # apiserver's first use of a policy is slow (its CEL compiled for the
    # pod's schema): that is not a burst's cost, so it is paid and shown here.
    started = time.monotonic()
    probe = bench_pod("policy-probe", SCHEDULER_NAME, tolerant=False)
    while True:
        call = time.monotonic()
        created = await kube.create(probe, dry_run=True)
        took = time.monotonic() - call
        if created.spec and any(t.key == TAINT_NODE_LOCK for t in created.spec.tolerations or []):
            break
        await asyncio.sleep(0.2)
    print(
        f"lock toleration policy in effect after {time.monotonic() - started:.1f} s"
        f" (that pod's create: {took:.2f} s)",
        flush=True,
    )


async def bench(
    nodes: int,
    bursts: list[int],
    slurm_conf: list[str],
    interval: float,
    release: str,
    pods: str,
) -> None:
    results: dict[tuple[str, int], dict[str, float]] = {}
    conf = [
        "NodeSet=benchset Feature=bench",
        f"PartitionName={PARTITION} Nodes=benchset MaxTime=INFINITE State=UP"
        " OverSubscribe=FORCE:256",
        "MaxJobCount=100000",
        *slurm_conf,
    ]
    async with kwok_bed(
        nodes,
        cpu="1000",
        memory="4000Gi",
        max_pods="5000",
        slurm_conf=conf,
        namespaces=[NAMESPACE, NODESET_NAMESPACE],
        slurm_release=release,
    ) as bed:
        kube, cluster, slurm, access = bed.kube, bed.cluster, bed.slurm, bed.access
        owner = await standing_nodeset(kube, NODESET_NAMESPACE, "b")
        for i, node in enumerate(bed.nodes, start=1):
            # What a NodeSet pod tells the scheduler: Slurm node tbK is Node bench-K.
            pod = slurmd_pod(f"tb{i}", NODESET_NAMESPACE, node, "Feature=bench CPUs=2")
            await kube.create(cast(Pod, Pod.from_dict(owned(pod.to_dict(), owner))))

        async def idle() -> bool:
            return await asyncio.to_thread(slurm_nodes_idle, cluster, nodes)

        await wait_until(f"{nodes} slurmd idle", idle, 120, every=0.5)
        print(f"{nodes} slurmd pods idle in Slurm; load average {load_average()}", flush=True)

        for count in bursts:
            machine = cpu_by_command()
            asked = await asyncio.to_thread(apiserver_requests, access.admin_kubeconfig)
            results[("kube-scheduler", count)] = await burst(
                kube, f"k{count}", count, None, pods == "tolerant"
            )
            print(f"kube-scheduler, {count}: {results[('kube-scheduler', count)]}", flush=True)
            print(f"  CPU s by command: {cpu_spent(machine, cpu_by_command())}", flush=True)
            now_asked = await asyncio.to_thread(apiserver_requests, access.admin_kubeconfig)
            print(f"  apiserver requests: {requests_made(asked, now_asked)}", flush=True)
            await clear(kube)

        if pods == "policy":
            await lock_toleration_policy(kube, bed.state)
        # Its tenancy: the bench's pods run in Slurm as nobody (a uid of at least
        # 1000 that the root filesystem knows).
        grant = {"namespaces": [NAMESPACE], "uids": "65534", "user": 65534}
        await kube.create(
            ConfigMap(
                metadata=ObjectMeta(name="sunk-scheduler-tenancy", namespace="default"),
                data={"tenancy.yaml": yaml.safe_dump({"tenants": [grant]})},
            )
        )
        # sunk's scheduler as its own process, as kube-scheduler is: `sunk scheduler`.
        argv = [
            str(Path(sys.executable).parent / "sunk"),
            "scheduler",
            "--slurmrestd",
            slurm.restd_url,
            "--jwt-key",
            str(slurm.jwt_key),
            "--slurm-user",
            "root",
            "--kubeconfig",
            str(access.admin_kubeconfig),
            "--namespace",
            NAMESPACE,
            "--slurmd-namespace",
            NODESET_NAMESPACE,
            "--partition",
            PARTITION,
            "--kill-wait",
            "2",
            "--poll-interval",
            str(interval),
            "--metrics-port",
            str(metrics_port := free_port()),
            # Logs at the default level, as deployed; a trace wants every step.
            *(["-v"] if os.environ.get("BENCH_VERBOSE") else []),
        ]
        log_path = bed.state / "scheduler.log"
        process = spawn(argv, log_path)
        try:
            await asyncio.sleep(SETTLE)  # leader, informers synced, first submits allowed
            async with SlurmClient(
                slurm.restd_url, JwtMinter(FileKey(slurm.jwt_key), "root")
            ) as client:
                for count in bursts:
                    before_stats = proc_stats(process.pid)
                    before = before_stats["cpu_s"]
                    machine = cpu_by_command()
                    asked = await asyncio.to_thread(apiserver_requests, access.admin_kubeconfig)
                    slurm_asked = await metric_value(metrics_port, "sunk_scheduler_slurm_requests")
                    profiler = profile(process.pid, f"sunk-{count}")
                    results[("sunk", count)] = await burst(
                        kube, f"s{count}", count, SCHEDULER_NAME, pods == "tolerant"
                    )
                    if profiler is not None:
                        profiler.send_signal(signal.SIGINT)  # py-spy writes what it sampled
                        profiler.wait(30)
                    after = proc_stats(process.pid)
                    print(f"sunk, {count}: {results[('sunk', count)]}", flush=True)
                    print(f"  CPU s by command: {cpu_spent(machine, cpu_by_command())}", flush=True)
                    now_asked = await asyncio.to_thread(apiserver_requests, access.admin_kubeconfig)
                    print(f"  apiserver requests: {requests_made(asked, now_asked)}", flush=True)
                    sent = (
                        await metric_value(metrics_port, "sunk_scheduler_slurm_requests")
                        - slurm_asked
                    )
                    print(f"  sunk's requests to slurmrestd: {sent:.0f}", flush=True)
                    jobs = await jobs_by_kind(metrics_port)
                    print(
                        f"  sunk scheduler: {after['cpu_s'] - before:.2f} s CPU for the burst"
                        f" ({after['sys_s'] - before_stats['sys_s']:.2f} s in the kernel),"
                        f" {after['rss_mib']:.0f} MiB; since start: {jobs}",
                        flush=True,
                    )
                    listing = await client.jobs()
                    waits = sorted(
                        j.start_time - j.submit_time
                        for j in (listing.items if listing else ())
                        if j.start_time and j.submit_time and j.name.startswith(f"{NAMESPACE}/s")
                    )
                    if waits:
                        print(
                            f"  Slurm submit→start (1 s resolution): p50 {statistics.median(waits)}"
                            f" max {waits[-1]} s over {len(waits)} jobs",
                            flush=True,
                        )
                    # The burst's pods deleted at once: one cancel per job, not
                    # a second while the view catches up.
                    cancelled = await metric_value(metrics_port, "sunk_scheduler_cancels_total")
                    deleted = time.monotonic()
                    await clear(kube)
                    await wait_no_jobs(cluster)
                    cancels = (
                        await metric_value(metrics_port, "sunk_scheduler_cancels_total") - cancelled
                    )
                    ended = time.monotonic() - deleted
                    print(
                        f"  deleting the {count} pods: every job ended {ended:.1f} s after"
                        f" (squeue every 1 s), {cancels:.0f} cancels",
                        flush=True,
                    )
        finally:
            process.terminate()
            process.wait(30)
            if trace := os.environ.get("BENCH_TRACE"):
                shutil.copy(log_path, trace)

        print(f"\nBursts of single-node pods ({pods}), {nodes} nodes, 2 cores shared:")
        print(f"  ({STAND_INS}; load average now {load_average()})")
        print(f"{'burst':>6} {'scheduler':<15} {'p50 s':>7} {'p99 s':>7} {'pods/s':>8}")
        for count in bursts:
            for who in ("kube-scheduler", "sunk"):
                r = results[(who, count)]
                print(f"{count:>6} {who:<15} {r['p50']:7.2f} {r['p99']:7.2f} {r['rate']:8.1f}")
            ratio = results[("sunk", count)]["rate"] / results[("kube-scheduler", count)]["rate"]
            print(f"{count:>6} sunk / kube-scheduler throughput: {ratio:.2f}")


async def run_cancellable(
    nodes: int, bursts: list[int], slurm_conf: list[str], interval: float, release: str, pods: str
) -> None:
    """SIGTERM/SIGINT cancel the run, so the bed is still torn down."""
    task = asyncio.create_task(bench(nodes, bursts, slurm_conf, interval, release, pods))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    await task


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if os.environ.get("BENCH_TRACE"):  # a file for the scheduler's log; creations logged here
        logging.getLogger("bench").setLevel(logging.INFO)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--bursts", default="100,1000")
    parser.add_argument(
        "--slurm-conf", action="append", default=[], help="a slurm.conf line to add (repeatable)"
    )
    parser.add_argument("--view-interval", type=float, default=0.25, help="Slurm view poll (s)")
    parser.add_argument("--slurm", default=DEFAULT_SLURM, choices=sorted(ROOTFS_SUITES))
    parser.add_argument("--pods", default="policy", choices=["policy", "plain", "tolerant"])
    args = parser.parse_args()
    bursts = [int(b) for b in args.bursts.split(",")]
    asyncio.run(
        run_cancellable(
            args.nodes, bursts, args.slurm_conf, args.view_interval, args.slurm, args.pods
        )
    )


if __name__ == "__main__":
    main()
