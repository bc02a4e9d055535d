"""Reserved ids, directory listings and token lifespans on the README's cluster
(`sunk local up`: both charts, the in-chart slapd, nslcd beside every Slurm
daemon, the real scheduler and `sunk tokens`; docs/security.md).

- A tenancy granting SlurmUser's uid (64030) or an admin's (64040) is refused
  naming the rule: by `helm upgrade` before anything changes, and by the
  scheduler (an Event on the ConfigMap) and `sunk tokens` (no token) when the
  ConfigMap is edited by hand.
- A directory user with an admin's uid (64040), a group with SlurmUser's gid,
  a user in root's group: no Slurm pod resolves them, the user cannot log in;
  a directory range reaching the reserved ids fails `helm upgrade` naming the
  rule.
- A directory of more than slapd's 500-entry size limit lists whole through
  nslcd (paged), where a plain search is cut at 500.
- `scontrol token` gives a user no token living longer than the cap.
- The JWT key rotates by docs/charts.md's steps.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.local_cluster import kubectl, poll_ssh, ssh, summary
from plugins.local_cluster import sunk as sunk_local
from sunk_testbed import charts
from sunk_testbed.bed import CLUSTER_RELEASE, NAMESPACE, RELEASE, Bed
from sunk_testbed.helm import Helm, HelmError, ensure_helm

pytestmark = pytest.mark.e2e

BASE = "dc=sunk,dc=local"
LDAPI = "ldapi://%2Frun%2Fslapd%2Fldapi"
TENANCY = f"{CLUSTER_RELEASE}-scheduler-tenancy"
TENANT_TOKENS = f"{CLUSTER_RELEASE}-scheduler-tenant-tokens"
BULK = 600  # over slapd's default size limit (500)


@pytest.fixture
def cluster(local_cluster: Path) -> Path:
    if summary(local_cluster)["slurm"].get("identity") != "ldap":
        pytest.skip("this `sunk local up` keeps its users in /etc/passwd (identity static)")
    return local_cluster


def _helm(cluster: Path) -> Helm:
    kubeconfig = Path(summary(cluster)["kubernetes"]["kubeconfig"])
    return Helm(ensure_helm(print), kubeconfig, cluster / "cluster" / "helm")


def _values(cluster: Path, name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((cluster / "cluster" / name).read_text())
    return loaded


def _slapd(cluster: Path, *argv: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """A tool in the slapd container, as slapd's own uid over ldapi:// (SASL
    EXTERNAL): what an admin does with `kubectl exec`."""
    return kubectl(
        cluster, "exec", "-i", "-n", NAMESPACE, f"{RELEASE}-ldap-0", "-c", "slapd", "--",
        argv[0], "-Q", "-Y", "EXTERNAL", "-H", LDAPI, *argv[1:],
        input=input, timeout=120,
    )  # fmt: skip


def _directory(cluster: Path, tool: str, ldif: str) -> None:
    proc = _slapd(cluster, tool, input=ldif)
    assert proc.returncode == 0, f"{tool}: {proc.stdout}{proc.stderr}"


def _in_pod(
    cluster: Path, pod: str, container: str, command: str
) -> subprocess.CompletedProcess[str]:
    return kubectl(
        cluster, "exec", "-n", NAMESPACE, pod, "-c", container, "--", "sh", "-c", command,
        timeout=120,
    )  # fmt: skip


def _configmap(cluster: Path) -> dict[str, Any]:
    proc = kubectl(cluster, "get", "configmap", "-n", NAMESPACE, TENANCY, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    loaded: dict[str, Any] = json.loads(proc.stdout)
    return loaded


def _tenant_token_uids(cluster: Path) -> set[str]:
    proc = kubectl(cluster, "get", "secret", "-n", NAMESPACE, TENANT_TOKENS, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout).get("data") or {})


def _events(cluster: Path, reason: str) -> list[str]:
    proc = kubectl(
        cluster, "get", "events", "-n", NAMESPACE, "-o", "json",
        "--field-selector", f"involvedObject.name={TENANCY},reason={reason}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [event.get("message", "") for event in json.loads(proc.stdout)["items"]]


def _replace_tenancy(cluster: Path, text: str) -> None:
    patch = json.dumps({"data": {"tenancy.yaml": text}})
    proc = kubectl(cluster, "patch", "configmap", "-n", NAMESPACE, TENANCY, "-p", patch)
    assert proc.returncode == 0, proc.stderr


def test_a_tenancy_granting_slurmusers_or_an_admins_uid_is_refused_naming_the_rule(
    cluster: Path,
) -> None:
    before = _configmap(cluster)["data"]["tenancy.yaml"]
    tokens = _tenant_token_uids(cluster)
    assert tokens == {"2000"}  # the researcher's, the one tenant `sunk local up` grants

    # helm: refused before anything is applied.
    values = _values(cluster, "sunk-values.yaml")
    granted = {"namespaces": ["team-x"], "uids": "64030", "user": 64030}
    values["scheduler"]["tenants"] = [*values["scheduler"]["tenants"], granted]
    with pytest.raises(HelmError) as refused:
        _helm(cluster).upgrade_install(
            CLUSTER_RELEASE,
            "sunk-cluster",
            NAMESPACE,
            values,
            values_file=cluster / "cluster" / "sunk-values-reserved.yaml",
        )
    assert "scheduler.tenants[1].uids: 64030 holds reserved ids 64030" in str(refused.value.stderr)
    assert _configmap(cluster)["data"]["tenancy.yaml"] == before

    # By hand, past helm: the scheduler refuses the edit with an Event naming
    # the rule and keeps the tenancy it had; `sunk tokens` mints nothing for it,
    # even with `reserved` emptied (the charts' ids stay reserved).
    document = yaml.safe_load(before)
    document["reserved"] = []
    document["tenants"].append({"namespaces": ["team-x"], "uids": "64040", "user": 64040})
    started = time.monotonic()
    _replace_tenancy(cluster, yaml.safe_dump(document))
    try:
        deadline = time.monotonic() + 60
        while not (events := _events(cluster, "InvalidTenancy")):
            assert time.monotonic() < deadline, "no InvalidTenancy Event"
            time.sleep(1)
        print(f"edit -> InvalidTenancy Event: {time.monotonic() - started:.1f}s: {events[-1]}")
        assert any("tenants.1.uids: 64040 holds reserved ids 64040" in e for e in events), events
        time.sleep(5)  # `sunk tokens` has read the edit too (it logs and keeps the last)
        assert _tenant_token_uids(cluster) == tokens
    finally:
        _replace_tenancy(cluster, before)


def test_a_directory_entry_with_a_reserved_id_is_no_one(cluster: Path, tmp_path: Path) -> None:
    """A user with sunk-operator's Admin uid (64040), a group with SlurmUser's gid listing
    the researcher, a user whose primary group is root's: nslcd's filters keep
    them from every Slurm pod; the user cannot log in. A user beside them in
    the directory range resolves (the filters' ranges work on slapd)."""
    key = tmp_path / "id_ed25519"
    public = charts.new_ssh_key(key)

    def user(name: str, uid: int, gid: int) -> str:
        return (
            f"dn: uid={name},ou=people,{BASE}\n"
            "objectClass: account\nobjectClass: posixAccount\nobjectClass: ldapPublicKey\n"
            f"uid: {name}\ncn: {name}\nuidNumber: {uid}\ngidNumber: {gid}\n"
            f"homeDirectory: /tmp\nloginShell: /bin/bash\nsshPublicKey: {public}\n\n"
        )

    _directory(
        cluster,
        "ldapadd",
        user("mallory", 64040, 2000)
        + user("oscar", 2301, 0)
        + user("trent", 2302, 2000)
        + f"dn: cn=slurmish,ou=groups,{BASE}\nobjectClass: posixGroup\n"
        "cn: slurmish\ngidNumber: 64030\nmemberUid: researcher\n",
    )
    try:
        lookups = (
            "getent passwd mallory; echo rc=$?; getent passwd oscar; echo rc=$?;"
            " getent group slurmish; echo rc=$?; getent passwd trent | cut -d: -f3;"
            " getent passwd 64040 | cut -d: -f1; id -G researcher"
        )
        for pod, container in (
            (f"{RELEASE}-login-0", "sshd"),
            (f"{RELEASE}-slurmctld-0", "slurmctld"),
        ):
            proc = _in_pod(cluster, pod, container, lookups)
            assert proc.returncode == 0, proc.stderr
            out = proc.stdout.split()
            # Not found (2) for each; trent resolves; uid 64040 is the local admin.
            assert out[:3] == ["rc=2", "rc=2", "rc=2"], (pod, proc.stdout)
            assert out[3:5] == ["2302", "sunk-operator"], (pod, proc.stdout)
            assert "64030" not in out[5:], (pod, proc.stdout)
        login = Bed(cluster).login_address()
        for name in ("mallory", "oscar"):
            argv = charts.ssh_argv(key, name, login, ["id"])
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            assert proc.returncode == 255, proc.stdout
            assert "Permission denied" in proc.stderr, proc.stderr
        argv = charts.ssh_argv(key, "trent", login, ["id -u"])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert (proc.returncode, proc.stdout.strip()) == (0, "2302"), proc.stderr
    finally:
        _directory(
            cluster,
            "ldapdelete",
            "".join(f"uid={n},ou=people,{BASE}\n" for n in ("mallory", "oscar", "trent"))
            + f"cn=slurmish,ou=groups,{BASE}\n",
        )

    # A directory range reaching the admins' uids: refused by helm, naming the rule.
    values = _values(cluster, "slurm-values.yaml")
    values["identity"]["ldap"]["maxUid"] = 65000
    with pytest.raises(HelmError) as refused:
        _helm(cluster).upgrade_install(
            RELEASE, "slurm", NAMESPACE, values,
            values_file=cluster / "cluster" / "slurm-values-reserved.yaml",
        )  # fmt: skip
    assert "identity.ldap.minUid..maxUid (1000-65000) holds reserved ids 64030" in str(
        refused.value.stderr
    )


def test_a_directory_of_more_than_500_users_lists_whole(cluster: Path) -> None:
    """slapd cuts a plain search at its size limit (500); nslcd reads in pages,
    so `getent` in the login pod and in the accounts loop beside slurmdbd
    lists every user."""
    names = [f"bulk{i:04d}" for i in range(BULK)]
    ldif = "".join(
        f"dn: uid={name},ou=people,{BASE}\nobjectClass: account\nobjectClass: posixAccount\n"
        f"uid: {name}\ncn: {name}\nuidNumber: {10000 + i}\ngidNumber: 10000\n"
        "homeDirectory: /tmp\nloginShell: /bin/bash\n\n"
        for i, name in enumerate(names)
    )
    started = time.monotonic()
    _directory(cluster, "ldapadd", ldif)
    print(f"ldapadd of {BULK} users: {time.monotonic() - started:.1f}s")
    try:
        plain = _slapd(
            cluster, "ldapsearch", "-LLL", "-b", f"ou=people,{BASE}", "(objectClass=posixAccount)",
            "uid",
        )  # fmt: skip
        assert plain.returncode == 4, plain.stderr  # sizeLimitExceeded
        assert plain.stdout.count("\nuid: ") + plain.stdout.startswith("uid: ") <= 500
        count = "getent -s ldap passwd | grep -c '^bulk'"
        listed = _in_pod(cluster, f"{RELEASE}-login-0", "sshd", count)
        assert listed.stdout.strip() == str(BULK), f"{listed.stdout}{listed.stderr}"
        dbd = _in_pod(
            cluster,
            _pod_of(cluster, "slurmdbd"),
            "directory-accounts",
            count,
        )
        assert dbd.stdout.strip() == str(BULK), f"{dbd.stdout}{dbd.stderr}"
    finally:
        _directory(cluster, "ldapdelete", "".join(f"uid={n},ou=people,{BASE}\n" for n in names))


def _pod_of(cluster: Path, component: str) -> str:
    proc = kubectl(
        cluster, "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}",
        "-o", "jsonpath={.items[0].metadata.name}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout, f"no {component} pod"
    return proc.stdout


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    loaded: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return loaded


def test_scontrol_token_gives_a_user_no_token_longer_than_the_cap(cluster: Path) -> None:
    """slurm.conf's AuthAltParameters max_token_lifespan (the chart's
    jwt.maxTokenLifespan, 3600): a user's longer ask is refused or cut."""
    short = ssh(cluster, "scontrol token lifespan=600").strip()
    claims = _claims(short.removeprefix("SLURM_JWT="))
    assert claims["exp"] - claims["iat"] == 600
    assert claims["sun"] == "researcher"
    proc = sunk_local(cluster, "ssh", "scontrol token lifespan=999999", timeout=120)
    print(f"scontrol token lifespan=999999: rc={proc.returncode} {proc.stdout}{proc.stderr}")
    if proc.returncode == 0 and "SLURM_JWT=" in proc.stdout:
        claims = _claims(proc.stdout.strip().split("SLURM_JWT=", 1)[1])
        assert claims["exp"] - claims["iat"] <= 3600
    else:
        assert proc.returncode != 0


def _token_of(cluster: Path, secret: str) -> str:
    proc = kubectl(
        cluster, "get", "secret", "-n", NAMESPACE, secret, "-o", "jsonpath={.data.token}"
    )
    assert proc.returncode == 0, proc.stderr
    return base64.b64decode(proc.stdout).decode()


def _slurm_takes(cluster: Path, token: str) -> bool:
    """Whether slurmctld takes `token` (from the login pod, the token on stdin)."""
    proc = kubectl(
        cluster, "exec", "-i", "-n", NAMESPACE, f"{RELEASE}-login-0", "-c", "sshd", "--",
        "sh", "-c", "read -r t; SLURM_JWT=$t squeue -h -o %i >/dev/null",
        input=token + "\n", timeout=60,
    )  # fmt: skip
    return proc.returncode == 0


def test_the_jwt_key_rotates_as_charts_md_says(cluster: Path, tmp_path: Path) -> None:
    """The steps of docs/charts.md ("Rotating the JWT key"): the key replaced in
    its Secret, slurmctld, slurmdbd and `sunk tokens` restarted. Tokens of the
    old key are refused from then on; sunk's components work again once they
    read the new tokens (the syncer drains a cordoned node under its name)."""
    old = _token_of(cluster, f"{CLUSTER_RELEASE}-syncer-token")
    assert _slurm_takes(cluster, old)
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(os.urandom(64))
    patch = tmp_path / "patch.json"
    patch.write_text(
        json.dumps({"data": {"jwt_hs256.key": base64.b64encode(key.read_bytes()).decode()}})
    )
    started = time.monotonic()
    steps = [
        (
            "patch",
            "secret",
            "-n",
            NAMESPACE,
            f"{RELEASE}-jwt",
            "--type",
            "merge",
            "--patch-file",
            str(patch),
        ),
        (
            "rollout",
            "restart",
            "-n",
            NAMESPACE,
            f"statefulset/{RELEASE}-slurmctld",
            f"deployment/{RELEASE}-slurmdbd",
        ),
        ("rollout", "restart", "-n", NAMESPACE, f"deployment/{CLUSTER_RELEASE}-tokens"),
        (
            "rollout",
            "status",
            "-n",
            NAMESPACE,
            f"statefulset/{RELEASE}-slurmctld",
            "--timeout=300s",
        ),
        ("rollout", "status", "-n", NAMESPACE, f"deployment/{RELEASE}-slurmdbd", "--timeout=300s"),
        (
            "rollout",
            "status",
            "-n",
            NAMESPACE,
            f"deployment/{CLUSTER_RELEASE}-tokens",
            "--timeout=300s",
        ),
    ]
    for step in steps:
        proc = kubectl(cluster, *step, timeout=320)
        assert proc.returncode == 0, f"{step}: {proc.stderr}"
    print(f"key replaced, readers restarted: {time.monotonic() - started:.1f}s")
    assert not _slurm_takes(cluster, old)
    deadline = time.monotonic() + 120
    while not _slurm_takes(cluster, new := _token_of(cluster, f"{CLUSTER_RELEASE}-syncer-token")):
        assert time.monotonic() < deadline, "no token of the new key"
        time.sleep(2)
    assert new != old
    # The syncer (its token file replaced by the kubelet) drains a cordon again.
    assert kubectl(cluster, "cordon", "local-3").returncode == 0
    try:
        poll_ssh(
            cluster, "scontrol show node compute-local-3", lambda out: "[sunk-syncer@" in out, 180
        )
        print(f"rotation -> the syncer acts in Slurm again: {time.monotonic() - started:.1f}s")
    finally:
        assert kubectl(cluster, "uncordon", "local-3").returncode == 0
    poll_ssh(cluster, "sinfo -h -n compute-local-3 -o %t", lambda s: "drain" not in s, 120)
