"""Property-based tests of the directory entries the slurm chart's accounts loop
reads (charts/slurm/files/directory_accounts.py): `getent passwd` and `getent
group` output, as nslcd gives it from what a directory's admin wrote.

Whatever the directory holds: the parsers raise nothing, no group with a gid
outside the directory range or reserved becomes an account, no member is a
local account (root, a daemon, an admin) or a user with a uid outside the
range, a reserved one, or root's or a reserved primary group; every member a
group names and the loop leaves out is told; and entries written out read
back the same.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.chart_files import chart_module

pytestmark = pytest.mark.unit

da = chart_module("directory_accounts")
# The slurm chart's default reserved ids (`ids`, `admins`, identity.reservedIds).
RESERVED = frozenset({64030, 64031, 64032, 64033, 64034, 64035, 64036, 64040, 64041, 65532, 65534})
RANGE = da.IdRange(1000, 59999, RESERVED)
LOCAL = ("root", "slurm", "munge", "sunk-operator", "sunk-syncer", "nobody")

EDGES = [0, 1, 100, 999, 1000, 3000, 59999, 60000, 64030, 64040, 65534, 2**32 - 1, 2**32]
ids = st.one_of(st.sampled_from(sorted(RESERVED) + EDGES), st.integers(0, 70000))
# Names as a directory may spell them (no field separators), local ones included.
names = st.one_of(
    st.sampled_from(LOCAL),
    st.text(alphabet="abcdexyz-_.0123456789", min_size=1, max_size=8),
)
free_text = st.text(alphabet=st.characters(exclude_characters=":\n\r"), max_size=10)
# Raw getent output: any characters, separators and digits more often.
raw = st.text(alphabet=st.one_of(st.sampled_from(":,\n0123456789x"), st.characters()), max_size=300)

users = st.builds(da.User, names, ids, ids, free_text, free_text, free_text)
groups = st.builds(
    da.Group,
    names,
    ids,
    st.lists(st.text(alphabet="abcxyz-_.09", min_size=1, max_size=6), max_size=4).map(tuple),
)


@st.composite
def listings(draw: st.DrawFn) -> tuple[str, str]:
    """getent group and passwd output: well-formed entries, sometimes junk lines among them."""
    group_text = da.format_group(draw(st.lists(groups, max_size=6)))
    passwd_text = da.format_passwd(draw(st.lists(users, max_size=6)))
    if draw(st.booleans()):
        group_text += draw(raw)
    if draw(st.booleans()):
        passwd_text = draw(raw) + "\n" + passwd_text
    return group_text, passwd_text


@pytest.mark.fuzz
@given(raw, raw, st.lists(names, max_size=3))
def test_the_parsers_never_raise(group_text: str, passwd_text: str, chosen: list[str]) -> None:
    for user in da.parse_passwd(passwd_text):
        assert user.name
        assert user.uid >= 0
        assert user.gid >= 0
    for group in da.parse_group(group_text):
        assert group.name
        assert all(group.members)
    da.parse_groups(group_text, passwd_text, chosen, RANGE, LOCAL)
    da.refusals(group_text, passwd_text, chosen, RANGE, LOCAL)


@pytest.mark.fuzz
@given(listings(), st.lists(names, max_size=2))
def test_every_named_member_left_out_is_told(listing: tuple[str, str], chosen: list[str]) -> None:
    """A chosen group's member that is not taken has a line naming it."""
    group_text, passwd_text = listing
    accounts = da.parse_groups(group_text, passwd_text, chosen, RANGE, LOCAL)
    told = da.refusals(group_text, passwd_text, chosen, RANGE, LOCAL)
    # A name listed twice is the last entry with an allowed gid, as the loop reads it.
    taken = {g.name: g for g in da.parse_group(group_text) if RANGE.allows(g.gid)}
    for group in taken.values():
        if chosen and group.name not in chosen:
            continue
        for member in set(group.members) - accounts[group.name]:
            assert any(
                line.startswith(f"group {group.name}: member {member} not taken: ") for line in told
            ), (group, member, told)


@pytest.mark.fuzz
@given(listings(), st.lists(names, max_size=2))
def test_no_account_or_member_has_an_id_the_directory_may_not_give(
    listing: tuple[str, str], chosen: list[str]
) -> None:
    group_text, passwd_text = listing
    accounts = da.parse_groups(group_text, passwd_text, chosen, RANGE, LOCAL)
    gids: dict[str, set[int]] = {}
    for group in da.parse_group(group_text):
        gids.setdefault(group.name, set()).add(group.gid)
    listed = da.parse_passwd(passwd_text)
    refused = {u.name for u in listed if not RANGE.allows(u.uid) or u.gid == 0 or u.gid in RESERVED}
    for name, members in accounts.items():
        assert not chosen or name in chosen
        assert any(RANGE.allows(gid) for gid in gids[name])
        for member in members:
            assert member not in LOCAL
            assert member not in refused
            assert any(u.name == member for u in listed)  # it resolves
            assert member


@pytest.mark.fuzz
@given(st.lists(users, max_size=8), st.lists(groups, max_size=8))
def test_entries_written_out_read_back_the_same(passwd: list[object], group: list[object]) -> None:
    assert da.parse_passwd(da.format_passwd(passwd)) == passwd
    assert da.parse_group(da.format_group(group)) == group
