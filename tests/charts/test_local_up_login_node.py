"""The login pod as researchers use it, on the README's cluster (`sunk local
up`): a C program built there with Open MPI's `mpicc` runs as a 3-node job,
one rank per slurmd pod, so the login image's Open MPI matches the nodes'
(docs/researchers.md). What each image holds is checked without a cluster in
tests/contract/test_image_builds.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plugins.local_cluster import ssh
from plugins.mpi import HELLO

pytestmark = pytest.mark.e2e

NODES = ["compute-local-1", "compute-local-2", "compute-local-3"]


@pytest.fixture
def cluster(local_cluster: Path) -> Path:
    return local_cluster


def test_a_program_built_with_mpicc_on_the_login_pod_runs_on_three_nodes(cluster: Path) -> None:
    # mpirun in the job, as in test_local_up_training: 26.05 has no PMIx plugin.
    name = f"mpi-hello-{time.time_ns()}"
    script = (
        f"cat >{name}.c <<'EOF'\n{HELLO}EOF\n"
        f"mpicc -O2 -o {name} {name}.c || exit\n"
        f"sbatch --parsable --wait -N3 --ntasks-per-node=1 -t 1 -o {name}.out"
        f" --wrap 'mpirun ./{name}'\n"
        f"echo exit=$?; cat {name}.out; rm -f {name} {name}.c {name}.out"
    )
    out = ssh(cluster, script, timeout=180)
    assert "exit=0" in out, out
    ranks = sorted(line.split() for line in out.splitlines() if line.startswith("rank "))
    assert [rank[:4] for rank in ranks] == [["rank", str(r), "of", "3"] for r in range(3)], out
    assert sorted(rank[5] for rank in ranks) == NODES
    assert {rank[7] for rank in ranks} == {"6"}


def test_the_login_pod_has_the_tools_and_no_slurm_daemon(cluster: Path) -> None:
    # As the researcher: /usr/sbin is not on a plain user's PATH, so looked up by path.
    tools = "gcc g++ make mpicc python3 vi nano less git curl sbatch squeue"
    daemons = "slurmctld slurmd slurmdbd slurmrestd mariadbd mysqld"
    out = ssh(
        cluster,
        f"for t in {tools}; do command -v $t >/dev/null || echo missing $t; done; "
        f"for d in {daemons}; do test -e /usr/sbin/$d && echo found $d; done; "
        "python3 -m venv --without-pip venv-probe && venv-probe/bin/python -c 'print(42)'; "
        "rm -rf venv-probe",
    )
    assert out.split() == ["42"], out
