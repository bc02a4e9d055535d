"""The Slurm job that stands for a pod, by kind: what it costs to start, hold and end.

    sudo .venv/bin/python bench/placeholders.py [--samples 10] [--slurm 26.05]

A private Slurm (static nodes on this host, the bed's slurm.conf: KillWait=2,
`sched_min_interval=0,batch_sched_delay=0`). For each kind of job sunk's
scheduler could ask for a pod, `--samples` times on an idle node:

- `allocation`: `POST /job/allocate` with `immediate` (what the scheduler asks
  first);
- `batch placeholder`: `POST /job/submit` with the scheduler's placeholder
  script (what it queues when the allocation is refused), ended as the
  scheduler ends it (SIGUSR1 to the whole job, then a cancel) and, apart,
  with a plain cancel;
- `external job`: `POST /job/submit` with the `EXTERNAL_JOB` flag and no
  script (v0.0.43+, Slurm 25.05+), ended with a cancel.

Printed per kind: submit → RUNNING (polling the job every 10 ms), the
processes it keeps on the node while it runs (slurmstepd and what it
starts), the requests its end takes, and end → the job gone from
RUNNING/COMPLETING and its node idle again; p50 / max over the samples.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kwok_bed import wait_until
from private_slurm import private_slurm
from sunk.scheduler.request import PLACEHOLDER_SCRIPT
from sunk.slurm.auth import FileKey, JwtMinter
from sunk.slurm.client import SlurmClient, _SubmitReply
from sunk.slurm.models import JobSpec
from sunk_testbed.images import DEFAULT_SLURM
from sunk_testbed.slurm_cluster import ROOTFS_SUITES, ensure_release_rootfs

POLL = 0.01
LIMIT = 30.0
NODE = "tb1"


@dataclass
class Figures:
    start: list[float] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    end_requests: int = 0
    end: list[float] = field(default_factory=list)


def job_processes() -> int:
    """slurmstepd processes and all they started (a job's processes on this host's nodes)."""
    found = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    todo: list[int] = []
    for line in found.stdout.splitlines():
        pid, parent, command = line.split(None, 2)
        children.setdefault(int(parent), []).append(int(pid))
        if command.strip() == "slurmstepd":
            todo.append(int(pid))
    seen: set[int] = set()
    while todo:
        if (process := todo.pop()) not in seen:
            seen.add(process)
            todo.extend(children.get(process, []))
    return len(seen)


async def state(slurm: SlurmClient, job_id: int) -> str:
    job = await slurm.job(job_id)
    return job.state if job is not None else "GONE"


async def node_idle(slurm: SlurmClient) -> bool:
    node = await slurm.node(NODE)
    return node is not None and node.base_state == "IDLE" and "COMPLETING" not in node.state


async def run_kind(
    slurm: SlurmClient,
    submit: Callable[[], Awaitable[int]],
    end: Callable[[int], Awaitable[int]],
    samples: int,
) -> Figures:
    figures = Figures()
    for _ in range(samples):
        await wait_until(f"{NODE} idle", lambda: node_idle(slurm), LIMIT, POLL)

        async def no_job_processes() -> bool:  # the last job's slurmstepd has exited
            return job_processes() == 0

        await wait_until("no job processes", no_job_processes, LIMIT, POLL)
        started = time.monotonic()
        job_id = await submit()

        async def running(job_id: int = job_id) -> bool:
            return await state(slurm, job_id) == "RUNNING"

        await wait_until(f"job {job_id} running", running, LIMIT, POLL)
        figures.start.append(time.monotonic() - started)
        await asyncio.sleep(0.5)  # whatever the job starts on the node has started
        figures.processes.append(job_processes())
        ended = time.monotonic()
        figures.end_requests = await end(job_id)

        async def gone(job_id: int = job_id) -> bool:
            return await state(slurm, job_id) not in ("RUNNING", "COMPLETING") and await node_idle(
                slurm
            )

        await wait_until(f"job {job_id} gone, {NODE} idle", gone, LIMIT, POLL)
        figures.end.append(time.monotonic() - ended)
    return figures


def spread(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.3f} s, max {max(values):.3f} s"


async def measure(samples: int, release: str) -> None:
    rootfs = ensure_release_rootfs(release)
    with private_slurm(rootfs, prefix="sunk-placeholders-", nodes=1) as (_, access):
        async with SlurmClient(
            access.restd_url, JwtMinter(FileKey(access.jwt_key), "root")
        ) as slurm:
            info = await slurm.negotiate()
            spec = JobSpec(name="placeholder", nodes="1", tasks=1, standard_output="/dev/null")

            async def allocate() -> int:
                return (await slurm.allocate(spec.model_copy(update={"immediate": True}))).job_id

            async def batch() -> int:
                return (
                    await slurm.submit(spec.model_copy(update={"script": PLACEHOLDER_SCRIPT}))
                ).job_id

            async def external() -> int:
                dialect = await slurm.dialect()
                body = dialect.submit_body(spec)
                body["job"]["flags"] = ["EXTERNAL_JOB"]
                parsed, _ = await slurm._call(
                    "POST", "job/submit", _SubmitReply, idempotent=False, json=body
                )
                assert parsed.job_id is not None
                return parsed.job_id

            async def cancel(job_id: int) -> int:
                await slurm.cancel(job_id)
                return 1

            async def release_then_cancel(job_id: int) -> int:
                await slurm.signal(job_id, "SIGUSR1", full=True)
                await slurm.cancel(job_id)
                return 2

            kinds: list[tuple[str, Callable[[], Awaitable[int]], Callable[[int], Awaitable[int]]]]
            kinds = [
                ("allocation (immediate), cancel", allocate, cancel),
                ("batch placeholder, SIGUSR1 + cancel", batch, release_then_cancel),
                ("batch placeholder, cancel", batch, cancel),
            ]
            if info.api_version >= "v0.0.43":
                kinds.append(("external job (EXTERNAL_JOB), cancel", external, cancel))
            print(
                f"Slurm {info.release}, {info.api_version}; {samples} samples of each on one node"
            )
            for name, submit, end in kinds:
                figures = await run_kind(slurm, submit, end, samples)
                print(f"{name}:")
                print(f"  submit → RUNNING            {spread(figures.start)}")
                print(f"  processes on the node       {sorted(set(figures.processes))}")
                print(
                    f"  end: {figures.end_requests} request(s), → gone and node idle"
                    f" {spread(figures.end)}"
                )
            if info.api_version < "v0.0.43":
                print("external job: not offered before v0.0.43")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--slurm", default=DEFAULT_SLURM, choices=sorted(ROOTFS_SUITES))
    args = parser.parse_args()
    asyncio.run(measure(args.samples, args.slurm))


if __name__ == "__main__":
    main()
