"""The tenancy document (pure): what an admin writes, and the errors that name the field."""

from __future__ import annotations

import pytest

from sunk.scheduler.tenancy import RESERVED, Grant, TenancyError, parse_tenancy

GOOD = """
tenants:
  - namespaces: [team-a, team-a-dev]
    uids: "5000-5099"
    user: 5000
    accounts: [team-a]
"""


def test_a_tenancy_grants_its_namespaces() -> None:
    tenancy = parse_tenancy(GOOD, "cm")
    grant = tenancy.grant_for("team-a-dev")
    assert grant is not None
    assert grant.allows_uid(5099)
    assert not grant.allows_uid(5100)
    assert not grant.allows_gid(5000)  # no gids granted: the user's own group only
    assert tenancy.grant_for("team-b") is None
    assert parse_tenancy("", "cm").tenants == []  # an empty ConfigMap serves no one
    assert tenancy.uids() == list(range(5000, 5100))  # each gets a token from `sunk tokens`


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("tenants: [{namespaces: [a], uids: '0-99999', user: 5000}]", "tenants.0.uids"),
        ("tenants: [{namespaces: [a], uids: '999', user: 999}]", "ids below 1000"),
        ("tenants: [{namespaces: [a], uids: '5000', user: 6000}]", "outside uids"),
        ("tenants: [{namespaces: [a], uids: '5000', user: 5000, group: 5000}]", "outside gids"),
        ("tenants: [{namespaces: [], uids: '5000', user: 5000}]", "tenants.0.namespaces"),
        ("tenants: [{namespaces: [a], uids: '5000', user: 5000, sudo: true}]", "tenants.0.sudo"),
        (
            "tenants: [{namespaces: [a], uids: '5000', user: 5000},"
            " {namespaces: [a], uids: '6000', user: 6000}]",
            "namespace a is listed by two tenants",
        ),
        ("tenants: [", "not YAML"),
        (
            "tenants: [{namespaces: [a], uids: '5000-6999', user: 5000},"
            " {namespaces: [b], uids: '7000', user: 7000}]",
            "2001 uids granted in all; at most 2000",
        ),
    ],
)
def test_an_invalid_tenancy_names_the_field(text: str, error: str) -> None:
    with pytest.raises(TenancyError, match=r"^cm: ") as raised:
        parse_tenancy(text, "cm")
    assert error in str(raised.value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # SlurmUser's uid in a range: its token would act as SlurmUser.
        (
            "tenants: [{namespaces: [a], uids: '64000-64100', user: 64000}]",
            "tenants.0.uids: 64000-64100 holds reserved ids 64030-64036,64040-64041",
        ),
        ("tenants: [{namespaces: [a], uids: '64030', user: 64030}]", "reserved ids 64030"),
        # An admin (sunk-syncer) and nobody.
        ("tenants: [{namespaces: [a], uids: '64041', user: 64041}]", "reserved ids 64041"),
        (
            "tenants: [{namespaces: [a], uids: '5000', user: 5000, gids: '65000-65535',"
            " group: 65000}]",
            "tenants.0.gids: 65000-65535 holds reserved ids 65532,65534",
        ),
        # A list of one's own adds to the charts' ids, and never removes them.
        (
            "reserved: ['7000-7009']\ntenants: [{namespaces: [a], uids: '7005', user: 7005}]",
            "reserved ids 7005",
        ),
        ("reserved: []\ntenants: [{namespaces: [a], uids: '64030', user: 64030}]", "64030"),
        ("reserved: ['x']", "reserved: 'x' is not N or LOW-HIGH"),
        ("tenants: [{namespaces: [a], uids: '5000-4294967295', user: 5000}]", "are not ids"),
    ],
)
def test_a_reserved_id_is_never_granted(text: str, error: str) -> None:
    with pytest.raises(TenancyError, match=r"^cm: ") as raised:
        parse_tenancy(text, "cm")
    assert error in str(raised.value)


def test_the_reserved_ids_are_the_charts_own_and_a_grant_never_allows_one() -> None:
    assert str(RESERVED) == "64030-64036,64040-64041,65532,65534"
    tenancy = parse_tenancy("reserved: [70000, '7000-7001']\n" + GOOD, "cm")
    assert str(tenancy.reserved_ids()) == "7000-7001,64030-64036,64040-64041,65532,65534,70000"
    # A Grant on its own (no Tenancy checked its range) still refuses them.
    grant = Grant(namespaces=["a"], uids="64000-64100", user=64000, gids="64000-64100")
    assert grant.allows_uid(64029)
    assert not grant.allows_uid(64030)
    assert not grant.allows_gid(64040)
    assert 64030 not in grant.granted_uids()
    assert len(grant.granted_uids()) == 101 - 9


def test_a_tenancy_written_out_reads_back_the_same() -> None:
    tenancy = parse_tenancy("reserved: ['7000']\n" + GOOD, "cm")
    assert parse_tenancy(tenancy.to_yaml(), "again") == tenancy
    assert parse_tenancy(parse_tenancy("", "cm").to_yaml(), "again") == parse_tenancy("", "cm")
