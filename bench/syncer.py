"""Benchmark: the syncer over 1,000 Slurm nodes, 100 of them live slurmd pods.

    sudo .venv/bin/python bench/syncer.py [--live 100] [--simulated 900]

Kubernetes nodes: KWOK (simulated); slurmd: real processes started by the
bench, one per pod (see kwok_bed.py). Starts its own bed in a fresh state
directory: the control plane; KWOK with `--live` fake nodes, each with one
slurmd pod bound to it (a real slurmd, started by the bench's pod mirror); a
Slurm whose slurm.conf also defines `--simulated` nodes `sim[...]` in
State=CLOUD that never register (listed with PrivateData=cloud, not pinged):
every full node read carries all of them, as it would in a cluster of that
size, but only the live ones have a Kubernetes node. Then `sunk syncer` runs
as a child process, exactly as deployed, and the benchmark prints:

- cordon → Slurm drain: from the cordon's PATCH until slurmctld logs that it
  set sunk's drain reason (its log has millisecond stamps; reading it adds no
  load to Slurm, as polling fast enough would), per node;
- Slurm drain → Kubernetes: from an admin's drain (REST, returns once
  slurmctld applied it) until a watch on Nodes sees SlurmDrain=True;
- 100 nodes cordoned at once, until all are drained (the Slurm write limit,
  20/s after a burst of 50, shows here), and uncordoned at once;
- nothing changing for `--quiet` s: the syncer's REST requests per minute
  (its own metric), its CPU time and memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

sys.path.insert(0, str(Path(__file__).parent))
from kwok_bed import STAND_INS, kwok_bed, load_average, proc_stats, slurmd_pod, wait_until
from slurm_port import percentile, simulated_conf
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.errors import SlurmApiError
from sunk_testbed.images import DEFAULT_SLURM
from sunk_testbed.slurm_cluster import ROOTFS_SUITES
from sunk_testbed.slurmpods import owned, standing_nodeset

NAMESPACE = "bench"
ADMIN_REASON = "bench: admin drain"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def slurm_writes(port: int) -> tuple[float, ...]:
    """The syncer's Slurm write requests so far, the node writes they carried, and
    the seconds its writes have waited for the Kubernetes and the Slurm write limits."""
    return (
        metric(port, "sunk_syncer_slurm_write_nodes_count"),
        metric(port, "sunk_syncer_slurm_write_nodes_sum"),
        metric(port, 'sunk_syncer_write_wait_seconds{api="kube"}'),
        metric(port, 'sunk_syncer_write_wait_seconds{api="slurm"}'),
    )


def writes_since(port: int, before: tuple[float, ...]) -> str:
    """What the syncer sent to Slurm since `before` (a `slurm_writes` reading)."""
    requests, nodes, kube_wait, slurm_wait = (
        now - then for now, then in zip(slurm_writes(port), before, strict=True)
    )
    return (
        f"{nodes:.0f} node writes in {requests:.0f} Slurm requests; writes waited "
        f"{kube_wait:.1f} s for the Kubernetes limit, {slurm_wait:.1f} s for Slurm's, summed"
    )


def spawn_syncer(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


async def patch_all(kube: AsyncClient, names: list[str], body: dict[str, Any]) -> None:
    """PATCH every node at once, at most 100 in flight (the client's connection pool)."""
    gate = asyncio.Semaphore(100)

    async def one(name: str) -> None:
        async with gate:
            await kube.patch(Node, name, body, patch_type=PatchType.MERGE)

    await asyncio.gather(*(one(n) for n in names))


def node_conditions(node: Node) -> dict[str, str]:
    found = (node.status.conditions if node.status else None) or []
    return {c.type: c.status for c in found}


class NodeWatch:
    """The first time each Node's condition SlurmDrain turned True, and back False."""

    def __init__(self, kube: AsyncClient) -> None:
        self._kube = kube
        self.drain_seen: dict[str, float] = {}
        self.clear_seen: dict[str, float] = {}

    async def run(self) -> None:
        async for _, node in self._kube.watch(Node):
            name = (node.metadata.name if node.metadata else None) or ""
            status = node_conditions(node).get("SlurmDrain")
            if status == "True":
                self.drain_seen.setdefault(name, time.perf_counter())
                self.clear_seen.pop(name, None)
            elif status == "False":
                self.clear_seen.setdefault(name, time.perf_counter())
                self.drain_seen.pop(name, None)


class CtldLog:
    """When slurmctld applied node updates, from its own log (millisecond stamps).

    Read from the file, not by polling Slurm: at 1,000 nodes every read costs
    slurmctld and slurmrestd real work, and polling fast enough to time a
    sub-second change would load the very thing being measured."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self.updates: list[tuple[float, str, str]] = []  # (wall time, node, what)

    def read(self) -> None:
        with self._path.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            stamp, _, rest = line.partition("] ")
            if not rest.startswith("update_node: node "):
                continue
            node, _, what = rest.removeprefix("update_node: node ").partition(" ")
            when = datetime.datetime.fromisoformat(stamp.lstrip("[")).timestamp()
            self.updates.append((when, node, what))

    async def wait(self, node: str, what: str, since: float, limit: float = 60) -> float:
        """The wall time slurmctld logged `what` (a prefix) for `node` at or after `since`."""
        deadline = time.monotonic() + limit
        while True:
            self.read()
            for when, name, done in self.updates:
                if name == node and done.startswith(what) and when >= since - 0.002:
                    return when
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node}: {what}")
            await asyncio.sleep(0.01)


DRAINED = "reason set to: sunk/syncer: node cordoned"
RESUMED = "state set to IDLE"


def report(what: str, values: list[float]) -> None:
    print(
        f"  {what:34s} p50 {percentile(values, 0.5):.3f} s, p90 {percentile(values, 0.9):.3f} s,"
        f" p99 {percentile(values, 0.99):.3f} s, max {max(values):.3f} s (n={len(values)})",
        flush=True,
    )


async def bench(args: argparse.Namespace) -> None:
    syncer: subprocess.Popen[bytes] | None = None
    watcher: asyncio.Task[None] | None = None
    live: int = args.live
    async with kwok_bed(
        live,
        cpu="4",
        memory="8Gi",
        slurm_conf=simulated_conf(args.simulated),
        max_node_count=live + args.simulated + 100,
        namespaces=[NAMESPACE],
        keep=args.keep,
        slurm_release=args.slurm,
    ) as bed:
        try:
            kube, slurm_access, access, state = bed.kube, bed.slurm, bed.access, bed.state
            names = bed.nodes
            t = time.monotonic()
            pods = {}
            owner = await standing_nodeset(kube, NAMESPACE, "bench")
            for node in names:
                pod = f"slurmd-{node}"
                conf = "Feature=dynamic CPUs=4 RealMemory=8192"
                body = slurmd_pod(pod, NAMESPACE, node, conf).to_dict()
                await kube.create(cast(Pod, Pod.from_dict(owned(body, owner))))
                pods[node] = pod
            credentials = JwtMinter(FileKey(slurm_access.jwt_key), "root")
            async with SlurmClient(slurm_access.restd_url, credentials) as slurm:

                async def all_idle() -> bool:
                    listing = await slurm.nodes()
                    assert listing is not None
                    state_of = {n.name: n for n in listing.items}
                    up = [state_of.get(p) for p in pods.values()]
                    return all(n is not None and n.base_state == "IDLE" for n in up)

                await wait_until("every slurmd idle in Slurm", all_idle, 600, every=1)
                listing = await slurm.nodes()
                assert listing is not None
                print(
                    f"{live} slurmd pods idle in Slurm in {time.monotonic() - t:.1f}s; "
                    f"Slurm lists {len(listing.items)} nodes",
                    flush=True,
                )

                metrics_port = free_port()
                argv = [
                    str(Path(sys.executable).parent / "sunk"),
                    "syncer",
                    "--slurmrestd",
                    slurm_access.restd_url,
                    "--jwt-key",
                    str(slurm_access.jwt_key),
                    "--kubeconfig",
                    str(access.admin_kubeconfig),
                    "--namespace",
                    NAMESPACE,
                    "--lease-namespace",
                    NAMESPACE,
                    "--metrics-port",
                    str(metrics_port),
                    *args.syncer_arg,
                ]
                syncer = spawn_syncer(argv, state / "syncer.log")
                watch = NodeWatch(kube)
                watcher = asyncio.create_task(watch.run())
                t = time.monotonic()

                async def mirrored() -> bool:
                    return len(watch.clear_seen) == live

                await wait_until("the first sync of every node", mirrored, 300, every=0.2)
                print(
                    f"syncer: every node mirrored {time.monotonic() - t:.1f}s after start",
                    flush=True,
                )

                # Measure only a settled bed: on two shared cores, starting 100 nodes
                # and pods can make nodes miss heartbeats (NotReady, which the syncer
                # rightly drains); wait until all are Ready, none drained in Slurm,
                # and the syncer has had nothing to do for 5 s.
                live_pods = set(pods.values())

                async def settled() -> bool:
                    ready = [node_conditions(n).get("Ready") async for n in kube.list(Node)]
                    listing = await slurm.nodes()
                    assert listing is not None
                    drained_now = [n for n in listing.items if n.name in live_pods and n.draining]
                    return ready.count("True") == live and not drained_now

                try:
                    await wait_until(
                        "every node Ready and undrained", settled, args.settle, every=1
                    )
                except TimeoutError:
                    print(
                        f"  (not settled after {args.settle:.0f} s: measuring anyway)", flush=True
                    )
                quiet_since, count = time.monotonic(), -1.0
                while time.monotonic() - quiet_since < 5:
                    now = metric(metrics_port, "sunk_syncer_reconcile_seconds_count")
                    if now != count:
                        quiet_since, count = time.monotonic(), now
                    await asyncio.sleep(0.5)
                print(f"settled {time.monotonic() - t:.1f}s after the syncer started", flush=True)
                total = live + args.simulated
                print(
                    f"\n{total}-node syncer benchmark: {live} live + {args.simulated} Slurm-only"
                    f" nodes (load average {load_average()})\n  ({STAND_INS})"
                )

                # 1. cordon → Slurm drain, one node at a time.
                ctld = CtldLog(state / "slurm" / "log" / "slurmctld.log")
                cordon_delays = []
                for node in names[: args.samples]:
                    pod = pods[node]
                    started = time.time()
                    body = {"spec": {"unschedulable": True}}
                    await kube.patch(Node, node, body, patch_type=PatchType.MERGE)
                    applied = await ctld.wait(pod, DRAINED, started)
                    cordon_delays.append(applied - started)
                    body = {"spec": {"unschedulable": False}}
                    await kube.patch(Node, node, body, patch_type=PatchType.MERGE)
                    try:
                        await ctld.wait(pod, RESUMED, applied, 20)
                    except TimeoutError:  # NotReady meanwhile: sunk rightly keeps it drained
                        print(f"  ({node} not resumed within 20 s)", flush=True)
                report("cordon → Slurm drain", cordon_delays)

                # 2. Slurm drain → Kubernetes condition, one node at a time.
                drain_delays = []
                for node in names[: args.samples]:
                    pod = pods[node]
                    started = time.perf_counter()
                    await slurm.drain(pod, ADMIN_REASON)

                    async def on_kube(n: str = node) -> bool:
                        return n in watch.drain_seen

                    await wait_until(f"{node} SlurmDrain", on_kube, 60, every=0.01)
                    drain_delays.append(watch.drain_seen[node] - started)
                    with contextlib.suppress(SlurmApiError):  # e.g. DOWN meanwhile
                        await slurm.resume(pod)

                    async def cleared(n: str = node) -> bool:
                        return n in watch.clear_seen

                    try:
                        await wait_until(f"{node} SlurmDrain cleared", cleared, 20, every=0.01)
                    except TimeoutError:
                        print(f"  ({node}: SlurmDrain not cleared within 20 s)", flush=True)
                report("Slurm drain → SlurmDrain on node", drain_delays)

                # 3. Every node cordoned at once.
                writes = slurm_writes(metrics_port)
                started = time.time()
                await patch_all(kube, names, {"spec": {"unschedulable": True}})
                cordoned = time.time() - started
                drained_at = [await ctld.wait(pods[n], DRAINED, started, 300) for n in names]
                print(
                    f"  {live} nodes cordoned at once:        all drained "
                    f"{max(drained_at) - started:.2f} s after the first PATCH "
                    f"({max(drained_at) - started - cordoned:.2f} s after the last; "
                    f"the PATCHes took {cordoned:.2f} s; {writes_since(metrics_port, writes)})",
                    flush=True,
                )
                writes = slurm_writes(metrics_port)
                started = time.time()
                await patch_all(kube, names, {"spec": {"unschedulable": False}})
                uncordoned = time.time() - started
                resumed_at = []
                for n in names:
                    with contextlib.suppress(TimeoutError):  # NotReady meanwhile: stays drained
                        resumed_at.append(await ctld.wait(pods[n], RESUMED, started, 60))
                print(
                    f"  {live} nodes uncordoned at once:      {len(resumed_at)} resumed, the last "
                    f"{max(resumed_at) - started:.2f} s after the first PATCH "
                    f"({max(resumed_at) - started - uncordoned:.2f} s after the last; "
                    f"the PATCHes took {uncordoned:.2f} s; {writes_since(metrics_port, writes)})",
                    flush=True,
                )
                await asyncio.sleep(5)

                # 4. Nothing changing.
                requests = metric(metrics_port, "sunk_syncer_slurm_requests")
                before = proc_stats(syncer.pid)
                reconciles = metric(metrics_port, "sunk_syncer_reconcile_seconds_count")
                await asyncio.sleep(args.quiet)
                after = proc_stats(syncer.pid)
                scale = 60 / args.quiet
                per_minute = (metric(metrics_port, "sunk_syncer_slurm_requests") - requests) * scale
                idle_reconciles = metric(metrics_port, "sunk_syncer_reconcile_seconds_count")
                print(f"  nothing changing, over {args.quiet:.0f} s:")
                print(f"    REST requests                    {per_minute:.0f} /min")
                print(f"    reconciles                       {idle_reconciles - reconciles:.0f}")
                print(
                    f"    syncer CPU                       "
                    f"{(after['cpu_s'] - before['cpu_s']) * scale:.2f} s/min "
                    f"({(after['cpu_s'] - before['cpu_s']) / args.quiet * 100:.1f} % of a core)"
                )
                print(
                    f"    syncer memory                    RSS {after['rss_mib']:.0f} MiB "
                    f"(peak {after['peak_rss_mib']:.0f} MiB), {after['threads']:.0f} threads",
                    flush=True,
                )
                print(f"  load average at the end: {load_average()}", flush=True)
        finally:
            if watcher is not None:
                watcher.cancel()
            if syncer is not None and syncer.poll() is None:
                syncer.send_signal(signal.SIGTERM)
                syncer.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", type=int, default=100, help="nodes with a slurmd pod")
    parser.add_argument("--simulated", type=int, default=900, help="Slurm-only nodes")
    parser.add_argument("--samples", type=int, default=100, help="nodes timed one at a time")
    parser.add_argument("--quiet", type=float, default=60.0, help="unchanged period, s")
    parser.add_argument("--settle", type=float, default=300.0, help="max wait for a calm bed, s")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs)")
    parser.add_argument("--slurm", default=DEFAULT_SLURM, choices=sorted(ROOTFS_SUITES))
    parser.add_argument(
        "--syncer-arg",
        action="append",
        default=[],
        help="an option for `sunk syncer`, e.g. --syncer-arg=--kube-writes=0 (repeatable)",
    )
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
