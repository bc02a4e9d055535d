"""Shared homes as `helm template` renders them (values `homes`): one
ReadWriteMany claim at /home on login and slurmd pods, its directory made
root's before any pod mounts it, homes made at first login, and the values
refused. The bed's real RWX class mounts it on the local cluster
(tests/charts/test_local_up_homes.py); docs/charts.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugins.slurm_render import refused, render
from sunk_testbed.helm import Helm, ensure_helm

pytestmark = pytest.mark.contract

SHARED = {"homes": {"storageClassName": "shared"}}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def homes_claims(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == "PersistentVolumeClaim" and "homes" in d["metadata"]["name"]
    ]


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The login StatefulSet's and every NodeSet's pod spec, by name."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if (d["kind"] == "StatefulSet" and d["metadata"]["name"] == "rel-login")
        or d["kind"] == "NodeSet"
    }


def test_a_class_makes_one_kept_claim_mounted_at_home_on_login_and_slurmd_pods(
    helm: Helm, tmp_path: Path
) -> None:
    docs = render(helm, tmp_path, SHARED)
    [claim] = homes_claims(docs)
    assert claim["metadata"]["name"] == "rel-homes"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "shared"
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"

    specs = pod_specs(docs)
    assert set(specs) == {"rel-login", "compute"}
    for name, spec in specs.items():
        [volume] = [v for v in spec["volumes"] if v["name"] == "homes"]
        assert volume["persistentVolumeClaim"] == {"claimName": "rel-homes"}, name
        main = spec["containers"][0]
        [mount] = [m for m in main["volumeMounts"] if m["name"] == "homes"]
        assert mount == {"name": "homes", "mountPath": "/home", "subPath": "home"}, name
        # The directory is made root's, 0755, by an init container that sees
        # the whole claim; nothing else mounts the claim's root.
        [init] = [c for c in spec["initContainers"] if c["name"] == "homes"]
        script = init["command"][-1]
        assert 'chown 0:0 "$dir"' in script, name
        assert 'chmod 0755 "$dir"' in script, name
        assert "dir=/claim/home" in script
        assert init["securityContext"] == {"runAsUser": 0}
        assert init["volumeMounts"] == [{"name": "homes", "mountPath": "/claim"}]


def test_an_existing_claim_is_mounted_and_none_is_made(helm: Helm, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"homes": {"existingClaim": "lab-homes", "subPath": "users"}})
    assert not homes_claims(docs)
    for spec in pod_specs(docs).values():
        [volume] = [v for v in spec["volumes"] if v["name"] == "homes"]
        assert volume["persistentVolumeClaim"] == {"claimName": "lab-homes"}
        [mount] = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "homes"]
        assert mount["subPath"] == "users"


def test_without_a_class_no_claim_and_no_mount(helm: Helm, tmp_path: Path) -> None:
    docs = render(helm, tmp_path)
    assert not homes_claims(docs)
    for spec in pod_specs(docs).values():
        assert not [v for v in spec["volumes"] if v["name"] == "homes"]
        assert not [c for c in spec["initContainers"] if c["name"] == "homes"]


def test_homes_are_made_at_first_login_and_no_password_passes(helm: Helm, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, SHARED)
    [config] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rel-login"
    ]
    assert "UsePAM yes" in config["data"]["sshd_config"].splitlines()
    assert "PasswordAuthentication no" in config["data"]["sshd_config"].splitlines()
    assert config["data"]["pam-sshd"].splitlines() == [
        "auth    required pam_deny.so",
        "account required pam_permit.so",
        "session optional pam_mkhomedir.so umask=0077 skel=/etc/skel",
        "session required pam_permit.so",
    ]
    login = pod_specs(docs)["rel-login"]["containers"][0]
    [pam] = [m for m in login["volumeMounts"] if m["mountPath"] == "/etc/pam.d/sshd"]
    assert pam["subPath"] == "pam-sshd"

    docs = render(helm, tmp_path, {"homes": {"createOnLogin": False}})
    [config] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rel-login"
    ]
    assert "UsePAM no" in config["data"]["sshd_config"].splitlines()
    assert "pam-sshd" not in config["data"]


@pytest.mark.parametrize(
    ("homes", "named"),
    [
        ({"storageClassName": "shared", "existingClaim": "x"}, "existingClaim (x) names one"),
        ({"subPath": "../etc"}, "/homes/subPath"),
        ({"subPath": "/abs"}, "/homes/subPath"),
        ({"subPath": "a/./b"}, "/homes/subPath"),
        ({"subPath": ""}, "/homes/subPath"),
        ({"size": "lots"}, "/homes/size"),
        ({"existingClaim": "Bad_Name"}, "/homes/existingClaim"),
    ],
)
def test_refused_values_are_named(
    helm: Helm, tmp_path: Path, homes: dict[str, Any], named: str
) -> None:
    assert named in refused(helm, tmp_path, {"homes": homes})
