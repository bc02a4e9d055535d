"""Property-based tests of what the slurm chart's accounting hook reads
(charts/slurm/files/accounting_setup.py): sacctmgr's `-n -P` listings, whose
fields hold what people wrote (account descriptions, organizations), and the
plan it makes from them.

Whatever sacctmgr lists: the parsers raise nothing, rows written out read
back the same, and the plan never changes or removes anything in an account
the chart did not make, nor removes an association the values still list.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.chart_files import chart_module

pytestmark = pytest.mark.unit

acs = chart_module("accounting_setup")

names = st.one_of(
    st.sampled_from(["root", "normal", "serving", "users", "alice"]),
    st.text(alphabet="abcxyz-_0189", min_size=1, max_size=6),
)
free_text = st.text(alphabet=st.characters(exclude_characters="|\n\r"), max_size=10)
raw = st.text(alphabet=st.one_of(st.sampled_from("|,\n"), st.characters()), max_size=300)
qos_sets = st.frozensets(names, max_size=3)
assoc_rows = st.builds(
    acs.AssocRow,
    names,
    st.one_of(st.just(""), names),
    st.one_of(st.just(""), names),
    st.sampled_from(["", "1", "5", "parent"]),
    qos_sets,
    st.one_of(st.just(""), names),
)
orgs = st.one_of(st.just(acs.MARK), st.just("SUNK-CHART"), free_text)
account_rows = st.builds(acs.AccountRow, names, free_text, orgs)
accounts = st.builds(
    acs.Account,
    names,
    free_text,
    names,
    st.integers(1, 100),
    st.lists(names, max_size=3, unique=True).map(tuple),
    st.one_of(st.just(""), names),
    st.lists(names, max_size=3, unique=True).map(tuple),
)


@pytest.mark.fuzz
@given(raw)
def test_the_parsers_never_raise(text: str) -> None:
    acs.parse_table(text)
    acs.parse_accounts(text)
    for row in acs.parse_associations(text):
        assert row.account
        assert "" not in row.qos


@pytest.mark.fuzz
@given(st.lists(assoc_rows, max_size=6))
def test_association_rows_read_back_the_same(rows: list[object]) -> None:
    wellformed = [r for r in rows if isinstance(r, acs.AssocRow) and "" not in r.qos]
    assert acs.parse_associations(acs.format_associations(wellformed)) == wellformed


@pytest.mark.fuzz
@given(
    st.lists(accounts, max_size=4, unique_by=lambda a: a.name),
    st.lists(account_rows, max_size=5),
    st.lists(assoc_rows, max_size=8),
)
def test_the_plan_touches_only_the_charts_accounts(
    wanted: list[object], listed: list[object], rows: list[object]
) -> None:
    by_name = {r.name: r for r in listed if isinstance(r, acs.AccountRow)}
    plan = acs.account_plan("rel", wanted, by_name, rows)
    ours = {n for n, r in by_name.items() if r.organization.lower() == acs.MARK and n != "root"}
    wanted_names = {a.name for a in wanted if isinstance(a, acs.Account)}
    for command in plan.commands:
        verb, what = command[0], command[1]
        account = next(a.split("=", 1)[1] for a in command if a.startswith(("name=", "account=")))
        if what == "user":
            account = next(a.split("=", 1)[1] for a in command if a.startswith("account="))
        assert verb in ("add", "modify")
        assert account in wanted_names
        # A person's account is never changed, nor given users.
        assert account not in by_name or account in ours
    listed_users = {(a.name, u) for a in wanted if isinstance(a, acs.Account) for u in a.users}
    for command in plan.removals:
        user = command[3].split("=", 1)[1]
        account = command[4].split("=", 1)[1]
        assert account in ours
        assert account in wanted_names
        assert (account, user) not in listed_users
    assert set(plan.foreign) == {
        n for n in wanted_names if n == "root" or (n in by_name and n not in ours)
    }
