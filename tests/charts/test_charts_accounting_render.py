"""Priority, preemption, GPU accounting and enforcement, as `helm template`
renders the slurm chart's defaults: the slurm.conf lines, the refusal of
settings that need slurmdbd when accounting is off (naming each value and
how to clear it), and the accounting hook's settings (QOS, the cluster's QOS,
accounts, the static users' association). The hook itself is tested against
a fake sacctmgr (tests/unit/test_accounting_setup.py) and on `sunk local up`
(tests/charts/test_local_up_preemption.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plugins.slurm_render import refused, render
from sunk_testbed.helm import Helm, ensure_helm

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def slurm_conf(docs: list[dict[str, Any]]) -> list[str]:
    [config] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rel-config"
    ]
    return str(config["data"]["slurm.conf"]).splitlines()


def hook(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [job] = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "rel-accounting"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    return dict(container)


def hook_settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    env = {e["name"]: e["value"] for e in hook(docs)["env"]}
    loaded: dict[str, Any] = json.loads(env["SETTINGS"])
    return loaded


NO_ACCOUNTING: dict[str, Any] = {"accounting": {"enabled": False}, "admins": []}


def test_the_defaults_prioritize_preempt_by_qos_account_gpus_and_enforce(
    helm: Helm, tmp_path: Path
) -> None:
    lines = slurm_conf(render(helm, tmp_path))
    for line in [
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
        "PriorityWeightQOS=10000",
        "PriorityWeightAge=1000",
        "PriorityMaxAge=7-0",
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "GresTypes=gpu",
        "AccountingStorageTRES=gres/gpu",
        "AccountingStorageEnforce=associations,limits,qos,safe",
    ]:
        assert line in lines, line
    [partition] = [line for line in lines if line.startswith("PartitionName=compute ")]
    assert "TRESBillingWeights=CPU=1.0,Mem=0.0625G,GRES/gpu=128.0" in partition.split()
    # Grace is the QOS's: a partition's applies only with preempt/partition_prio.
    assert "GraceTime" not in partition


def test_settings_that_need_slurmdbd_are_refused_without_accounting_naming_each(
    helm: Helm, tmp_path: Path
) -> None:
    error = refused(helm, tmp_path, NO_ACCOUNTING)
    for named in [
        "accounting.enabled is false",
        "slurmConfig.PreemptType=preempt/qos",
        "slurmConfig.AccountingStorageEnforce=associations,limits,qos,safe",
        "slurmConfig.AccountingStorageTRES=gres/gpu",
        "partitions[0] (compute) config.TRESBillingWeights=CPU=1.0,Mem=0.0625G,GRES/gpu=128.0",
        "--set slurmConfig.PreemptType=null --set slurmConfig.PreemptMode=null",
        "--set slurmConfig.AccountingStorageTRES=null",
    ]:
        assert named in error, named
    cleared = {
        **NO_ACCOUNTING,
        "slurmConfig": {
            "PreemptType": None,
            "PreemptMode": None,
            "AccountingStorageEnforce": None,
            "AccountingStorageTRES": None,
        },
        "partitions": [{"name": "compute", "nodesets": ["compute"], "default": True}],
    }
    for release in ("26.05", "24.11"):
        images = {"image": {"tag": release}, "login": {"image": {"tag": release}}}
        metrics = {"metrics": {"enabled": release != "24.11"}}
        lines = slurm_conf(render(helm, tmp_path, {**cleared, **images, **metrics}))
        assert not [line for line in lines if line.startswith(("Preempt", "AccountingStorage"))]
        assert not [d for d in render(helm, tmp_path, cleared) if d["kind"] == "Job"
                    and d["metadata"]["name"] == "rel-accounting"]  # fmt: skip


def test_the_hook_keeps_the_default_qos_and_runs_sacctmgr_without_a_shell(
    helm: Helm, tmp_path: Path
) -> None:
    docs = render(helm, tmp_path)
    container = hook(docs)
    assert container["command"] == ["python3", "-u", "/scripts/accounting_setup.py"]
    assert container["securityContext"]["runAsUser"] == 64030  # SlurmUser, over munge
    settings = hook_settings(docs)
    assert settings["cluster"] == "rel"
    assert settings["admins"] == ["sunk-operator", "sunk-syncer"]
    assert settings["clusterQos"] == ["normal"]
    qos = settings["qos"]
    assert set(qos) == {"normal", "inference", "high"}
    assert qos["inference"]["preempt"] == ["normal"]
    assert qos["high"]["preempt"] == ["normal", "inference"]
    assert qos["normal"]["priority"] < qos["inference"]["priority"] < qos["high"]["priority"]
    # Inside KillWait (35): sunk's scheduler evicts a preempted pod within it.
    assert {q["graceTime"] for q in qos.values()} == {30}
    assert {q["preemptMode"] for q in qos.values()} == {"requeue"}
    [scripts] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rel-scripts"
    ]
    assert "def account_plan(" in scripts["data"]["accounting_setup.py"]
    # slurmdbd takes the hook's sacctmgr where NetworkPolicy is enforced.
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"
                and d["metadata"]["name"] == "rel-slurmdbd"]  # fmt: skip
    components = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in policy["spec"]["ingress"][0]["from"]
    }
    assert "accounting" in components


def test_static_users_get_an_association_unless_an_account_lists_them(
    helm: Helm, tmp_path: Path
) -> None:
    values = {
        "identity": {
            "users": [{"name": "alice", "uid": 3000}, {"name": "bob", "uid": 3001}],
        },
        "accounting": {
            "accounts": {
                "serving": {
                    "qos": ["normal", "inference"],
                    "defaultQos": "normal",
                    "users": ["alice"],
                }
            },
            "qos": {"normal": {"limits": {"MaxTRESPerUser": "gres/gpu=8"}}},
        },
    }
    settings = hook_settings(render(helm, tmp_path, values))
    assert settings["identityUsers"] == ["alice", "bob"]
    assert settings["usersAccount"] == "users"
    assert settings["accounts"]["serving"]["users"] == ["alice"]
    assert settings["qos"]["normal"]["limits"] == {"MaxTRESPerUser": "gres/gpu=8"}
    # With a directory, its groups' loop makes the associations instead.
    ldap = {"identity": {"provider": "ldap", "ldap": {"server": {"enabled": True}}}}
    assert hook_settings(render(helm, tmp_path, ldap))["identityUsers"] == []


@pytest.mark.parametrize(
    ("accounting", "named"),
    [
        ({"qos": {"High": {}}}, "High"),
        ({"qos": {"x": {"preempt": ["bad name"]}}}, "preempt"),
        ({"qos": {"x": {"limits": {"rm -rf": 1}}}}, "rm -rf"),
        ({"qos": {"x": {"limits": {"MaxTRESPerUser": "gpu;8"}}}}, "MaxTRESPerUser"),
        ({"qos": {"x": {"description": "it's"}}}, "description"),
        ({"qos": {"x": {"preemptMode": "gang"}}}, "preemptMode"),
        ({"accounts": {"root": {}}}, "root"),
        ({"accounts": {"a": {"users": ["Bad User"]}}}, "users"),
        ({"clusterQos": ["Normal"]}, "clusterQos"),
    ],
    ids=["upper", "preempt", "limit-key", "limit-value", "quote", "mode", "root", "user", "cqos"],
)
def test_the_schema_refuses_bad_qos_and_account_values(
    helm: Helm, tmp_path: Path, accounting: dict[str, Any], named: str
) -> None:
    error = refused(helm, tmp_path, {"accounting": accounting})
    assert "schema" in error, error
    assert named in error, error
