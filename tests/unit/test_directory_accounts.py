"""The slurm chart's directory-accounts loop (charts/slurm/files/directory_accounts.py):
its pure plan and parsers. A real slapd, nslcd, sacctmgr and slurmdbd run it
in tests/charts/test_local_up_identity.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.chart_files import chart_module

da = chart_module("directory_accounts")
MARK = da.MARK


def test_a_new_group_becomes_an_account_with_its_members() -> None:
    todo = da.plan({"Research": ["Alice", "bob"]}, {"root": ""}, [("root", ""), ("root", "root")])
    assert todo.add_accounts == ("research",)
    assert todo.add_associations == (("research", "alice"), ("research", "bob"))
    assert (todo.remove_associations, todo.remove_accounts, todo.foreign) == ((), (), ())


def test_in_step_means_nothing_to_do() -> None:
    todo = da.plan(
        {"research": ["alice"]},
        {"root": "", "research": MARK},
        [("research", ""), ("research", "alice")],
    )
    assert todo == da.Plan()


def test_an_account_made_before_the_cluster_was_registered_is_added_again() -> None:
    todo = da.plan({"research": ["alice"]}, {"research": MARK}, [])
    assert todo.add_accounts == ("research",)
    assert todo.add_associations == (("research", "alice"),)


def test_a_member_who_left_loses_the_association_and_a_gone_group_its_account() -> None:
    todo = da.plan(
        {"research": ["alice"]},
        {"research": MARK, "ml": MARK},
        [("research", "alice"), ("research", "bob"), ("ml", "carol")],
    )
    assert todo.remove_associations == (("research", "bob"),)
    # ml's associations go with the account, not one by one.
    assert todo.remove_accounts == ("ml",)


def test_accounts_and_associations_people_made_are_never_touched() -> None:
    todo = da.plan(
        {"research": ["alice"], "ops": ["dave"]},
        # ops was made by a person (no mark): not adopted, its members not added.
        {"research": MARK, "ops": "infra", "physics": "uni"},
        [("research", ""), ("research", "alice"), ("physics", "alice"), ("ops", "erin")],
    )
    assert todo.foreign == ("ops",)
    assert todo == da.Plan(foreign=("ops",))


def test_groups_and_members_come_from_getent_including_primary_groups() -> None:
    group = "research:*:3000:alice,bob\nml:*:3001:\nstaff:*:3002:carol,ghost\n"
    passwd = (
        "dave:x:2000:3001:Dave:/home/dave:/bin/bash\neve:x:2001:9999::/home/eve:/bin/sh\n"
        "alice:x:2002:3000::/home/alice:/bin/sh\nbob:x:2003:3000::/home/bob:/bin/sh\n"
        "carol:x:2004:3002::/home/carol:/bin/sh\n"
    )
    assert da.parse_groups(group, passwd, []) == {
        "research": {"alice", "bob"},
        "ml": {"dave"},
        "staff": {"carol"},  # ghost does not resolve: no one's
    }
    assert da.parse_groups(group, passwd, ["ml"]) == {"ml": {"dave"}}


def test_sacctmgr_rows() -> None:
    assert da.parse_table("root|\nresearch|alice\n\n") == [["root", ""], ["research", "alice"]]


def test_settings_are_read_from_the_file_each_pass(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"groups": ["research"], "interval": 10}')
    assert da.settings(path) == (["research"], 10.0)
    path.write_text('{"groups": [], "interval": 30}')
    assert da.settings(path) == ([], 30.0)


def test_a_directory_that_lists_no_group_removes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty listing reads the same as an unanswered directory."""
    answers = {
        ("sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"): "slurm\n",
        ("getent", "-s", "ldap", "group"): "",
        ("getent", "-s", "ldap", "passwd"): "",
        ("getent", "-s", "files", "passwd"): "root:x:0:0:root:/root:/bin/bash\n",
        ("sacctmgr", "-n", "-P", "show", "account", "format=account,organization"): (
            f"research|{MARK}\n"
        ),
        ("sacctmgr", "-n", "-P", "show", "association", "format=account,user,qos"): (
            "research|alice|normal\n"
        ),
    }
    changes: list[tuple[str, ...]] = []
    monkeypatch.setattr(da, "run", lambda argv: answers[tuple(argv)])
    monkeypatch.setattr(da, "sacctmgr", lambda *args: changes.append(args))
    da.sync([])
    assert changes == []
    assert "nothing removed" in capsys.readouterr().out


def test_reserved_and_out_of_range_ids_and_local_accounts_are_never_members() -> None:
    """nslcd's filters hide them already; the loop does not rely on it."""
    ids = da.IdRange(1000, 59999, frozenset({64030, 64040, 65534}))
    group = (
        "research:*:3000:alice,slurm,sunk-operator,mallory\n"
        "admins:*:64040:alice\n"  # a reserved gid: never an account
        "high:*:70000:alice\n"  # outside the range
        "root-ish:*:0:alice\n"
    )
    passwd = (
        "alice:x:3001:3000::/home/alice:/bin/bash\n"
        "mallory:x:64040:3000::/home/m:/bin/bash\n"  # an admin's uid
        "trudy:x:3002:3000::/home/t:/bin/bash\n"
        "oscar:x:3003:0::/home/o:/bin/bash\n"  # root's group as primary
        "peggy:x:500:3000::/home/p:/bin/bash\n"  # below the range
    )
    groups = da.parse_groups(group, passwd, [], ids, ["root", "slurm", "sunk-operator"])
    assert groups == {"research": {"alice", "trudy"}}


def test_each_member_left_out_is_told_naming_the_rule() -> None:
    ids = da.IdRange(1000, 59999, frozenset({64030, 64040, 65534}))
    group = (
        "research:*:3000:alice,slurm,mallory,ghost,oscar,peggy\n"
        "admins:*:64040:alice\n"
        "high:*:70000:alice\n"
        "other:*:3100:ghost\n"  # not chosen: not told
    )
    passwd = (
        "alice:x:3001:3000::/home/alice:/bin/bash\n"
        "mallory:x:64040:3000::/home/m:/bin/bash\n"
        "oscar:x:3003:0::/home/o:/bin/bash\n"
        "peggy:x:500:3000::/home/p:/bin/bash\n"
    )
    told = da.refusals(group, passwd, ["research", "admins", "high"], ids, ["root", "slurm"])
    span = "identity.ldap.minUid..maxUid (1000-59999)"
    reserved = "reserved (ids, admins, identity.reservedIds)"
    assert told[:2] == [
        "group research: member slurm not taken: a local account of the Slurm pods"
        " (root, a daemon or an admin)",
        f"group research: member mallory not taken: uid 64040 is {reserved}",
    ]
    assert told[2].startswith("group research: member ghost not taken: no directory user")
    assert span in told[2]
    assert told[3:] == [
        f"group research: member oscar not taken: primary group 0 is root's or {reserved}",
        f"group research: member peggy not taken: uid 500 is outside {span}",
        f"group admins not taken: gid 64040 is {reserved}",
        f"group high not taken: gid 70000 is outside {span}",
    ]


def test_a_refusal_is_printed_once_while_it_stands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = {"group": "research:*:3000:alice,ghost\n"}
    answers = {
        ("sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"): "slurm\n",
        ("getent", "-s", "ldap", "passwd"): "alice:x:3001:3000::/home/alice:/bin/bash\n",
        ("getent", "-s", "files", "passwd"): "root:x:0:0:root:/root:/bin/bash\n",
        ("sacctmgr", "-n", "-P", "show", "account", "format=account,organization"): (
            f"research|{MARK}\n"
        ),
        ("sacctmgr", "-n", "-P", "show", "association", "format=account,user,qos"): (
            "root||normal\nresearch||normal\nresearch|alice|normal\n"
        ),
    }

    def run(argv: list[str]) -> str:
        if argv == ["getent", "-s", "ldap", "group"]:
            return listing["group"]
        return str(answers[tuple(argv)])

    monkeypatch.setattr(da, "run", run)
    monkeypatch.setattr(da, "sacctmgr", lambda *args: None)
    told: set[str] = set()
    for _ in range(2):
        da.sync([], None, told)
    assert capsys.readouterr().out.count("member ghost not taken") == 1
    listing["group"] = "research:*:3000:alice\n"  # gone: forgotten
    da.sync([], None, told)
    listing["group"] = "research:*:3000:alice,ghost\n"  # back: told again
    da.sync([], None, told)
    assert capsys.readouterr().out.count("member ghost not taken") == 1


def test_the_settings_file_carries_the_directory_range(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        '{"groups": [], "interval": 5, "minUid": 2000, "maxUid": 3000,'
        ' "reserved": ["64030", "65534"]}'
    )
    assert da.id_range(path) == da.IdRange(2000, 3000, frozenset({64030, 65534}))
    path.write_text('{"groups": [], "interval": 5}')
    assert da.id_range(path) == da.IdRange()


def test_accounts_made_here_keep_the_qos_list_of_the_settings() -> None:
    listed = {"research": frozenset({"normal"}), "ml": frozenset({"normal", "inference"})}
    assert da.qos_changes(["research", "ml"], listed, ["inference", "normal"], frozenset()) == [
        ("modify", "account", "where", "name=research", "set", "qos=inference,normal")
    ]


def test_an_empty_qos_list_inherits_the_clusters() -> None:
    listed = {"research": frozenset({"normal"}), "ml": frozenset({"high"})}
    assert da.qos_changes(["research", "ml", "gone"], listed, [], frozenset({"normal"})) == [
        ("modify", "account", "where", "name=ml", "set", "qos=")
    ]


def test_the_qos_list_is_read_from_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"groups": [], "interval": 5, "qos": ["Normal", "inference"]}')
    assert da.account_qos(path) == ["normal", "inference"]
    path.write_text('{"groups": []}')
    assert da.account_qos(path) == []
