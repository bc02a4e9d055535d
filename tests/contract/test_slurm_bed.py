"""The Slurm half of the test bed itself: a second, small cluster next to the session's.

Runs alongside the session cluster on purpose (separate state dir, own
ports), which is how several beds share one machine.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sunk_testbed.procs import Supervisor, free_port
from sunk_testbed.slurm_cluster import DYNAMIC_FEATURE, PARTITION, SlurmAccess, SlurmCluster

pytestmark = pytest.mark.contract


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone meanwhile
        return ""


def wait_until(what: str, check: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


START_SECONDS: list[float] = []


@pytest.fixture(scope="module")
def side(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    state = Path(tempfile.mkdtemp(prefix="sunk-tb2-", dir="/tmp"))
    # MinJobAge=7, not the bed's 30: any setting of its own shows extra_conf
    # reaching slurmctld (the test bed's Slurm itself, no chart).
    cluster = SlurmCluster(
        state, Supervisor(state), slurm_cluster.rootfs, nodes=1, extra_conf=["MinJobAge=7"]
    )
    try:
        started = time.monotonic()
        cluster.start()
        START_SECONDS.append(time.monotonic() - started)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


def test_start_is_fast_and_idempotent(side: SlurmCluster) -> None:
    assert START_SECONDS[0] < 15  # ~2 s on a warm cache, less when the machine is idle
    pids = {name: side.supervisor.running(name) for name in side.supervisor.names()}
    started = time.monotonic()
    again = side.start()
    assert time.monotonic() - started < 1
    assert again == side.access()
    assert {name: side.supervisor.running(name) for name in side.supervisor.names()} == pids


def test_runs_alongside_the_session_cluster(side: SlurmCluster, slurm_access: SlurmAccess) -> None:
    mine = side.access()
    assert mine.restd_url != slurm_access.restd_url
    assert mine.slurmctld_port != slurm_access.slurmctld_port
    assert mine.jwt_key.read_bytes() != slurm_access.jwt_key.read_bytes()
    assert side.run(["sinfo", "-h", "-o", "%D"]).stdout.split() == ["1"]


def test_extra_conf_is_applied(side: SlurmCluster) -> None:
    config = side.run(["scontrol", "show", "config"]).stdout
    assert any(line.split() == ["MinJobAge", "=", "7", "sec"] for line in config.splitlines())


def test_keys_are_private_to_their_daemons(side: SlurmCluster) -> None:
    access = side.access()
    for key, owner in ((access.jwt_key, "slurm"), (access.munge_key, "munge")):
        st = key.stat()
        assert st.st_mode & 0o777 == 0o600
        assert (st.st_uid, st.st_gid) == side._user_ids(owner)


def test_a_dynamic_node_joins_the_default_partition(side: SlurmCluster) -> None:
    # Own Port= per node: on one address several dynamic slurmd can coexist.
    (side.spool_slurmd / "dyn1").mkdir(exist_ok=True)
    conf = f"Feature={DYNAMIC_FEATURE} CPUs=1 Port={free_port()}"
    argv = side.sandbox().argv(["slurmd", "-D", "-Z", "-N", "dyn1", "--conf", conf])
    log = (side.dir / "dyn1.log").open("wb")
    subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    # Left running: stop() must catch it (test below).

    def joined() -> bool:
        out = side.run(["sinfo", "-h", "-N", "-n", "dyn1", "-o", "%t %P"], check=False).stdout
        return out.split() == ["idle", f"{PARTITION}*"]

    wait_until("dyn1 idle in the default partition", joined)
    assert side.run(["srun", "-w", "dyn1", "hostname"]).returncode == 0


def test_stop_leaves_no_process_and_no_mount(side: SlurmCluster) -> None:
    # A job whose steps outlive slurmd, as they do by design.
    side.run(["sbatch", "--wrap", "sleep 300"], user=side.access().plain_user)
    wait_until(
        "the job running",
        lambda: side.run(["squeue", "-h", "-o", "%t"]).stdout.split() == ["R"],
    )
    # RUNNING in slurmctld comes a moment before slurmd has started the step.
    wait_until(
        "the job's slurmstepd",
        lambda: any(command_of(pid) == "slurmstepd" for pid in side.sandboxed_pids()),
    )
    side.stop()
    assert side.sandboxed_pids() == []
    assert side.supervisor.names() == []
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True)
    assert str(side.dir) not in mounts.stdout
    side.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        side.access()
