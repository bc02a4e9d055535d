"""Slurm defects sunk keeps out of the way of, each shown on a Slurm bed of its
own (the defect leaves its bed unusable). A test here fails when a Slurm
release no longer has the defect: then the workaround can be revisited."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunk.slurm import FileKey, JobSpec, JwtMinter, SlurmApiError, SlurmClient
from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import (
    PARTITION,
    PLAIN_UID,
    SlurmAccess,
    SlurmCluster,
    ensure_rootfs,
)

pytestmark = pytest.mark.contract


@pytest.fixture
def own_bed(testbed_external: bool) -> Iterator[tuple[SlurmCluster, SlurmAccess]]:
    if testbed_external:
        pytest.skip("breaks its Slurm: only on a bed of its own")
    state = Path(tempfile.mkdtemp(prefix="sunk-sd-", dir="/tmp"))
    cluster = SlurmCluster(state, Supervisor(state), ensure_rootfs("trixie"), nodes=1)
    try:
        yield cluster, cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


async def test_a_refused_rest_cancel_leaves_slurmctld_answering_no_job_read(
    own_bed: tuple[SlurmCluster, SlurmAccess],
) -> None:
    """24.11 (and 26.05, tried by hand): a user's `DELETE /job/{id}` of another
    user's job is refused, and slurmctld then answers no job read. So the
    scheduler cancels only with the job owner's token, and the chart keeps
    login pods and jobs away from slurmrestd (docs/slurm-port.md)."""
    cluster, access = own_bed
    keys = FileKey(access.jwt_key)
    async with SlurmClient(access.restd_url, JwtMinter(keys, "root")) as root:
        spec = JobSpec(
            script="#!/bin/sh\nsleep 300\n",
            name="victim",
            partition=PARTITION,
            nodes="1",
            tasks=1,
            time_limit_minutes=5,
            standard_output="/dev/null",
        )
        victim = (await root.submit(spec)).job_id
        for _ in range(100):
            job = await root.job(victim)
            if job is not None and job.state == "RUNNING":
                break
            await asyncio.sleep(0.1)
        assert cluster.run(["squeue", "-h", "-j", str(victim)], check=False).returncode == 0
        other = root.acting_as(JwtMinter(keys, str(PLAIN_UID)))
        with pytest.raises(SlurmApiError) as refused:
            await other.cancel(victim)
        assert refused.value.errno == 1  # EPERM, not scancel's "Access/permission denied"
        await asyncio.sleep(2)
        after = await asyncio.to_thread(
            cluster.run, ["squeue", "-h", "-j", str(victim)], check=False
        )
        assert after.returncode != 0, after.stdout
        assert "Socket timed out" in after.stderr, after.stderr
