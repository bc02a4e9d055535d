"""The tenancy document (pure): what an admin writes, and the errors that name the field."""

from __future__ import annotations

import pytest

from sunk.scheduler.tenancy import TenancyError, parse_tenancy

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
