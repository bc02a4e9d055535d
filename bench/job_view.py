"""Benchmark: how soon a job's start and end reach a Slurm view, with a long queue.

    .venv/bin/python bench/job_view.py [--queue 1000,5000] [--samples 10] [--slurm 26.05|24.11]

A real Slurm bed (slurmctld, slurmrestd, two slurmd; no Kubernetes). For each
queue length, held batch jobs fill the queue (they stay PENDING), then a view
configured as the scheduler's (`interval` 0.25 s, `read_share` 0.1, jobs
only) follows the jobs, once reading lists (`job_probe=False`, the view
before the probe) and once probing states (`job_probe=True`, `detail_every`
1 s). Each sample allocates a job that starts at once (another client's
request, as a researcher's `salloc` is) and cancels it; printed per mode:
allocation → the view's event showing it RUNNING, and cancel → the event of
its end (p50 / p99 over the samples), and slurmrestd's CPU and the bench's
own (the view's, with the sample client's few requests) over the samples.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from contextlib import closing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from kwok_bed import cpu_by_command
from private_slurm import private_slurm
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient
from sunk.slurm.models import JobSpec
from sunk.slurm.view import JobEvent, SlurmView
from sunk_testbed.images import DEFAULT_SLURM
from sunk_testbed.slurm_cluster import (
    ROOTFS_SUITES,
    SlurmAccess,
    ensure_release_rootfs,
)

PARTITION = "bench"
INTERVAL = 0.25  # the scheduler's poll
READ_SHARE = 0.1  # the scheduler's
DETAIL_EVERY = 1.0  # the scheduler's


def one_node_job(name: str, **fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "partition": PARTITION,
            "nodes": "1",
            "tasks": 1,
            "time_limit_minutes": 10,
            **fields,
        }
    )


def queued(i: int) -> JobSpec:
    """A held batch job: it stays PENDING, one more job in every list read."""
    script = "#!/bin/sh\nsleep 600\n"
    return one_node_job(f"queued-{i}", script=script, hold=True, standard_output="/dev/null")


def sample_job(i: int) -> JobSpec:
    """An allocation that starts at once (as `salloc --immediate`)."""
    return one_node_job(f"sample-{i}", immediate=True)


async def fill(slurm: SlurmClient, count: int) -> None:
    semaphore = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with semaphore:
            await slurm.submit(queued(i))

    await asyncio.gather(*(one(i) for i in range(count)))


async def follow(
    slurm: SlurmClient, actor: SlurmClient, probe: bool, samples: int
) -> tuple[list[float], list[float], float, float]:
    """Start and end delays, slurmrestd's CPU and this process's (the view's) over the samples."""
    async with SlurmView(
        slurm,
        interval=INTERVAL,
        watch_nodes=False,
        stale_after=60,
        read_share=READ_SHARE,
        job_probe=probe,
        detail_every=DETAIL_EVERY,
    ) as view:
        await view.refresh()
        started: list[float] = []
        ended: list[float] = []
        cpu = cpu_by_command().get("slurmrestd", 0.0)
        own = time.process_time()
        with closing(view.subscribe(replay=False)) as events:
            for i in range(samples):
                await asyncio.sleep(1.0)  # a poll or two of nothing changing
                t0 = time.monotonic()
                job_id = (await actor.allocate(sample_job(i))).job_id
                while True:
                    event = await events.get()
                    if (
                        isinstance(event, JobEvent)
                        and event.job_id == job_id
                        and event.new is not None
                        and event.new.state == "RUNNING"
                    ):
                        break
                started.append(time.monotonic() - t0)
                t0 = time.monotonic()
                await actor.cancel(job_id)
                while True:
                    event = await events.get()
                    if (
                        isinstance(event, JobEvent)
                        and event.job_id == job_id
                        and (event.new is None or event.new.state != "RUNNING")
                    ):
                        break
                ended.append(time.monotonic() - t0)
        restd = cpu_by_command().get("slurmrestd", 0.0) - cpu
        return started, ended, restd, time.process_time() - own


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{statistics.median(ordered):.3f} / {p99:.3f} s"


async def bench(access: SlurmAccess, queue_lengths: list[int], samples: int) -> None:
    minter = JwtMinter(FileKey(access.jwt_key), "root")
    async with (
        SlurmClient(access.restd_url, minter) as slurm,
        SlurmClient(access.restd_url, minter) as actor,
    ):
        filled = 0
        print(
            f"{'queue':>6} {'view':<6} {'start → event p50 / p99':>26} "
            f"{'end → event p50 / p99':>24} {'slurmrestd CPU':>15} {'view CPU':>10}"
        )
        for length in queue_lengths:
            await fill(slurm, length - filled)
            filled = length
            for probe in (False, True):
                started, ended, cpu, own = await follow(slurm, actor, probe, samples)
                print(
                    f"{length:>6} {'probe' if probe else 'list':<6} {spread(started):>26} "
                    f"{spread(ended):>24} {cpu:>13.1f} s {own:>8.1f} s",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queue", default="1000,5000")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--slurm", default=DEFAULT_SLURM, choices=sorted(ROOTFS_SUITES))
    args = parser.parse_args()
    queue_lengths = [int(n) for n in args.queue.split(",")]
    conf = [
        f"PartitionName={PARTITION} Nodes=ALL MaxTime=INFINITE State=UP OverSubscribe=FORCE:256",
        f"MaxJobCount={max(queue_lengths) * 2 + 1000}",
    ]
    rootfs = ensure_release_rootfs(args.slurm)
    bed = private_slurm(rootfs, prefix="sunk-bench-jobview-", nodes=2, extra_conf=conf)
    with bed as (_, access):
        print(f"Slurm {args.slurm}: held jobs fill the queue; {args.samples} samples per view")
        asyncio.run(bench(access, queue_lengths, args.samples))


if __name__ == "__main__":
    main()
