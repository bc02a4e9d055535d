"""Fixtures for the Slurm half of the test bed.

By default one SlurmCluster (munged, slurmctld, 3 slurmd, slurmrestd) is
started per session and stopped at its end. With SUNK_TESTBED_STATE set, the
cluster of that running bed is used and left running. With
SUNK_SLURMRESTD_URL and SUNK_SLURM_TOKEN (a root token) set, the REST tests
run against that slurmrestd and nothing is started; tests that need the bed's
own CLI or keys are then skipped.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import SlurmAccess, SlurmCluster, ensure_rootfs

SlurmCli = Callable[..., subprocess.CompletedProcess[str]]


def external_restd() -> tuple[str, str] | None:
    """(url, root token) of a slurmrestd named by the environment, if any."""
    url = os.environ.get("SUNK_SLURMRESTD_URL")
    token = os.environ.get("SUNK_SLURM_TOKEN")
    return (url.rstrip("/"), token) if url and token else None


@pytest.fixture(scope="session")
def slurm_cluster(
    testbed_state_dir: Path, supervisor: Supervisor, testbed_external: bool
) -> Iterator[SlurmCluster]:
    if external_restd() is not None:
        pytest.skip("needs the test bed's own Slurm (SUNK_SLURMRESTD_URL points elsewhere)")
    if testbed_external:
        cluster = SlurmCluster.attach(testbed_state_dir, supervisor)
        cluster.access()  # fails clearly if that bed's Slurm is not running
        yield cluster
        return
    cluster = SlurmCluster(testbed_state_dir, supervisor, ensure_rootfs())
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def slurm_access(slurm_cluster: SlurmCluster) -> SlurmAccess:
    return slurm_cluster.access()


@pytest.fixture(scope="session")
def slurmrestd_url(request: pytest.FixtureRequest) -> str:
    if (external := external_restd()) is not None:
        return external[0]
    access: SlurmAccess = request.getfixturevalue("slurm_access")
    return access.restd_url


@pytest.fixture(scope="session")
def slurm_token(request: pytest.FixtureRequest) -> str:
    """A root token, valid for the whole session."""
    if (external := external_restd()) is not None:
        return external[1]
    cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
    return cluster.token("root", lifetime=4 * 3600)


@pytest.fixture(scope="session")
def slurm_cli(slurm_cluster: SlurmCluster) -> SlurmCli:
    """`slurm_cli(["sinfo"], user=None, check=True, timeout=60, input=None)`."""
    return slurm_cluster.run
