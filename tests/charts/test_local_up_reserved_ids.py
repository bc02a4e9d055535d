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
- sunk's signing key rotates by docs/charts.md's steps with no refused call.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.local_cluster import cluster_helm, kubectl, poll_ssh, ssh, summary
from plugins.local_cluster import sunk as sunk_local
from sunk_testbed import charts
from sunk_testbed.bed import CLUSTER_RELEASE, NAMESPACE, RELEASE, Bed
from sunk_testbed.helm import HelmError

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
        cluster_helm(cluster).upgrade_install(
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
        cluster_helm(cluster).upgrade_install(
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


def _kid(token: str) -> str:
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header["alg"] == "RS256", header
    kid: str = header["kid"]
    return kid


def _metrics(cluster: Path, component: str) -> dict[str, float]:
    """The component's /metrics, read inside its pod (the sunk image's python)."""
    read = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9090/metrics').read().decode())"
    proc = kubectl(
        cluster, "exec", "-n", NAMESPACE, f"deployment/{CLUSTER_RELEASE}-{component}", "--",
        "python3", "-c", read, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    values = {}
    for line in proc.stdout.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _why(cluster: Path) -> str:
    """What sunk tokens and slurmctld's reconfigure sidecar said, and the JWKS."""
    out = []
    for where in (
        ("logs", f"deployment/{CLUSTER_RELEASE}-tokens", "--tail=40"),
        ("logs", f"statefulset/{RELEASE}-slurmctld", "-c", "reconfigure", "--tail=20"),
        ("get", "secret", f"{RELEASE}-jwks", "-o", "jsonpath={.data.jwks\\.json}"),
    ):
        proc = kubectl(cluster, "-n", NAMESPACE, *where)
        out.append(f"{' '.join(where)}:\n{proc.stdout}{proc.stderr}")
    return "\n".join(out)


def _upgrade_slurm(cluster: Path) -> None:
    """Step 2 (and 4) of docs/charts.md: the keys hook writes the JWKS, the
    reconfigure sidecar has slurmctld load it; slurmdbd reads it at start."""
    cluster_helm(cluster).upgrade_install(
        RELEASE, "slurm", NAMESPACE, _values(cluster, "slurm-values.yaml"),
        values_file=cluster / "cluster" / "slurm-values-rotation.yaml", timeout="8m",
    )  # fmt: skip
    for step in (
        ("rollout", "restart", f"deployment/{RELEASE}-slurmdbd"),
        ("rollout", "status", f"deployment/{RELEASE}-slurmdbd", "--timeout=300s"),
    ):
        proc = kubectl(cluster, "-n", NAMESPACE, *step, timeout=320)
        assert proc.returncode == 0, f"{step}: {proc.stderr}"


def test_the_jwt_key_rotates_as_charts_md_says(cluster: Path, tmp_path: Path) -> None:
    """The steps of docs/charts.md ("Rotating the JWT key"), with no downtime:
    a new RS256 key added beside the old one, `helm upgrade` (the JWKS with
    both; slurmctld reconfigured, no restart), `sunk tokens` signing with the
    new key once Slurm takes it, the old key removed and `helm upgrade` again.
    Throughout, every token in the syncer's Secret is taken by slurmctld, and
    sunk's components read Slurm without a refusal (no "Slurm view stale", the
    syncer's view fresh at every look, its requests going on, no reconcile
    error); afterwards a token of the old key is refused and the syncer
    drains a cordoned node under its name."""
    signing = f"{RELEASE}-jwt-signing"
    syncer_token = f"{CLUSTER_RELEASE}-syncer-token"
    old = _token_of(cluster, syncer_token)
    old_kid = _kid(old)
    assert _slurm_takes(cluster, old)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    before = _metrics(cluster, "syncer")
    samples: list[tuple[float, str, bool, float]] = []  # (t, kid, taken, view fresh)
    stop = threading.Event()
    started = time.monotonic()

    def watch() -> None:
        while not stop.is_set():
            token = _token_of(cluster, syncer_token)
            taken = _slurm_takes(cluster, token)
            fresh = _metrics(cluster, "syncer")["sunk_syncer_slurm_view_fresh"]
            samples.append((time.monotonic() - started, _kid(token), taken, fresh))
            stop.wait(1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # 1. A new key beside the old one, named by its UTC creation time.
        new_kid = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        assert new_kid > old_kid
        key = tmp_path / "key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-C", "",
             "-f", str(key)],
            check=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        patch = tmp_path / "patch.json"
        patch.write_text(
            json.dumps({"data": {f"{new_kid}.pem": base64.b64encode(key.read_bytes()).decode()}})
        )
        proc = kubectl(
            cluster, "-n", NAMESPACE, "patch", "secret", signing, "--type", "merge",
            "--patch-file", str(patch),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        print(f"1. key {new_kid} added beside {old_kid}: {time.monotonic() - started:.1f}s")
        # 2. Its public half to Slurm.
        _upgrade_slurm(cluster)
        print(f"2. JWKS with both keys, slurmdbd restarted: {time.monotonic() - started:.1f}s")
        # 3. sunk tokens signs with it once slurmctld takes it: nothing to do.
        deadline = time.monotonic() + 240
        while _kid(_token_of(cluster, syncer_token)) != new_kid:
            assert time.monotonic() < deadline, f"never signed with the new key: {_why(cluster)}"
            time.sleep(2)
        print(f"3. the syncer's token is the new key's: {time.monotonic() - started:.1f}s")
        logs = kubectl(cluster, "-n", NAMESPACE, "logs", f"deployment/{CLUSTER_RELEASE}-tokens")
        assert f"signing with key {new_kid}" in logs.stdout + logs.stderr
        time.sleep(30)  # the kubelets bring the new tokens to the components' pods
        # 4. The old key removed, and from the JWKS.
        remove = [{"op": "remove", "path": f"/data/{old_kid}.pem"}]
        proc = kubectl(
            cluster, "-n", NAMESPACE, "patch", "secret", signing, "--type", "json",
            "-p", json.dumps(remove),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        _upgrade_slurm(cluster)
        deadline = time.monotonic() + 120
        while _slurm_takes(cluster, old):
            assert time.monotonic() < deadline, "a token of the removed key is still taken"
            time.sleep(2)
        print(f"4. the old key's token refused: {time.monotonic() - started:.1f}s")
        time.sleep(10)
    finally:
        stop.set()
        watcher.join(timeout=120)
    after = _metrics(cluster, "syncer")
    kids = sorted({kid for _, kid, _, _ in samples})
    print(f"{len(samples)} looks at the syncer's token over {samples[-1][0]:.0f}s; kids {kids}")
    refused = [s for s in samples if not s[2]]
    assert refused == [], f"the syncer's token refused at {refused}"
    assert [s for s in samples if s[3] != 1] == [], "the syncer's view went stale"
    assert kids == [old_kid, new_kid]
    assert after["sunk_syncer_slurm_requests"] > before["sunk_syncer_slurm_requests"]
    assert after["sunk_syncer_errors_total"] == before["sunk_syncer_errors_total"]
    for component in ("operator", "syncer", "scheduler"):
        log = kubectl(
            cluster, "-n", NAMESPACE, "logs", f"deployment/{CLUSTER_RELEASE}-{component}",
            f"--since-time={since}",
        )  # fmt: skip
        assert "Slurm view stale" not in log.stdout + log.stderr, f"{component}: {log.stdout}"
    # The syncer (its token file replaced by the kubelet) drains a cordon.
    assert kubectl(cluster, "cordon", "local-3").returncode == 0
    try:
        poll_ssh(
            cluster, "scontrol show node compute-local-3", lambda out: "[sunk-syncer@" in out, 180
        )
    finally:
        assert kubectl(cluster, "uncordon", "local-3").returncode == 0
    poll_ssh(cluster, "sinfo -h -n compute-local-3 -o %t", lambda s: "drain" not in s, 120)
