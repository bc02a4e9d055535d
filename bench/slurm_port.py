"""Benchmark of sunk.slurm against a real Slurm with thousands of nodes.

Starts a private test bed whose slurm.conf (the bed's, plus `extra_conf`)
defines N extra nodes `sim[00001-N]` in State=CLOUD (powered down, listed
with PrivateData=cloud): they never register and slurmctld does not ping
them, so the cluster is as quiet as a healthy one, yet they are listed like
any node and accept DRAIN, which is all a sync loop needs. (`--sim-state
UNKNOWN` gives nodes slurmctld keeps pinging; their state flags churn.)
Prints:

1. the time (and bytes) of a full node read,
2. requests and bytes per minute the view costs while nothing changes,
3. the delay from a node state change in Slurm (a drain through a second
   REST client, returning once slurmctld applied it) to the view's event,
   p50/p99 over `--changes` drains.

    .venv/bin/python bench/slurm_port.py [--nodes 5000] [--suite trixie]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from private_slurm import private_slurm
from sunk.slurm import FileKey, JwtMinter, NodeEvent, SlurmClient, SlurmView
from sunk.slurm.hostlist import compress
from sunk_testbed.slurm_cluster import SlurmCluster, ensure_rootfs


def simulated_conf(count: int, state: str = "CLOUD") -> list[str]:
    """slurm.conf lines for `count` nodes `sim[...]` that no slurmd serves, in partition sim."""
    if count == 0:
        return []
    names = compress(f"sim{i:05d}" for i in range(1, count + 1))
    # One loopback address each, port 9 (nobody listens): slurmctld's pings
    # fail at once instead of waiting on name lookups.
    addresses = compress(f"127.1.{i // 250}.{i % 250 + 1}" for i in range(count))
    # CLOUD nodes are listed only with PrivateData=cloud.
    listed = ["PrivateData=cloud"] if state == "CLOUD" else []
    return [
        *listed,
        f"NodeName={names} NodeAddr={addresses} Port=9 CPUs=64 State={state}",
        f"PartitionName=sim Nodes={names}",
    ]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def measure(cluster: SlurmCluster, args: argparse.Namespace) -> None:
    access = cluster.access()
    key = FileKey(access.jwt_key)
    async with SlurmClient(access.restd_url, JwtMinter(key, "root")) as slurm:
        info = await slurm.negotiate()
        print(
            f"Slurm {info.release}, data_parser {info.api_version}, "
            f"{args.nodes} simulated nodes (State={args.sim_state})"
        )

        # 1. Full reads.
        times = []
        for _ in range(args.full_reads):
            received = slurm.stats.bytes_received
            started = time.perf_counter()
            listing = await slurm.nodes()
            times.append(time.perf_counter() - started)
            size = slurm.stats.bytes_received - received
        assert listing is not None
        print(
            f"full node read: {len(listing.items)} nodes, {size / 1e6:.1f} MB, "
            f"median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}) "
            f"over {len(times)} reads, parsing included"
        )

        # 2. An unchanged cluster.
        async with SlurmView(slurm, interval=args.interval) as view:
            assert view.fresh
            # Let registrations settle: 2 s in a row without a changed listing.
            settled = time.monotonic()
            listings = view.stats.full_reads + view.stats.changed
            while time.monotonic() - settled < 2:
                await asyncio.sleep(0.25)
                if view.stats.full_reads + view.stats.changed != listings:
                    settled = time.monotonic()
                    listings = view.stats.full_reads + view.stats.changed
            requests, received, sent = (
                slurm.stats.requests,
                slurm.stats.bytes_received,
                slurm.stats.bytes_sent,
            )
            full_before = view.stats.full_reads + view.stats.changed
            await asyncio.sleep(args.quiet)
            scale = 60 / args.quiet
            print(
                f"unchanged cluster, view polling nodes+jobs every {args.interval} s: "
                f"{(slurm.stats.requests - requests) * scale:.0f} requests/min, "
                f"{(slurm.stats.bytes_received - received) * scale / 1e3:.1f} kB/min received, "
                f"{(slurm.stats.bytes_sent - sent) * scale / 1e3:.1f} kB/min sent, "
                f"{view.stats.full_reads + view.stats.changed - full_before} full listings "
                f"(measured over {args.quiet:.0f} s)"
            )

            # 3. Change -> event delay.
            events = view.subscribe(replay=False)
            delays: list[float] = []
            rng = random.Random(7)
            async with SlurmClient(access.restd_url, JwtMinter(key, "root")) as writer:
                for i in range(1, args.changes + 1):
                    await asyncio.sleep(rng.uniform(0.1, 1.3))  # changes land at any phase
                    name = f"sim{i:05d}"
                    await writer.drain(name, f"bench {i}")
                    applied = time.perf_counter()
                    async with asyncio.timeout(30):
                        while True:
                            event = await events.get()
                            if (
                                isinstance(event, NodeEvent)
                                and event.name == name
                                and event.new is not None
                                and event.new.draining
                            ):
                                break
                    delays.append(time.perf_counter() - applied)
            print(
                f"drain -> view event over {len(delays)} changes: "
                f"p50 {percentile(delays, 0.5):.3f} s, p90 {percentile(delays, 0.9):.3f} s, "
                f"p99 {percentile(delays, 0.99):.3f} s, max {max(delays):.3f} s; "
                f"incremental fallbacks (24.11 defect): {view.stats.fallbacks}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--suite", default="trixie", help="Debian suite of the Slurm root fs")
    parser.add_argument("--interval", type=float, default=0.25, help="view poll interval, s")
    parser.add_argument("--quiet", type=float, default=60.0, help="unchanged period, s")
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--full-reads", type=int, default=5)
    parser.add_argument("--sim-state", default="CLOUD", choices=["CLOUD", "UNKNOWN"])
    args = parser.parse_args()

    bed = private_slurm(
        ensure_rootfs(args.suite),
        prefix="sunk-bench-",
        nodes=1,
        extra_conf=[
            # Slurm's default, over the bed's 30 s: UNKNOWN nodes are not timed out mid-run.
            "SlurmdTimeout=300",
            *simulated_conf(args.nodes, args.sim_state),
        ],
        max_node_count=args.nodes + 100,
    )
    started = time.perf_counter()
    with bed as (cluster, _):
        print(f"bed with {args.nodes + 1} nodes started in {time.perf_counter() - started:.1f} s")
        asyncio.run(measure(cluster, args))


if __name__ == "__main__":
    main()
