"""Who can log in, as `helm template` renders it: the `static` provider (users
in values, unchanged) and `ldap` (an in-chart OpenLDAP or an external
directory, nslcd beside every Slurm daemon), and the values each refuses,
named. A real slapd, nslcd and sshd run these on the local cluster
(tests/charts/test_local_up_identity.py); docs/identity.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.slurm_render import refused, render
from sunk_testbed.helm import Helm, ensure_helm

pytestmark = pytest.mark.contract

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice"
SEEDED: dict[str, Any] = {
    "identity": {
        "provider": "ldap",
        "users": [{"name": "alice", "uid": 3000, "gid": 3000}],
        "groups": [{"name": "research", "gid": 3000, "members": ["alice"]}],
        "ldap": {"server": {"enabled": True}},
    },
    "login": {"authorizedKeys": {"alice": KEY}},
}
# Pods whose daemons resolve users: each runs nslcd and asks it after the files.
RESOLVING = {"rel-slurmctld", "rel-login", "rel-slurmdbd", "rel-slurmrestd", "compute"}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template (workloads and hook Jobs), by its owner's name."""
    specs = {}
    for doc in docs:
        if doc["kind"] in ("StatefulSet", "Deployment", "Job", "NodeSet"):
            specs[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]
    return specs


def identity(docs: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = of_kind(docs, "ConfigMap")["rel-identity"]["data"]
    return data


def names(passwd: str) -> list[str]:
    return [line.split(":")[0] for line in passwd.splitlines() if line]


def test_static_stays_as_it_was(helm: Helm, tmp_path: Path) -> None:
    docs = render(
        helm,
        tmp_path,
        {
            "identity": {
                "users": [{"name": "alice", "uid": 3000}],
                "groups": [{"name": "research", "gid": 3000, "members": ["alice"]}],
            }
        },
    )
    files = identity(docs)
    assert names(files["passwd"]) == ["alice", "sunk-operator", "sunk-syncer"]
    assert "research:x:3000:alice" in files["group"].splitlines()
    assert "nslcd.conf" not in files
    assert "nsswitch.conf" not in files
    assert not any("ldap" in name for name in of_kind(docs, "StatefulSet"))
    for name, spec in pod_specs(docs).items():
        sidecars = [c["name"] for c in spec.get("initContainers", [])]
        assert "nslcd" not in sidecars, name
    sshd = of_kind(docs, "ConfigMap")["rel-login"]["data"]["sshd_config"].splitlines()
    assert "AuthorizedKeysCommand /usr/bin/cat /etc/ssh/authorized-keys/%u" in sshd
    assert "UsePAM yes" in sshd  # pam_mkhomedir (homes.createOnLogin)
    assert "PasswordAuthentication no" in sshd


def test_ldap_runs_nslcd_beside_every_daemon_that_resolves_users(
    helm: Helm, tmp_path: Path
) -> None:
    docs = render(helm, tmp_path, SEEDED)
    specs = pod_specs(docs)
    assert set(specs) >= RESOLVING
    for name in RESOLVING:
        spec = specs[name]
        nslcd = {c["name"]: c for c in spec["initContainers"]}["nslcd"]
        assert nslcd["restartPolicy"] == "Always"  # a native sidecar
        assert nslcd["command"][0] == "nslcd"
        assert "--nofork" in nslcd["command"]
        context = nslcd["securityContext"]
        assert context["runAsUser"] == 64034
        assert context["runAsNonRoot"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["allowPrivilegeEscalation"] is False
        # Each container that reads the chart's /etc/passwd asks nslcd after it.
        for container in spec["containers"]:
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            if "/etc/passwd" in mounts:
                assert mounts["/etc/nsswitch.conf"]["subPath"] == "nsswitch.conf", name
                assert mounts["/run/nslcd"]["name"] == "nslcd-run", name
        # The bind password reaches the prepare container only, from the Secret.
        secret = {v["name"]: v for v in spec["volumes"]}["ldap-secret"]["secret"]
        assert secret["secretName"] == "rel-ldap"
        assert secret["items"] == [{"key": "bind-password", "path": "bind-password"}]
        holders = [
            c["name"]
            for c in spec["initContainers"] + spec["containers"]
            if any(m["name"] == "ldap-secret" for m in c.get("volumeMounts", []))
        ]
        assert holders == ["prepare"], name

    files = identity(docs)
    # Users come from the directory: the files keep the chart's own.
    assert names(files["passwd"]) == ["sunk-sshkeys", "sunk-operator", "sunk-syncer"]
    assert "alice" not in files["group"]
    nsswitch = dict(line.split(":", 1) for line in files["nsswitch.conf"].splitlines())
    assert nsswitch["passwd"].split() == ["files", "ldap"]
    assert nsswitch["group"].split() == ["files", "ldap"]
    assert nsswitch["shadow"].split() == ["files"]
    nslcd = files["nslcd.conf"].splitlines()
    assert "uri ldap://rel-ldap.hpc.svc.cluster.local:389" in nslcd
    assert "base passwd ou=people,dc=sunk,dc=local" in nslcd
    assert "binddn cn=reader,dc=sunk,dc=local" in nslcd
    assert "nss_min_uid 1000" in nslcd
    assert not any(line.startswith("bindpw") for line in nslcd)


def test_the_in_chart_directory_is_seeded_from_values_and_only_slurm_reaches_it(
    helm: Helm, tmp_path: Path
) -> None:
    docs = render(helm, tmp_path, SEEDED)
    slapd = of_kind(docs, "StatefulSet")["rel-ldap"]
    container = slapd["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["runAsUser"] == 64035
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert slapd["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert of_kind(docs, "Service")["rel-ldap"]["spec"]["ports"][0]["port"] == 389

    ldap = of_kind(docs, "ConfigMap")["rel-ldap"]["data"]
    seed = ldap["seed.ldif"]
    entries = [e for e in seed.strip().split("\n\n")]
    assert entries[0].splitlines()[0] == "dn: dc=sunk,dc=local"
    alice = next(e for e in entries if e.startswith("dn: uid=alice,ou=people,"))
    assert {"uidNumber: 3000", "gidNumber: 3000", f"sshPublicKey: {KEY}"} <= set(alice.splitlines())
    research = next(e for e in entries if e.startswith("dn: cn=research,ou=groups,"))
    assert "memberUid: alice" in research.splitlines()
    # The reader comes last: its password hash is appended at start, from the Secret.
    assert entries[-1].startswith("dn: cn=reader,dc=sunk,dc=local")
    assert "userPassword" not in seed
    assert "olcRootPW" not in ldap["config.ldif"]
    assert "by self write by anonymous auth by * none" in ldap["config.ldif"]

    # The keys hook makes the directory's passwords; no object holds one.
    keys = of_kind(docs, "Job")["rel-keys"]["spec"]["template"]["spec"]["containers"][0]
    made = {e["name"]: e.get("value", "") for e in keys["env"]}["KEYS"]
    assert "rel-ldap ldap" in made.splitlines()
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "rel-ldap"]

    policy = of_kind(docs, "NetworkPolicy")["rel-ldap"]["spec"]
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 1389}]
    components = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]
    }
    assert components == {"slurmctld", "slurmd", "login", "slurmrestd", "slurmdbd", "accounting"}


def test_ssh_takes_the_directorys_keys_and_passwords_only_when_asked(
    helm: Helm, tmp_path: Path
) -> None:
    docs = render(helm, tmp_path, SEEDED)
    login = of_kind(docs, "ConfigMap")["rel-login"]["data"]
    sshd = login["sshd_config"].splitlines()
    assert "AuthorizedKeysCommand /bin/sh /etc/ssh/chart/ldap-keys %u" in sshd
    assert "AuthorizedKeysCommandUser sunk-sshkeys" in sshd
    assert "PasswordAuthentication no" in sshd
    # PAM only for making homes (homes.createOnLogin): no password passes.
    assert "UsePAM yes" in sshd
    assert "pam_ldap" not in login["pam-sshd"]
    assert "auth    required pam_deny.so" in login["pam-sshd"].splitlines()
    script = login["ldap-keys"]
    assert "-y /run/ldap-keys/bind-password" in script
    assert "ou=people,dc=sunk,dc=local" in script
    pod = of_kind(docs, "StatefulSet")["rel-login"]["spec"]["template"]["spec"]
    sshd_mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert "/run/ldap-keys" in sshd_mounts

    with_passwords = {**SEEDED, "identity": {**SEEDED["identity"]}}
    with_passwords["identity"]["ldap"] = {"server": {"enabled": True}, "passwordLogin": True}
    docs = render(helm, tmp_path, with_passwords)
    login = of_kind(docs, "ConfigMap")["rel-login"]["data"]
    assert {"PasswordAuthentication yes", "UsePAM yes"} <= set(login["sshd_config"].splitlines())
    assert "pam_ldap.so minimum_uid=1000" in login["pam-sshd"]
    pod = of_kind(docs, "StatefulSet")["rel-login"]["spec"]["template"]["spec"]
    pam = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}["/etc/pam.d/sshd"]
    assert pam["subPath"] == "pam-sshd"


def test_an_external_directory_needs_no_server_and_may_be_read_anonymously(
    helm: Helm, tmp_path: Path
) -> None:
    external = {
        "identity": {
            "provider": "ldap",
            "ldap": {
                "uri": "ldaps://ldap.example.com",
                "baseDN": "dc=example,dc=com",
                "usersDN": "ou=staff,dc=example,dc=com",
                "bindDN": "uid=slurm,ou=services,dc=example,dc=com",
                "existingSecret": "directory-bind",
            },
        }
    }
    docs = render(helm, tmp_path, external)
    assert "rel-ldap" not in of_kind(docs, "StatefulSet")
    assert "rel-ldap" not in of_kind(docs, "NetworkPolicy")
    keys = of_kind(docs, "Job")["rel-keys"]["spec"]["template"]["spec"]["containers"][0]
    assert " ldap" not in {e["name"]: e.get("value", "") for e in keys["env"]}["KEYS"]
    nslcd = identity(docs)["nslcd.conf"].splitlines()
    assert "uri ldaps://ldap.example.com" in nslcd
    assert "base passwd ou=staff,dc=example,dc=com" in nslcd
    assert "base group ou=groups,dc=example,dc=com" in nslcd
    assert "binddn uid=slurm,ou=services,dc=example,dc=com" in nslcd
    ctld = pod_specs(docs)["rel-slurmctld"]
    assert {v["name"]: v for v in ctld["volumes"]}["ldap-secret"]["secret"]["secretName"] == (
        "directory-bind"
    )

    del external["identity"]["ldap"]["bindDN"]
    del external["identity"]["ldap"]["existingSecret"]
    docs = render(helm, tmp_path, external)
    assert not any(line.startswith("binddn") for line in identity(docs)["nslcd.conf"].splitlines())
    for name, spec in pod_specs(docs).items():
        assert "ldap-secret" not in {v["name"] for v in spec.get("volumes", [])}, name
    script = of_kind(docs, "ConfigMap")["rel-login"]["data"]["ldap-keys"]
    assert " -D " not in script
    assert "bind-password" not in script


@pytest.mark.parametrize(
    ("identity_values", "named"),
    [
        ({"provider": "nis"}, r"identity[./]provider"),
        ({"provider": "ldap"}, r"identity\.ldap: set uri .* or server\.enabled: true"),
        (
            {"provider": "ldap", "ldap": {"uri": "ldap://x", "server": {"enabled": True}}},
            r"identity\.ldap: set uri .* not both",
        ),
        (
            {"provider": "ldap", "ldap": {"uri": "ldap://x", "bindDN": "cn=r,dc=x"}},
            r"identity\.ldap\.existingSecret",
        ),
        (
            {"provider": "ldap", "ldap": {"server": {"enabled": True}, "usersDN": "ou=x,dc=y"}},
            r"identity\.ldap\.usersDN/groupsDN",
        ),
        ({"provider": "ldap", "ldap": {"uri": "http://x"}}, r"identity[./]ldap[./]uri"),
        (
            {"provider": "ldap", "ldap": {"server": {"enabled": True}, "baseDN": "o=acme"}},
            r"identity[./]ldap[./]baseDN",
        ),
        ({"provider": "ldap", "ldap": {"minUid": 0}}, r"identity[./]ldap[./]minUid"),
        ({"provider": "ldap", "ldap": {"sever": {}}}, r"sever"),
        (
            {"provider": "ldap", "ldap": {"uri": "ldap://x", "accounts": {"groups": ["a b"]}}},
            r"identity[./]ldap[./]accounts[./]groups",
        ),
    ],
    ids=[
        "unknown-provider",
        "no-directory",
        "two-directories",
        "bind-without-secret",
        "server-with-own-ous",
        "not-an-ldap-uri",
        "base-not-dc",
        "min-uid-too-low",
        "unknown-key",
        "accounts-group-not-a-name",
    ],
)
def test_bad_identity_values_are_refused_naming_the_field(
    helm: Helm, tmp_path: Path, identity_values: dict[str, Any], named: str
) -> None:
    error = refused(helm, tmp_path, {"identity": identity_values})
    assert re.search(named, error), error


def test_directory_groups_as_accounts_run_beside_slurmdbd_as_slurmuser(
    helm: Helm, tmp_path: Path
) -> None:
    """`identity.ldap.accounts`: a loop in the slurmdbd pod (sacctmgr over
    munge as SlurmUser, the directory through the pod's nslcd), its settings
    in a file it re-reads; on by default (enforcement needs every directory
    user's association), only with accounting, and never with static users."""
    assert "directory-accounts" in {
        c["name"] for c in pod_specs(render(helm, tmp_path, SEEDED))["rel-slurmdbd"]["containers"]
    }
    static = render(helm, tmp_path, {"identity": {"ldap": {"accounts": {"enabled": True}}}})
    assert "directory-accounts" not in {
        c["name"] for c in pod_specs(static)["rel-slurmdbd"]["containers"]
    }
    values = {
        **SEEDED,
        "identity": {
            **SEEDED["identity"],
            "ldap": {
                "server": {"enabled": True},
                "accounts": {"enabled": True, "groups": ["research"]},
            },
        },
    }
    docs = render(helm, tmp_path, values)
    spec = pod_specs(docs)["rel-slurmdbd"]
    (loop,) = (c for c in spec["containers"] if c["name"] == "directory-accounts")
    assert loop["command"][-1] == "/scripts/directory_accounts.json"
    assert loop["securityContext"]["runAsUser"] == 64030  # slurm: SlurmUser
    assert loop["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in loop["volumeMounts"]}
    assert {"/run/munge", "/run/nslcd", "/etc/nsswitch.conf", "/etc/slurm", "/scripts"} <= mounts
    scripts = of_kind(docs, "ConfigMap")["rel-scripts"]["data"]
    settings = yaml.safe_load(scripts["directory_accounts.json"])
    assert settings.pop("reserved")  # and the directory range: as nslcd's filters
    assert settings == {
        "groups": ["research"],
        "interval": 30,
        "qos": [],  # inherit accounting.clusterQos
        "minUid": 1000,
        "maxUid": 59999,
    }
    assert "def plan(" in scripts["directory_accounts.py"]
    values["accounting"] = {"enabled": False}
    assert "set accounting.enabled too" in refused(helm, tmp_path, values)


def test_password_login_and_accounts_roll_only_what_uses_them(helm: Helm, tmp_path: Path) -> None:
    """Turning `passwordLogin` or `accounts` on replaces the login pods
    (sshd's PAM) or changes the scripts ConfigMap, never slurmctld nor the
    slurmd pods: a `helm upgrade` for either leaves running jobs alone."""

    def templates(ldap: dict[str, Any]) -> dict[str, Any]:
        values = {**SEEDED, "identity": {**SEEDED["identity"], "ldap": ldap}}
        docs = render(helm, tmp_path, values)
        return {
            d["metadata"]["name"]: d["spec"]["template"]
            for d in docs
            if d["kind"] in ("StatefulSet", "Deployment", "NodeSet")
        }

    before = templates({"server": {"enabled": True}, "accounts": {"enabled": False}})
    after = templates(
        {"server": {"enabled": True}, "passwordLogin": True, "accounts": {"enabled": True}}
    )
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"rel-login", "rel-slurmdbd"}, changed
