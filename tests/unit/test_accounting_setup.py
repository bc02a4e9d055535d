"""The slurm chart's accounting hook (charts/slurm/files/accounting_setup.py):
its settings and the sacctmgr commands it plans from what sacctmgr lists.
A real slurmdbd runs it on `sunk local up` (tests/charts/test_local_up_preemption.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest
import yaml

from plugins.chart_files import FILES, chart_module

pytestmark = pytest.mark.unit

acs = chart_module("accounting_setup")
MARK = acs.MARK
Account = acs.Account
Row = acs.AccountRow
Assoc = acs.AssocRow

CHART_QOS = {
    "normal": {"description": "Normal QOS default", "priority": 0, "preempt": [],
               "preemptMode": "requeue", "graceTime": 30},
    "inference": {"description": "Inference", "priority": 500, "preempt": ["normal"],
                  "preemptMode": "requeue", "graceTime": 30,
                  "limits": {"MaxTRESPerUser": "gres/gpu=8"}},
}  # fmt: skip


def settings(**more: object) -> Any:
    return acs.settings_from({"cluster": "Rel", "qos": CHART_QOS, **more})


# --- settings -------------------------------------------------------------------


def test_settings_read_the_charts_json_in_lower_case() -> None:
    got = acs.settings_from(
        {
            "cluster": "Rel",
            "admins": ["sunk-operator"],
            "qos": CHART_QOS,
            "clusterQos": ["Normal"],
            "accounts": {"Serving": {"qos": ["normal", "inference"], "users": ["Svc"]}},
            "usersAccount": "users",
            "identityUsers": [],
        }
    )
    assert got.cluster == "rel"
    assert got.cluster_qos == ("normal",)
    assert [q.name for q in got.qos] == ["inference", "normal"]
    assert got.qos[0].limits == (("MaxTRESPerUser", "gres/gpu=8"),)
    assert got.accounts == (Account("serving", qos=("normal", "inference"), users=("svc",)),)


def test_identity_users_no_account_lists_go_to_the_users_account() -> None:
    got = acs.settings_from(
        {
            "cluster": "rel",
            "accounts": {"serving": {"users": ["alice"]}},
            "usersAccount": "users",
            "identityUsers": ["alice", "bob", "carol"],
        }
    )
    assert [(a.name, a.users) for a in got.accounts] == [
        ("serving", ("alice",)),
        ("users", ("bob", "carol")),
    ]


def test_a_users_account_the_values_name_keeps_its_settings_and_gains_the_users() -> None:
    accounts = [Account("users", "mine", fairshare=5, users=("dave",))]
    (users,) = acs.with_users_account(accounts, "users", ["bob"])
    assert (users.description, users.fairshare, users.users) == ("mine", 5, ("dave", "bob"))


def test_no_users_account_when_none_is_named_or_none_is_left() -> None:
    assert acs.with_users_account([], "", ["bob"]) == ()
    assert acs.with_users_account([Account("a", users=("bob",))], "users", ["bob"]) == (
        Account("a", users=("bob",)),
    )


# --- admins ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        ({}, [("add", "user", "name=op", "account=root", "adminlevel=Admin")]),
        ({"op": "None"}, [("modify", "user", "where", "name=op", "set", "adminlevel=Admin")]),
        ({"op": "Administrator"}, []),
    ],
    ids=["missing", "not-admin", "already"],
)
def test_admins(levels: dict[str, str], expected: list[tuple[str, ...]]) -> None:
    assert acs.admin_commands(["op"], levels) == expected


# --- QOS ------------------------------------------------------------------------


def test_missing_qos_are_all_made_before_any_is_set() -> None:
    """inference's preempt list names normal: both exist before either is set."""
    got = acs.qos_commands(settings().qos, existing=["Normal"])
    assert got[0] == ("add", "qos", "name=inference")
    assert [c[0] for c in got] == ["add", "modify", "modify"]
    assert got[1] == (
        "modify", "qos", "where", "name=inference", "set", "description=Inference",
        "priority=500", "preempt=normal", "preemptmode=requeue", "gracetime=30",
        "MaxTRESPerUser=gres/gpu=8",
    )  # fmt: skip
    # An empty preempt list clears the QOS's own: the value says none.
    assert "preempt=" in got[2]


def test_qos_not_in_values_are_not_touched() -> None:
    got = acs.qos_commands(settings().qos, existing=["normal", "inference", "people-made"])
    assert not any("people-made" in arg for command in got for arg in command)


@pytest.mark.parametrize(
    ("root_qos", "expected"),
    [
        (frozenset({"normal"}), []),
        (frozenset({"normal", "high"}), [("modify", "cluster", "where", "name=rel", "set",
                                          "qos=normal")]),
    ],
    ids=["same", "differs"],
)  # fmt: skip
def test_the_cluster_qos_list(root_qos: frozenset[str], expected: list[tuple[str, ...]]) -> None:
    rows = [Assoc("root", "", "", "1", root_qos), Assoc("root", "root", "", "1", root_qos)]
    assert acs.cluster_qos_commands("rel", ["normal"], rows) == expected
    assert acs.cluster_qos_commands("rel", [], rows) == []  # [] = leave it


# --- accounts and associations --------------------------------------------------

ROOT_ROWS = [Assoc("root", "", "", "1", frozenset({"normal"}))]


def test_a_new_account_is_made_marked_with_its_users() -> None:
    wanted = [Account("serving", "svc", qos=("normal", "inference"), default_qos="normal",
                      users=("svc",))]  # fmt: skip
    plan = acs.account_plan("rel", wanted, {"root": Row("root", "", "")}, ROOT_ROWS)
    assert plan.commands == (
        ("add", "account", "name=serving", "cluster=rel", f"organization={MARK}",
         "description=svc", "parent=root", "fairshare=1", "qos=normal,inference",
         "defaultqos=normal"),
        ("add", "user", "name=svc", "account=serving", "cluster=rel"),
    )  # fmt: skip
    assert plan.removals == ()


def test_in_step_means_nothing_to_do() -> None:
    wanted = [Account("serving", "svc", qos=("inference",), users=("svc",))]
    accounts = {"serving": Row("serving", "svc", MARK)}
    rows = [
        *ROOT_ROWS,
        Assoc("serving", "", "root", "1", frozenset({"inference"})),
        Assoc("serving", "svc", "", "1", frozenset({"inference"})),
    ]
    assert acs.account_plan("rel", wanted, accounts, rows) == acs.AccountPlan()


def test_a_kept_account_is_set_to_what_changed_only() -> None:
    wanted = [Account("serving", "new", parent="teams", fairshare=5, qos=(), default_qos="normal")]
    accounts = {"serving": Row("serving", "old", MARK), "teams": Row("teams", "", "x")}
    rows = [
        *ROOT_ROWS,
        Assoc("teams", "", "root", "1", frozenset({"normal"})),
        Assoc("serving", "", "root", "1", frozenset({"normal", "high"}), "normal"),
    ]
    (command,) = acs.account_plan("rel", wanted, accounts, rows).commands
    assert command == (
        "modify", "account", "where", "name=serving", "cluster=rel", "set",
        "description=new", "parent=teams", "fairshare=5",
        "qos=",  # [] = inherit: back to the parent's list
    )  # fmt: skip


def test_an_inherited_list_equal_to_the_parents_is_left_alone() -> None:
    wanted = [Account("serving", qos=())]
    accounts = {"serving": Row("serving", "", MARK)}
    rows = [*ROOT_ROWS, Assoc("serving", "", "root", "1", frozenset({"normal"}))]
    assert acs.account_plan("rel", wanted, accounts, rows).commands == ()


def test_a_persons_account_of_that_name_is_left_alone_and_reported() -> None:
    wanted = [Account("research", qos=("high",), users=("alice",))]
    accounts = {"research": Row("research", "theirs", "physics")}
    rows = [*ROOT_ROWS, Assoc("research", "", "root", "1"), Assoc("research", "bob", "", "1")]
    plan = acs.account_plan("rel", wanted, accounts, rows)
    assert plan == acs.AccountPlan(foreign=("research",))


def test_root_is_never_the_charts() -> None:
    accounts = {"root": Row("root", "", MARK)}
    rows = [*ROOT_ROWS, Assoc("root", "root", "", "1")]
    plan = acs.account_plan("rel", [Account("root", users=("alice",))], accounts, rows)
    assert plan == acs.AccountPlan(foreign=("root",))


def test_unlisted_users_leave_chart_accounts_only() -> None:
    wanted = [Account("serving", users=("svc",))]
    accounts = {"serving": Row("serving", "", MARK), "physics": Row("physics", "", "uni")}
    rows = [
        *ROOT_ROWS,
        Assoc("serving", "", "root", "1", frozenset({"normal"})),
        Assoc("serving", "svc", "", "1"),
        Assoc("serving", "gone", "", "1"),
        Assoc("physics", "gone", "", "1"),
    ]
    plan = acs.account_plan("rel", wanted, accounts, rows)
    assert plan.commands == ()
    assert plan.removals == (
        ("remove", "user", "where", "name=gone", "account=serving", "cluster=rel"),
    )


def test_an_account_whose_entry_went_is_neither_kept_nor_deleted() -> None:
    accounts = {"old": Row("old", "", MARK)}
    rows = [*ROOT_ROWS, Assoc("old", "", "root", "1"), Assoc("old", "alice", "", "1")]
    assert acs.account_plan("rel", [], accounts, rows) == acs.AccountPlan()


def test_an_account_made_before_the_cluster_was_registered_is_added_again() -> None:
    wanted = [Account("serving")]
    plan = acs.account_plan("rel", wanted, {"serving": Row("serving", "", MARK)}, ROOT_ROWS)
    assert plan.commands[0][:3] == ("add", "account", "name=serving")


def test_parents_are_made_before_their_children() -> None:
    wanted = [Account("a-child", parent="z-parent"), Account("z-parent"), Account("m")]
    plan = acs.account_plan("rel", wanted, {}, ROOT_ROWS)
    assert [c[2] for c in plan.commands] == ["name=z-parent", "name=a-child", "name=m"]


def test_a_parent_cycle_still_plans_every_account_once() -> None:
    wanted = [Account("a", parent="b"), Account("b", parent="a")]
    plan = acs.account_plan("rel", wanted, {}, ROOT_ROWS)
    assert sorted(c[2] for c in plan.commands) == ["name=a", "name=b"]


# --- listings -------------------------------------------------------------------


def test_listings() -> None:
    text = "root||||normal|\nserving||root|5|inference,normal|normal\nserving|svc||1|normal|\n"
    assert acs.parse_associations(text) == [
        Assoc("root", "", "", "", frozenset({"normal"})),
        Assoc("serving", "", "root", "5", frozenset({"inference", "normal"}), "normal"),
        Assoc("serving", "svc", "", "1", frozenset({"normal"})),
    ]
    assert acs.parse_accounts("root|default root account|root\nx|y\n") == {
        "root": Row("root", "default root account", "root")
    }


# --- one pass against a fake sacctmgr ---------------------------------------------


class FakeSacctmgr:
    """sacctmgr's listings as given; records the changes asked for."""

    def __init__(self, refuse: str = "") -> None:
        self.changes: list[list[str]] = []
        self.refuse = refuse
        self.admins: set[str] = set()

    def __call__(self, argv: Sequence[str], **_: object) -> subprocess.CompletedProcess[str]:
        args = list(argv[1:])
        if args[0] == "-i":
            self.changes.append(args[1:])
            if "adminlevel=Admin" in args:
                self.admins.add(next(a[5:] for a in args if a.startswith("name=")))
            if self.refuse and self.refuse in args:
                return subprocess.CompletedProcess(argv, 1, "", "Job(s) active")
            return subprocess.CompletedProcess(argv, 0, " Modified\n", "")
        what = args[3]
        out = {
            "cluster": "rel\n",
            "user": "".join(f"{a}|Administrator\n" for a in self.admins),
            "qos": "normal\n",
            "account": "root|default root account|root\nserving|svc|sunk-chart\n",
            "association": "root||||normal|\nserving||root|1|normal|\nserving|gone||1|normal|\n",
        }[what]
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_one_pass_runs_qos_then_cluster_then_accounts_then_associations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeSacctmgr()
    monkeypatch.setattr(acs.subprocess, "run", fake)
    values = {"cluster": "rel", "admins": ["op"], "qos": CHART_QOS, "clusterQos": ["normal"],
              "accounts": {"serving": {"description": "svc", "users": ["svc"]},
                           "teams": {"qos": ["normal", "inference"]}}}  # fmt: skip
    assert acs.apply(acs.settings_from(values)) == []
    kinds = [(c[0], c[1]) for c in fake.changes]
    assert kinds == [
        ("add", "user"),  # the admin
        ("add", "qos"),
        ("modify", "qos"),
        ("modify", "qos"),
        ("add", "account"),  # teams; serving is in step
        ("add", "user"),  # svc
        ("remove", "user"),  # gone
    ]


def test_a_refused_removal_is_reported_not_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeSacctmgr(refuse="name=gone")
    monkeypatch.setattr(acs.subprocess, "run", fake)
    values = {"cluster": "rel", "accounts": {"serving": {"description": "svc"}}}
    assert acs.apply(acs.settings_from(values)) == []
    assert "not removed, tried again at the next install or upgrade" in capsys.readouterr().out


def test_the_pass_waits_for_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    def unregistered(argv: Sequence[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(acs.subprocess, "run", unregistered)
    with pytest.raises(RuntimeError, match="not registered"):
        acs.apply(acs.settings_from({"cluster": "rel"}))


def test_nothing_modified_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def same(argv: Sequence[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, " Nothing modified\n", "")

    monkeypatch.setattr(acs.subprocess, "run", same)
    acs.sacctmgr(("modify", "qos", "where", "name=normal", "set", "priority=0"))


def test_the_chart_defaults_parse() -> None:
    """The slurm chart's own default QOS, as its values.yaml writes them."""
    values = yaml.safe_load((FILES.parent / "values.yaml").read_text())
    got = acs.settings_from({"cluster": "rel", **values["accounting"]})
    by_name = {q.name: q for q in got.qos}
    assert by_name["high"].preempt == ("normal", "inference")
    assert by_name["inference"].preempt == ("normal",)
    assert {q.grace_time for q in got.qos} == {30}
    assert got.cluster_qos == ("normal",)
    assert json.dumps(values["accounting"]["accounts"]) == "{}"
