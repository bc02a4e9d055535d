"""The slurm chart's accounting setup (docs/operators.md, "QOS and accounts"):
a post-install/post-upgrade hook that makes the accounting database hold what
the values say, in this order:

1. `admins`: sunk's operator and syncer get AdminLevel=Admin.
2. `accounting.qos`: missing QOS are made, then every QOS named gets the
   fields the values name (preempt lists name other QOS, hence all are made
   first). QOS not in values, and fields not named, are left alone; a QOS
   whose entry goes is no longer kept, never deleted.
3. `accounting.clusterQos`: the QOS list of the cluster's root association,
   which every association inherits unless its account names its own.
4. `accounting.accounts` (and `accounting.usersAccount`, which holds the
   `identity.users` no account lists): accounts made here are marked
   `Organization=sunk-chart`; only those are changed. An account of that name
   a person made is left alone and reported. An account whose entry goes is
   no longer kept, never deleted.
5. Their associations: listed users are added, unlisted ones removed from the
   accounts kept here. A removal Slurm refuses (a job of the association
   still runs) is reported and tried again at the next install or upgrade;
   nothing here cancels a job.

It runs as SlurmUser (an admin of the accounting database, over munge) and
passes every value to sacctmgr as its own argument, never through a shell.
Its settings are one JSON document (the environment's SETTINGS) the chart
renders from its values. Python's standard library only: it runs in the Slurm
image.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

MARK = "sunk-chart"
# Slurm's own root account: every account the values do not place elsewhere hangs here.
ROOT = "root"


@dataclass(frozen=True)
class Qos:
    name: str
    description: str = ""
    priority: int = 0
    preempt: tuple[str, ...] = ()
    preempt_mode: str = "cluster"
    grace_time: int = 0
    # Other sacctmgr QOS fields (MaxTRESPerUser, ...), by sacctmgr's name.
    limits: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Account:
    name: str
    description: str = ""
    parent: str = ROOT
    fairshare: int = 1
    # () = inherit the parent's list (the cluster's for a top-level account).
    qos: tuple[str, ...] = ()
    default_qos: str = ""  # "" = leave as it is
    users: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    cluster: str
    admins: tuple[str, ...] = ()
    qos: tuple[Qos, ...] = ()
    cluster_qos: tuple[str, ...] = ()
    accounts: tuple[Account, ...] = ()


def _names(value: object) -> tuple[str, ...]:
    return tuple(str(v).lower() for v in value or []) if isinstance(value, list) else ()


def settings_from(loaded: Mapping[str, object]) -> Settings:
    """The chart's JSON: {cluster, admins, qos: {name: {...}}, clusterQos,
    accounts: {name: {...}}, usersAccount, identityUsers}. Slurm keeps QOS,
    account and user names in lower case; so do the settings."""
    qos_values = loaded.get("qos") or {}
    assert isinstance(qos_values, dict)
    qos = tuple(
        Qos(
            name=str(name).lower(),
            description=str(q.get("description") or ""),
            priority=int(q.get("priority") or 0),
            preempt=_names(q.get("preempt")),
            preempt_mode=str(q.get("preemptMode") or "cluster").lower(),
            grace_time=int(q.get("graceTime") or 0),
            limits=tuple(sorted((str(k), str(v)) for k, v in (q.get("limits") or {}).items())),
        )
        for name, q in sorted(qos_values.items())
    )
    account_values = loaded.get("accounts") or {}
    assert isinstance(account_values, dict)
    accounts = [
        Account(
            name=str(name).lower(),
            description=str(a.get("description") or ""),
            parent=str(a.get("parent") or ROOT).lower(),
            fairshare=int(a.get("fairshare") or 1),
            qos=_names(a.get("qos")),
            default_qos=str(a.get("defaultQos") or "").lower(),
            users=_names(a.get("users")),
        )
        for name, a in sorted(account_values.items())
    ]
    return Settings(
        cluster=str(loaded["cluster"]).lower(),
        admins=_names(loaded.get("admins")),
        qos=qos,
        cluster_qos=_names(loaded.get("clusterQos")),
        accounts=with_users_account(
            accounts,
            str(loaded.get("usersAccount") or "").lower(),
            _names(loaded.get("identityUsers")),
        ),
    )


def with_users_account(
    accounts: Sequence[Account], users_account: str, identity_users: Sequence[str]
) -> tuple[Account, ...]:
    """`accounts` plus the identity users no account lists, in `users_account`
    (an entry of that name keeps its own settings and gains them). Every user
    who can log in then has an association, which enforcement needs."""
    listed = {user for account in accounts for user in account.users}
    unlisted = tuple(sorted({u for u in identity_users if u not in listed}))
    if not users_account or not unlisted:
        return tuple(accounts)
    out = []
    found = False
    for account in accounts:
        if account.name == users_account:
            found = True
            account = replace(account, users=account.users + unlisted)
        out.append(account)
    if not found:
        out.append(Account(users_account, "identity.users not in another account", users=unlisted))
    return tuple(sorted(out, key=lambda a: a.name))


# --- sacctmgr's listings -----------------------------------------------------


def parse_table(text: str) -> list[list[str]]:
    """`sacctmgr -n -P` rows."""
    return [line.split("|") for line in text.splitlines() if line]


@dataclass(frozen=True)
class AccountRow:
    """One account (`show account format=account,description,organization`)."""

    name: str
    description: str
    organization: str


@dataclass(frozen=True)
class AssocRow:
    """One association of the cluster (`show association
    format=account,user,parentname,share,qos,defaultqos`); user "" for an
    account's own. `qos` as sacctmgr lists it: inherited ones included."""

    account: str
    user: str
    parent: str = ""
    share: str = ""
    qos: frozenset[str] = frozenset()
    default_qos: str = ""


ACCOUNT_FORMAT = "format=account,description,organization"
ASSOC_FORMAT = "format=account,user,parentname,share,qos,defaultqos"


def parse_accounts(text: str) -> dict[str, AccountRow]:
    """Account listing rows by name; a row of another width is skipped."""
    rows = {}
    for row in parse_table(text):
        if len(row) == 3 and row[0]:
            rows[row[0]] = AccountRow(row[0], row[1], row[2])
    return rows


def _qos_list(text: str) -> frozenset[str]:
    return frozenset(q for q in text.split(",") if q)


def parse_associations(text: str) -> list[AssocRow]:
    rows = []
    for row in parse_table(text):
        if len(row) == 6 and row[0]:
            rows.append(AssocRow(row[0], row[1], row[2], row[3], _qos_list(row[4]), row[5]))
    return rows


def format_associations(rows: Iterable[AssocRow]) -> str:
    """What sacctmgr lists for `rows` (the tests' fake sacctmgr)."""
    return "".join(
        f"{r.account}|{r.user}|{r.parent}|{r.share}|{','.join(sorted(r.qos))}|{r.default_qos}\n"
        for r in rows
    )


# --- plans: sacctmgr argument lists, in the order they run --------------------


Command = tuple[str, ...]


def admin_commands(admins: Sequence[str], levels: Mapping[str, str]) -> list[Command]:
    """`levels`: user → AdminLevel as listed (`show user format=user,adminlevel`)."""
    commands: list[Command] = []
    for name in admins:
        if name not in levels:
            commands.append(("add", "user", f"name={name}", f"account={ROOT}", "adminlevel=Admin"))
        elif levels[name] != "Administrator":
            commands.append(("modify", "user", "where", f"name={name}", "set", "adminlevel=Admin"))
    return commands


def qos_commands(wanted: Sequence[Qos], existing: Iterable[str]) -> list[Command]:
    """Missing QOS made first, then every wanted one set to its fields (a
    field already so is "Nothing modified", which is no error)."""
    have = {name.lower() for name in existing}
    commands: list[Command] = [
        ("add", "qos", f"name={q.name}") for q in wanted if q.name not in have
    ]
    for q in wanted:
        commands.append(
            (
                "modify", "qos", "where", f"name={q.name}", "set",
                f"description={q.description}",
                f"priority={q.priority}",
                f"preempt={','.join(q.preempt)}",  # empty clears the list
                f"preemptmode={q.preempt_mode}",
                f"gracetime={q.grace_time}",
                *(f"{key}={value}" for key, value in q.limits),
            )
        )  # fmt: skip
    return commands


def cluster_qos_commands(
    cluster: str, wanted: Sequence[str], associations: Iterable[AssocRow]
) -> list[Command]:
    """The root association's QOS list, set when it differs ([] = leave it)."""
    if not wanted:
        return []
    root = [r for r in associations if r.account == ROOT and not r.user]
    if root and root[0].qos == frozenset(wanted):
        return []
    return [("modify", "cluster", "where", f"name={cluster}", "set", f"qos={','.join(wanted)}")]


@dataclass(frozen=True)
class AccountPlan:
    commands: tuple[Command, ...] = ()
    # Wanted accounts whose name a person's account already has: left alone.
    foreign: tuple[str, ...] = ()
    # User associations to remove (separate: Slurm may refuse them while a job runs).
    removals: tuple[Command, ...] = field(default=())


def _parent_first(accounts: Sequence[Account]) -> list[Account]:
    """Accounts ordered so that a wanted parent comes before its children; a
    cycle keeps the rest in name order (sacctmgr then refuses the orphan)."""
    by_name = {a.name: a for a in accounts}
    done: list[Account] = []
    seen: set[str] = set()

    def visit(account: Account, path: frozenset[str]) -> None:
        if account.name in seen or account.name in path:
            return
        parent = by_name.get(account.parent)
        if parent is not None:
            visit(parent, path | {account.name})
        if account.name not in seen:
            seen.add(account.name)
            done.append(account)

    for account in sorted(accounts, key=lambda a: a.name):
        visit(account, frozenset())
    return done


def account_plan(
    cluster: str,
    wanted: Sequence[Account],
    accounts: Mapping[str, AccountRow],
    associations: Sequence[AssocRow],
) -> AccountPlan:
    """What makes the wanted accounts and their users' associations so."""
    ours = {
        name for name, row in accounts.items() if row.organization.lower() == MARK and name != ROOT
    }
    # Slurm's root is never the chart's, whatever its listing says.
    foreign = tuple(
        sorted(
            a.name for a in wanted if a.name == ROOT or (a.name in accounts and a.name not in ours)
        )
    )
    kept = [a for a in _parent_first(wanted) if a.name not in foreign]
    own = {r.account: r for r in associations if not r.user}
    where = f"cluster={cluster}"
    commands: list[Command] = []
    for account in kept:
        row = own.get(account.name)
        if account.name not in ours or row is None:
            # New, or made before the cluster was registered: no association there yet.
            commands.append(
                (
                    "add", "account", f"name={account.name}", where,
                    f"organization={MARK}", f"description={account.description}",
                    f"parent={account.parent}", f"fairshare={account.fairshare}",
                    *((f"qos={','.join(account.qos)}",) if account.qos else ()),
                    *((f"defaultqos={account.default_qos}",) if account.default_qos else ()),
                )
            )  # fmt: skip
            continue
        changes = []
        if accounts[account.name].description != account.description:
            changes.append(f"description={account.description}")
        if row.parent and row.parent != account.parent:
            changes.append(f"parent={account.parent}")
        if row.share != str(account.fairshare):
            changes.append(f"fairshare={account.fairshare}")
        if account.qos:
            if row.qos != frozenset(account.qos):
                changes.append(f"qos={','.join(account.qos)}")
        else:
            parent = own.get(account.parent)
            if parent is not None and row.qos != parent.qos:
                changes.append("qos=")  # back to inheriting the parent's list
        if account.default_qos and row.default_qos != account.default_qos:
            changes.append(f"defaultqos={account.default_qos}")
        if changes:
            set_ = ("modify", "account", "where", f"name={account.name}", where, "set")
            commands.append((*set_, *changes))
    # Only accounts made here lose users: an association in any other is a person's.
    names = {a.name for a in kept}
    have = {(r.account, r.user) for r in associations if r.user and r.account in names & ours}
    want = {(a.name, user) for a in kept for user in a.users}
    for name, user in sorted(want - have):
        commands.append(("add", "user", f"name={user}", f"account={name}", where))
    removals = tuple(
        ("remove", "user", "where", f"name={user}", f"account={name}", where)
        for name, user in sorted(have - want)
    )
    return AccountPlan(tuple(commands), foreign, removals)


# --- running it ----------------------------------------------------------------


class Refused(RuntimeError):
    """sacctmgr said no."""


def run(argv: Sequence[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    said = (proc.stdout + proc.stderr).strip()
    # sacctmgr exits 1 when a modify finds everything already so.
    if proc.returncode != 0 and "Nothing modified" not in said:
        raise Refused(f"{' '.join(argv)}: {said}")
    return proc.stdout


def sacctmgr(command: Command) -> None:
    said = run(["sacctmgr", "-i", *command]).strip()
    unchanged = "Nothing modified" in said
    print(("unchanged: " if unchanged else "done: ") + "sacctmgr " + " ".join(command), flush=True)


def listing(*args: str) -> str:
    return run(["sacctmgr", "-n", "-P", "show", *args])


def apply(settings: Settings) -> list[str]:
    """One pass; what Slurm refused, one line each. RuntimeError until
    slurmctld has registered the cluster (sacctmgr refuses users before)."""
    clusters = {row[0].lower() for row in parse_table(listing("cluster", "format=cluster"))}
    if settings.cluster not in clusters:
        raise RuntimeError(f"cluster {settings.cluster} is not registered with slurmdbd yet")
    refused: list[str] = []

    def each(commands: Iterable[Command]) -> None:
        for command in commands:
            try:
                sacctmgr(command)
            except Refused as error:
                print(f"refused: {error}", flush=True)
                refused.append(str(error))

    levels = {row[0]: row[1] for row in parse_table(listing("user", "format=user,adminlevel"))}
    each(admin_commands(settings.admins, levels))
    existing = [row[0] for row in parse_table(listing("qos", "format=name"))]
    each(qos_commands(settings.qos, existing))
    cluster_filter = f"cluster={settings.cluster}"
    assocs = parse_associations(listing("association", "where", cluster_filter, ASSOC_FORMAT))
    each(cluster_qos_commands(settings.cluster, settings.cluster_qos, assocs))
    accounts = parse_accounts(listing("account", ACCOUNT_FORMAT))
    assocs = parse_associations(listing("association", "where", cluster_filter, ASSOC_FORMAT))
    plan = account_plan(settings.cluster, settings.accounts, accounts, assocs)
    for name in plan.foreign:
        print(f"account {name}: an account of that name exists, not made by the chart;"
              " left alone", flush=True)  # fmt: skip
    each(plan.commands)
    for command in plan.removals:
        try:
            sacctmgr(command)
        except Refused as error:
            # Most often a job of the association still runs: never cancelled here.
            print(f"not removed, tried again at the next install or upgrade: {error}", flush=True)
    levels = {row[0]: row[1] for row in parse_table(listing("user", "format=user,adminlevel"))}
    for name in settings.admins:
        if levels.get(name) != "Administrator":
            refused.append(f"{name}: AdminLevel {levels.get(name, 'none')!r}")
    return refused


def main() -> None:
    settings = settings_from(json.loads(os.environ["SETTINGS"]))
    deadline = time.monotonic() + float(os.environ.get("DEADLINE_SECONDS", "540"))
    while True:
        try:
            refused = apply(settings)
        except (RuntimeError, subprocess.TimeoutExpired) as failed:
            # slurmdbd not answering, or slurmctld not registered yet.
            refused = [str(failed)]
            print(f"pass skipped: {failed}", flush=True)
        if not refused:
            print("accounting setup done", flush=True)
            return
        if time.monotonic() > deadline:
            print("accounting setup not done:\n" + "\n".join(refused), file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(2)


if __name__ == "__main__":
    main()
