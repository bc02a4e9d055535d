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
import yaml

from plugins.local_cluster import kubectl, poll_ssh, running_slurm_pods, ssh, summary, upgrade_slurm
from sunk_testbed import charts
from sunk_testbed.bed import NAMESPACE, RELEASE, Bed

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
        # The first login makes the home on the shared claim (homes.createOnLogin).
        proc = _ssh(cluster, key, "id -u; id -gn; cd && stat -c '%u:%g %a' . && pwd")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [str(UID), GROUP, f"{UID}:{GID}", "700", f"/home/{NAME}"]
        print(f"ldapadd -> ssh: {time.monotonic() - started:.1f}s")
        # Jobs need an association (AccountingStorageEnforce, the chart's
        # default): the accounts loop's next pass makes it for the new member.
        deadline = time.monotonic() + 60
        while (
            proc := _ssh(cluster, key, "sbatch --parsable -o /dev/null --wrap 'id -u'")
        ).returncode != 0 and time.monotonic() < deadline:
            assert "Invalid account" in proc.stderr, proc.stderr
            time.sleep(1)
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip()
        print(f"ldapadd -> sbatch taken: {time.monotonic() - started:.1f}s")

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
        _the_directory_group_is_an_account(cluster, key)
    finally:
        _directory(
            cluster, "ldapdelete", f"uid={NAME},ou=people,{BASE}\ncn={GROUP},ou=groups,{BASE}\n"
        )
    # The group gone, its account goes too (its job ended: nothing refuses).
    poll_ssh(
        cluster,
        f"sacctmgr -n -P show account {GROUP} format=account",
        lambda out: not out.strip(),
        60,
    )

    refused = _ssh(cluster, key, "true")
    assert refused.returncode == 255, refused.stdout
    assert "Permission denied" in refused.stderr, refused.stderr
    assert running_slurm_pods(cluster) == before  # nothing restarted, nothing replaced


def test_a_group_member_with_a_reserved_uid_is_not_taken_and_the_log_names_the_rule(
    cluster: Path,
) -> None:
    """A directory group (every group is an account on the local cluster)
    naming a member whose uid is sunk-operator's Admin uid (64040), beside one
    in the directory range: the accounts loop beside slurmdbd makes the
    account with the one in range only and logs the other's refusal, naming
    the range and the reserved ids (nslcd's filters hide the entry, so the
    loop names every rule that hides one)."""
    group, gid = "mixed", 2400
    users = (("mallory", 64040), ("trent", 2401))
    _directory(
        cluster,
        "ldapadd",
        "".join(
            f"dn: uid={name},ou=people,{BASE}\nobjectClass: account\nobjectClass: posixAccount\n"
            f"uid: {name}\ncn: {name}\nuidNumber: {uid}\ngidNumber: {gid}\n"
            "homeDirectory: /tmp\nloginShell: /bin/bash\n\n"
            for name, uid in users
        )
        + f"dn: cn={group},ou=groups,{BASE}\nobjectClass: posixGroup\n"
        f"cn: {group}\ngidNumber: {gid}\nmemberUid: mallory\nmemberUid: trent\n",
    )
    try:
        poll_ssh(
            cluster,
            f"sacctmgr -n -P show association account={group} format=account,user",
            lambda out: f"{group}|trent" in out.split(),
            60,
        )
        associations = ssh(cluster, f"sacctmgr -n -P show association account={group} format=user")
        assert "mallory" not in associations.split(), associations
        pod = kubectl(
            cluster, "get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=slurmdbd",
            "-o", "jsonpath={.items[0].metadata.name}",
        ).stdout  # fmt: skip
        logs = kubectl(cluster, "logs", "-n", NAMESPACE, pod, "-c", "directory-accounts").stdout
        told = [line for line in logs.splitlines() if "member mallory not taken" in line]
        assert len(told) == 1, logs[-3000:]  # once, not every pass
        assert told[0].startswith(f"group {group}: member mallory not taken: "), told
        for rule in ("identity.ldap.minUid..maxUid (1000-59999)", "identity.reservedIds"):
            assert rule in told[0], told
    finally:
        _directory(
            cluster,
            "ldapdelete",
            "".join(f"uid={name},ou=people,{BASE}\n" for name, _ in users)
            + f"cn={group},ou=groups,{BASE}\n",
        )
    poll_ssh(
        cluster,
        f"sacctmgr -n -P show account {group} format=account",
        lambda out: not out.strip(),
        60,
    )


def _the_directory_group_is_an_account(cluster: Path, key: Path) -> None:
    """`identity.ldap.accounts` (every group, every 5 s on the local cluster):
    the group is an account of sunk's marking, its member has an association
    and charges a job to it, and sacct says so."""
    started = time.monotonic()
    poll_ssh(
        cluster,
        f"sacctmgr -n -P show association account={GROUP} format=account,user",
        lambda out: f"{GROUP}|{NAME}" in out.split(),
        60,
    )
    print(f"group -> Slurm account with its member: {time.monotonic() - started:.1f}s")
    account = ssh(cluster, f"sacctmgr -n -P show account {GROUP} format=account,organization")
    assert account.split() == [f"{GROUP}|sunk-directory"], account
    proc = _ssh(cluster, key, f"sbatch --parsable -A {GROUP} -o /dev/null --wrap true")
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    charged = poll_ssh(
        cluster,
        f"sacct -n -X -P -j {job} -o Account,User,State",
        lambda out: out.strip().endswith("COMPLETED"),
        60,
    )
    assert charged.split() == [f"{GROUP}|{NAME}|COMPLETED"], charged


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
        # -a: squeue hides jobs of partitions closed to the user's groups.
        held = ssh(cluster, f"squeue -a -h -j {outsider} -o '%T|%r'").strip()
        assert held.startswith("PENDING|"), held
    finally:
        if outsider:
            ssh(cluster, f"scancel {outsider}")
            poll_ssh(
                cluster,
                f"squeue -a -h -j {outsider} -o %T 2>/dev/null || true",
                lambda out: not out.strip(),
                30,
            )
        deleted = _scontrol(cluster, "delete", f"PartitionName={GROUP}")
        assert deleted.returncode == 0, deleted.stderr


PASSWORD = "correct horse battery staple"


def _slurm_release(cluster: Path, password_login: bool) -> None:
    """`helm upgrade` of the local cluster's slurm release with
    `identity.ldap.passwordLogin` set, then until ssh with the researcher's
    key works on the (replaced) login pod."""
    files = cluster / "cluster"
    values = yaml.safe_load((files / "slurm-values.yaml").read_text())
    values["identity"]["ldap"]["passwordLogin"] = password_login
    upgrade_slurm(cluster, values, "slurm-values-password.yaml")
    rolled = kubectl(
        cluster, "rollout", "status", "-n", NAMESPACE, f"statefulset/{RELEASE}-login",
        "--timeout=180s", timeout=200,
    )  # fmt: skip
    assert rolled.returncode == 0, rolled.stderr
    poll_ssh(cluster, "id -u", lambda out: out.strip().isdigit(), 120)


def _password_ssh(cluster: Path, password: str) -> subprocess.CompletedProcess[str]:
    """ssh as the directory user with a password only (no key offered), as a
    person types it: OpenSSH reads it from SSH_ASKPASS."""
    askpass = cluster / "cluster" / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{password}'\n")
    askpass.chmod(0o700)
    login = Bed(cluster).login_address()
    argv = [
        "ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5", "-o", "PubkeyAuthentication=no",
        "-o", "PreferredAuthentications=keyboard-interactive,password",
        "-o", "NumberOfPasswordPrompts=1", f"{NAME}@{login}", "id -u",
    ]  # fmt: skip
    env = {**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force"}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_with_password_login_the_directorys_password_logs_in_and_a_wrong_one_does_not(
    cluster: Path,
) -> None:
    """`identity.ldap.passwordLogin` (off in `sunk local up`, which logs in by
    key): a `helm upgrade` turns it on; a password an admin set with
    `ldappasswd` logs the user in over ssh, a wrong one is refused; the upgrade
    back turns it off again (the login pod is replaced each time)."""
    _directory(
        cluster,
        "ldapadd",
        f"dn: uid={NAME},ou=people,{BASE}\n"
        "objectClass: account\nobjectClass: posixAccount\n"
        f"uid: {NAME}\ncn: {NAME}\nuidNumber: {UID}\ngidNumber: {GID}\n"
        f"homeDirectory: /home/{NAME}\nloginShell: /bin/bash\n",
    )
    try:
        changed = kubectl(
            cluster, "exec", "-n", NAMESPACE, f"{RELEASE}-ldap-0", "-c", "slapd", "--",
            "ldappasswd", "-Q", "-Y", "EXTERNAL", "-H", LDAPI, "-s", PASSWORD,
            f"uid={NAME},ou=people,{BASE}",
        )  # fmt: skip
        assert changed.returncode == 0, changed.stderr
        _slurm_release(cluster, password_login=True)
        try:
            good = _password_ssh(cluster, PASSWORD)
            assert (good.returncode, good.stdout.strip()) == (0, str(UID)), good.stderr
            wrong = _password_ssh(cluster, "not " + PASSWORD)
            assert wrong.returncode == 255, wrong.stdout
            assert "Permission denied" in wrong.stderr, wrong.stderr
        finally:
            _slurm_release(cluster, password_login=False)
        refused = _password_ssh(cluster, PASSWORD)  # keys only again
        assert refused.returncode == 255, refused.stdout
    finally:
        _directory(cluster, "ldapdelete", f"uid={NAME},ou=people,{BASE}\n")
