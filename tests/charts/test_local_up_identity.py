"""Directory users on the README's cluster (`sunk local up`: the slurm chart's
in-chart OpenLDAP, nslcd beside every Slurm daemon, sshd reading keys from
the directory; docs/identity.md). A user added with `ldapadd` logs in with
the directory's key, submits a job that runs and is accounted under the
directory's uid, all without a pod restarted; once deleted, the user is
refused. The static provider is
the chart e2e's (tests/charts/test_charts_e2e.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from plugins.local_cluster import kubectl, poll_ssh, running_slurm_pods, ssh, summary
from sunk_testbed import charts
from sunk_testbed.bed import Bed

pytestmark = pytest.mark.e2e

NAME = "newcomer"
UID = 2100
GROUP = "newcomers"
GID = 2101
BASE = "dc=sunk,dc=local"
LDAPI = "ldapi://%2Frun%2Fslapd%2Fldapi"


@pytest.fixture
def cluster(local_cluster: Path) -> Path:
    if summary(local_cluster)["slurm"].get("identity") != "ldap":
        pytest.skip("this `sunk local up` keeps its users in /etc/passwd (identity static)")
    return local_cluster


def _directory(cluster: Path, tool: str, ldif: str) -> None:
    """`ldapadd`/`ldapdelete` in the slapd container, as slapd's own uid over
    ldapi:// (SASL EXTERNAL): what an admin does with `kubectl exec`."""
    proc = kubectl(
        cluster,
        "exec", "-i", "-n", "slurm", "slurm-ldap-0", "-c", "slapd", "--",
        tool, "-Q", "-Y", "EXTERNAL", "-H", LDAPI,
        input=ldif,
    )  # fmt: skip
    assert proc.returncode == 0, f"{tool}: {proc.stdout}{proc.stderr}"


def _ssh(cluster: Path, key: Path, command: str) -> subprocess.CompletedProcess[str]:
    login = Bed(cluster).login_address()  # the login pod's address now
    argv = charts.ssh_argv(key, NAME, login, [command])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_a_directory_user_logs_in_runs_a_job_under_its_uid_and_is_refused_once_deleted(
    cluster: Path, tmp_path: Path
) -> None:
    key = tmp_path / "id_ed25519"
    public = charts.new_ssh_key(key)
    home = Path(summary(cluster)["slurm"]["home"]) / NAME
    home.mkdir(exist_ok=True)
    os.chown(home, UID, GID)
    home.chmod(0o700)
    before = running_slurm_pods(cluster)
    assert _ssh(cluster, key, "true").returncode == 255  # not in the directory yet

    started = time.monotonic()
    _directory(
        cluster,
        "ldapadd",
        f"dn: uid={NAME},ou=people,{BASE}\n"
        "objectClass: account\nobjectClass: posixAccount\nobjectClass: ldapPublicKey\n"
        f"uid: {NAME}\ncn: {NAME}\nuidNumber: {UID}\ngidNumber: {GID}\n"
        f"homeDirectory: /home/{NAME}\nloginShell: /bin/bash\nsshPublicKey: {public}\n\n"
        f"dn: cn={GROUP},ou=groups,{BASE}\nobjectClass: posixGroup\n"
        f"cn: {GROUP}\ngidNumber: {GID}\nmemberUid: {NAME}\n",
    )
    try:
        proc = _ssh(cluster, key, "id -u; id -gn; sbatch --parsable -o /dev/null --wrap 'id -u'")
        assert proc.returncode == 0, proc.stderr
        uid, group, job = proc.stdout.split()
        assert (uid, group) == (str(UID), GROUP)
        print(f"ldapadd -> ssh and sbatch: {time.monotonic() - started:.1f}s")

        # slurmctld (its own nslcd) takes the job as the directory's uid, a
        # slurmd pod runs it as that uid, slurmdbd accounts it under it.
        deadline = time.monotonic() + 60
        while True:
            proc = _ssh(cluster, key, f"sacct -n -X -P -j {job} -o User,UID,State")
            fields = proc.stdout.strip().split("|")
            if fields[-1:] == ["COMPLETED"] or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert fields == [NAME, str(UID), "COMPLETED"], f"{proc.stdout}{proc.stderr}"
        print(f"ldapadd -> job COMPLETED in sacct: {time.monotonic() - started:.1f}s")
        _partition_of_the_directory_group_takes_only_its_members(cluster, key)
    finally:
        _directory(
            cluster, "ldapdelete", f"uid={NAME},ou=people,{BASE}\ncn={GROUP},ou=groups,{BASE}\n"
        )

    refused = _ssh(cluster, key, "true")
    assert refused.returncode == 255, refused.stdout
    assert "Permission denied" in refused.stderr, refused.stderr
    assert running_slurm_pods(cluster) == before  # nothing restarted, nothing replaced


def _scontrol(cluster: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return kubectl(
        cluster, "exec", "-n", "slurm", "slurm-slurmctld-0", "-c", "slurmctld", "--",
        "scontrol", *args,
    )  # fmt: skip


def _partition_of_the_directory_group_takes_only_its_members(cluster: Path, key: Path) -> None:
    """A partition with `AllowGroups` naming the directory's group (made at run
    time, as an admin would, then removed): its member's job runs there, the
    researcher's (not a member) is held back by slurmctld."""
    created = _scontrol(
        cluster, "create", f"PartitionName={GROUP}", "Nodes=ALL", f"AllowGroups={GROUP}"
    )
    assert created.returncode == 0, created.stderr
    outsider = ""
    try:
        member = _ssh(cluster, key, f"sbatch --parsable -p {GROUP} -o /dev/null --wrap true")
        assert member.returncode == 0, member.stderr
        outsider = ssh(cluster, f"sbatch --parsable -p {GROUP} -o /dev/null --wrap true").strip()
        job = member.stdout.strip()
        deadline = time.monotonic() + 60
        while (state := _ssh(cluster, key, f"sacct -n -X -P -j {job} -o State")).stdout.strip() != (
            "COMPLETED"
        ):
            assert time.monotonic() < deadline, f"{state.stdout}{state.stderr}"
            time.sleep(1)
        held = ssh(cluster, f"squeue -h -j {outsider} -o '%T|%r'").strip()
        assert held.startswith("PENDING|"), held
    finally:
        if outsider:
            ssh(cluster, f"scancel {outsider}")
            poll_ssh(
                cluster,
                f"squeue -h -j {outsider} -o %T 2>/dev/null || true",
                lambda out: not out.strip(),
                30,
            )
        deleted = _scontrol(cluster, "delete", f"PartitionName={GROUP}")
        assert deleted.returncode == 0, deleted.stderr
