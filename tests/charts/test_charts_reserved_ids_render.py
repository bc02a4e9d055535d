"""Reserved ids, token lifespans and each component's Slurm user, as `helm
template` renders them (docs/security.md, docs/identity.md, docs/scheduler.md).

The ids the charts give a daemon, an admin or `nobody` are never a tenant's
nor a directory user's: the charts refuse values that would allow it, naming
the rule, and render what the scheduler, `sunk tokens` and nslcd then check.
A real slapd, nslcd and Slurm run this on the local cluster
(tests/charts/test_local_up_identity.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sunk.scheduler.tenancy import DEFAULT_RESERVED, RESERVED, parse_tenancy
from sunk_testbed.helm import CHARTS, Helm, HelmError, ensure_helm

pytestmark = pytest.mark.contract

SLURM_VALUES = yaml.safe_load((CHARTS / "slurm" / "values.yaml").read_text())
LDAP: dict[str, Any] = {"identity": {"provider": "ldap", "ldap": {"server": {"enabled": True}}}}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def render(helm: Helm, chart: str, tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    out = helm.run(["template", "rel", str(CHARTS / chart), "-n", "hpc", "-f", str(file)])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refused(helm: Helm, chart: str, tmp_path: Path, values: dict[str, Any]) -> str:
    with pytest.raises(HelmError) as error:
        render(helm, chart, tmp_path, values)
    return str(error.value.stderr)


def configmap(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    (found,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    data: dict[str, str] = found["data"]
    return data


def charts_own_ids() -> set[int]:
    """Every id the slurm chart gives a daemon or an admin, sunk's pods' and nobody's."""
    ids = {int(v) for v in SLURM_VALUES["ids"].values()}
    ids |= {int(a["uid"]) for a in SLURM_VALUES["admins"]}
    return ids | {65532, 65534}


def test_the_reserved_ids_are_every_id_the_charts_give_a_daemon_an_admin_or_nobody() -> None:
    """The scheduler's defaults, sunk-cluster's values and the slurm chart's ids agree."""
    assert {i for i in charts_own_ids() if i in RESERVED} == charts_own_ids()
    cluster = yaml.safe_load((CHARTS / "sunk-cluster" / "values.yaml").read_text())
    assert tuple(cluster["scheduler"]["reservedIds"]) == DEFAULT_RESERVED
    runs_as = {
        int(m)
        for path in (CHARTS / "sunk-cluster" / "templates").glob("*")
        for m in re.findall(r"runAsUser: (\d+)", path.read_text())
    }
    assert runs_as <= charts_own_ids() | {0}


@pytest.mark.parametrize(
    ("tenant", "error"),
    [
        # SlurmUser's uid: its token would be SlurmUser's.
        (
            {"namespaces": ["a"], "uids": "64000-64100", "user": 64000},
            "scheduler.tenants[0].uids: 64000-64100 holds reserved ids 64030-64036,64040-64041",
        ),
        ({"namespaces": ["a"], "uids": "64030", "user": 64030}, "holds reserved ids 64030"),
        # An admin (sunk-syncer) and nobody.
        ({"namespaces": ["a"], "uids": "64041", "user": 64041}, "holds reserved ids 64040-64041"),
        (
            {"namespaces": ["a"], "uids": "5000", "user": 5000, "gids": "65000-65600"},
            "scheduler.tenants[0].gids: 65000-65600 holds reserved ids 65532,65534",
        ),
    ],
)
def test_a_tenancy_granting_a_reserved_id_is_refused_naming_the_rule(
    helm: Helm, tmp_path: Path, tenant: dict[str, Any], error: str
) -> None:
    message = refused(helm, "sunk-cluster", tmp_path, {"scheduler": {"tenants": [tenant]}})
    assert error in message
    assert "never granted" in message


def test_reserved_ids_of_ones_own_add_to_the_charts_and_reach_the_scheduler(
    helm: Helm, tmp_path: Path
) -> None:
    tenant = {"namespaces": ["a"], "uids": "6990-7010", "user": 6990}
    values = {"scheduler": {"reservedIds": [7000], "tenants": [tenant]}}
    assert "holds reserved ids 7000" in refused(helm, "sunk-cluster", tmp_path, values)
    # Leaving the charts' ids out of the list reserves them still.
    values = {"scheduler": {"reservedIds": [], "tenants": [{**tenant, "uids": "64040"}]}}
    assert "holds reserved ids 64040" in refused(helm, "sunk-cluster", tmp_path, values)
    values = {"scheduler": {"reservedIds": ["70000-70009"], "tenants": [tenant]}}
    docs = render(helm, "sunk-cluster", tmp_path, values)
    tenancy = parse_tenancy(configmap(docs, "rel-scheduler-tenancy")["tenancy.yaml"], "rendered")
    assert str(tenancy.reserved_ids()) == "64030-64036,64040-64041,65532,65534,70000-70009"
    assert tenancy.uids() == list(range(6990, 7011))
    # Below 1000: the schema refuses it (the scheduler would too).
    tenant = {"namespaces": ["a"], "uids": "0-100", "user": 5000}
    assert "uids" in refused(helm, "sunk-cluster", tmp_path, {"scheduler": {"tenants": [tenant]}})


@pytest.mark.parametrize("component", ["operator", "syncer", "scheduler"])
def test_each_component_names_its_own_slurm_user_and_none_falls_back_to_slurmuser(
    helm: Helm, tmp_path: Path, component: str
) -> None:
    assert "missing property 'slurmUser'" in refused(
        helm, "sunk-cluster", tmp_path, {component: {"slurmUser": None}}
    )
    assert "slurmUser" in refused(helm, "sunk-cluster", tmp_path, {component: {"slurmUser": ""}})
    assert "slurmUser" in refused(
        helm, "sunk-cluster", tmp_path, {component: {"slurmUser": "root"}}
    )
    # The old fallback is gone.
    assert "user" in refused(helm, "sunk-cluster", tmp_path, {"slurm": {"user": "slurm"}})
    docs = render(helm, "sunk-cluster", tmp_path, {})
    (tokens,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-tokens"
    ]
    grants = [
        a for a in tokens["spec"]["template"]["spec"]["containers"][0]["command"] if "grant" in a
    ]
    assert grants == [
        "--grant=rel-operator-token=sunk-operator",
        "--grant=rel-syncer-token=sunk-syncer",
        "--grant=rel-scheduler-token=nobody",
    ]


def test_no_token_outlives_its_cap(helm: Helm, tmp_path: Path) -> None:
    """Slurm caps `scontrol token` for users (max_token_lifespan), in slurmctld's
    and slurmdbd's config alike; sunk's own are capped by tokens.lifetime."""
    docs = render(helm, "slurm", tmp_path, {})
    conf = configmap(docs, "rel-config")["slurm.conf"]
    assert (
        "AuthAltParameters=jwt_key=/run/slurm-keys/jwt_hs256.key,"
        "jwks=/etc/slurm-jwks/jwks.json,max_token_lifespan=3600\n"
    ) in conf
    dbd = configmap(docs, "rel-slurmdbd")["slurmdbd.conf"]
    assert "max_token_lifespan=3600\n" in dbd
    values = {"jwt": {"maxTokenLifespan": 600, "disableTokenCreation": True}}
    conf = configmap(render(helm, "slurm", tmp_path, values), "rel-config")["slurm.conf"]
    assert "max_token_lifespan=600,disable_token_creation\n" in conf
    assert "maxTokenLifespan" in refused(
        helm, "slurm", tmp_path, {"jwt": {"maxTokenLifespan": 10**6}}
    )
    assert "lifetime" in refused(helm, "sunk-cluster", tmp_path, {"tokens": {"lifetime": 10**6}})


def test_nslcd_takes_no_directory_entry_with_a_reserved_id_and_reads_in_pages(
    helm: Helm, tmp_path: Path
) -> None:
    docs = render(helm, "slurm", tmp_path, LDAP)
    nslcd = configmap(docs, "rel-identity")["nslcd.conf"]
    (passwd,) = re.findall(r"^filter passwd (.*)$", nslcd, re.M)
    (group,) = re.findall(r"^filter group (.*)$", nslcd, re.M)
    assert passwd.startswith("(&(objectClass=posixAccount)(uidNumber>=1000)(uidNumber<=59999)")
    assert group.startswith("(&(objectClass=posixGroup)(gidNumber>=1000)(gidNumber<=59999)")
    for number in charts_own_ids():
        assert f"(!(uidNumber={number}))" in passwd
        assert f"(!(gidNumber={number}))" in passwd  # nor anyone's primary group
        assert f"(!(gidNumber={number}))" in group
    assert "(!(gidNumber=0))" in passwd
    assert re.search(r"^pagesize 500$", nslcd, re.M)
    assert "nss_min_uid 1000" in nslcd
    # The in-chart slapd lets the reader page through everything.
    config = configmap(docs, "rel-ldap")["config.ldif"]
    assert 'olcLimits: dn.exact="cn=reader,dc=sunk,dc=local" size.prtotal=unlimited' in config
    # The accounts loop checks the same range and ids.
    values = {
        "identity": {
            **LDAP["identity"],
            "ldap": {**LDAP["identity"]["ldap"], "accounts": {"enabled": True}},
        },
        "accounting": {"enabled": True},
    }
    scripts = configmap(render(helm, "slurm", tmp_path, values), "rel-scripts")
    settings = json.loads(scripts["directory_accounts.json"])
    assert (settings["minUid"], settings["maxUid"]) == (1000, 59999)
    assert {int(i) for i in settings["reserved"]} == charts_own_ids()
    off = configmap(
        render(
            helm,
            "slurm",
            tmp_path,
            {
                **LDAP,
                "identity": {
                    **LDAP["identity"],
                    "ldap": {**LDAP["identity"]["ldap"], "pageSize": 0},
                },
            },
        ),
        "rel-identity",
    )
    assert "pagesize" not in off["nslcd.conf"]


@pytest.mark.parametrize(
    ("identity", "error"),
    [
        # A directory range reaching the daemons' and admins' ids.
        (
            {"ldap": {"maxUid": 70000}},
            "identity.ldap.minUid..maxUid (1000-70000) holds reserved ids 64030,64031",
        ),
        ({"ldap": {"minUid": 65000, "maxUid": 70000}}, "holds reserved ids 65532,65534"),
        ({"ldap": {"minUid": 5000, "maxUid": 4000}}, "the directory range is empty"),
        ({"reservedIds": [3000]}, "(1000-59999) holds reserved ids 3000"),
        # Users and groups of values (the static provider's, or the directory's seed).
        ({"users": [{"name": "x", "uid": 64040}]}, "identity.users x: uid 64040 is reserved"),
        (
            {"users": [{"name": "x", "uid": 3000, "gid": 64030}]},
            "identity.users x: gid 64030 is reserved",
        ),
        ({"groups": [{"name": "x", "gid": 65534}]}, "identity.groups x: gid 65534 is reserved"),
    ],
)
def test_a_directory_range_or_a_user_with_a_reserved_id_is_refused_naming_the_rule(
    helm: Helm, tmp_path: Path, identity: dict[str, Any], error: str
) -> None:
    values = {
        "identity": {
            **LDAP["identity"],
            **identity,
            "ldap": {**LDAP["identity"]["ldap"], **identity.get("ldap", {})},
        }
    }
    assert error in refused(helm, "slurm", tmp_path, values)
    if "users" in identity or "groups" in identity:  # the static provider too
        static = {"identity": {k: v for k, v in identity.items() if k != "ldap"}}
        assert error in refused(helm, "slurm", tmp_path, static)


def test_a_directory_range_clear_of_the_reserved_ids_is_taken(helm: Helm, tmp_path: Path) -> None:
    values = {
        "identity": {
            **LDAP["identity"],
            "ldap": {**LDAP["identity"]["ldap"], "minUid": 70000, "maxUid": 4294967293},
        }
    }
    nslcd = configmap(render(helm, "slurm", tmp_path, values), "rel-identity")["nslcd.conf"]
    assert "(uidNumber>=70000)(uidNumber<=4294967293)" in nslcd
    assert "nss_min_uid 70000" in nslcd
