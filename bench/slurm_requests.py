"""What one REST request costs slurmrestd, slurmctld and sunk's client, in CPU.

    sudo .venv/bin/python bench/slurm_requests.py [--nodes 10] [--jobs 200] [--reads 20]

A private Slurm (static nodes on this host, one partition with
`OverSubscribe=FORCE:256` so that every allocation starts at once). The
requests are sent one at a time, so each process's CPU time over a phase,
divided by the requests sent, is what one request costs it:

1. `--jobs` immediate allocations (`POST /job/allocate`, what sunk's
   scheduler asks for per pod);
2. one `GET /job/{id}` of each (how the scheduler learns the node);
3. `--reads` full job listings (`GET /jobs`, the Slurm view's full read)
   with the `--jobs` jobs in the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable

from kwok_bed import proc_stats
from private_slurm import private_slurm
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.models import JobSpec
from sunk_testbed.slurm_cluster import ensure_rootfs

PARTITION = "bench"


def cpu_seconds(pids: list[int]) -> float:
    return sum(proc_stats(pid)["cpu_s"] for pid in pids)


def pids_named(name: str) -> list[int]:
    found = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


async def phase(
    what: str, count: int, send: Callable[[int], Awaitable[object]], pids: dict[str, list[int]]
) -> None:
    before = {who: cpu_seconds(p) for who, p in pids.items()}
    started = time.monotonic()
    for i in range(count):
        await send(i)
    wall = time.monotonic() - started
    costs = ", ".join(
        f"{who} {(cpu_seconds(p) - before[who]) / count * 1000:.2f} ms" for who, p in pids.items()
    )
    print(f"{what}, {count} times: {wall / count * 1000:.2f} ms each; CPU per request: {costs}")


async def measure(nodes: int, jobs: int, reads: int) -> None:
    conf = [
        f"PartitionName={PARTITION} Nodes=tb[1-{nodes}] MaxTime=INFINITE State=UP"
        " OverSubscribe=FORCE:256",
        "MaxJobCount=100000",
    ]
    bed = private_slurm(ensure_rootfs(), prefix="sunk-breq-", nodes=nodes, extra_conf=conf)
    with bed as (_, access):
        async with SlurmClient(
            access.restd_url, JwtMinter(FileKey(access.jwt_key), "root")
        ) as slurm:
            await slurm.jobs()  # negotiated, connected
            pids = {
                "slurmrestd": pids_named("slurmrestd"),
                "slurmctld": pids_named("slurmctld"),
                "client": [os.getpid()],
            }
            ids: list[int] = []

            async def allocate(i: int) -> None:
                spec = JobSpec(
                    name=f"r{i}", partition=PARTITION, nodes="1", tasks=1, immediate=True
                )
                ids.append((await slurm.allocate(spec)).job_id)

            await phase("POST /job/allocate (immediate)", jobs, allocate, pids)
            await phase("GET /job/{id}", jobs, lambda i: slurm.job(ids[i]), pids)
            await phase(f"GET /jobs ({jobs} jobs)", reads, lambda i: slurm.jobs(), pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(measure(args.nodes, args.jobs, args.reads))


if __name__ == "__main__":
    main()
