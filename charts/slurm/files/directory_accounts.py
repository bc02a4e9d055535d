"""Directory groups as Slurm accounts: the slurm chart's `identity.ldap.accounts`
(docs/identity.md#groups-partitions-and-accounts).

Runs beside slurmdbd as SlurmUser (an admin of the accounting database, over
munge) and, every `interval` seconds of its settings file, makes Slurm's accounts follow the
directory: one account per chosen group, one association per member (the
group's `memberUid`s and the users whose primary group it is), read through
NSS (`getent -s ldap`, the pod's nslcd, which lists in pages and filters out
ids outside the directory range and reserved ones). It checks the same again:
a group or user with a reserved id or one outside the range, and a member
that is a local account (root, a daemon, an admin), are never taken, and
each one left out is logged once, naming the rule. It changes only accounts
it made, marked `Organization=sunk-directory`: an account of the same name
that a person made, and people's associations anywhere else, are left alone. A
removal Slurm refuses (a job of that association still running) is tried
again next pass; nothing here cancels a job. The accounts it makes get the
QOS list of its settings (`qos`; [] = inherit the cluster's), kept each pass.

Python's standard library only: it runs in the Slurm image.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MARK = "sunk-directory"

Association = tuple[str, str]  # (account, user)


@dataclass(frozen=True)
class Plan:
    add_accounts: tuple[str, ...] = ()
    add_associations: tuple[Association, ...] = ()
    remove_associations: tuple[Association, ...] = ()
    remove_accounts: tuple[str, ...] = ()
    # Chosen groups whose account a person made (left alone, said once a pass).
    foreign: tuple[str, ...] = ()


def plan(
    groups: Mapping[str, Iterable[str]],
    accounts: Mapping[str, str],
    associations: Iterable[Association],
) -> Plan:
    """What to change so that the accounts marked as ours are exactly `groups`
    (name → members); `accounts` is every account (name → organization),
    `associations` every (account, user) pair. Slurm keeps account and user
    names in lower case; so does the plan."""
    wanted = {name.lower(): {user.lower() for user in users} for name, users in groups.items()}
    ours = {name for name, org in accounts.items() if org.lower() == MARK}
    foreign = sorted(name for name in wanted if name in accounts and name not in ours)
    managed = {name: users for name, users in wanted.items() if name not in foreign}
    have = {(account, user) for account, user in associations if user and account in ours}
    # An account made before slurmctld registered the cluster has no
    # association there: adding it again makes one.
    on_cluster = {account for account, user in associations if not user}
    want = {(account, user) for account, users in managed.items() for user in users}
    gone = sorted(ours - managed.keys())
    return Plan(
        add_accounts=tuple(sorted(managed.keys() - (ours & on_cluster))),
        add_associations=tuple(sorted(want - have)),
        # An account that goes takes its associations with it.
        remove_associations=tuple(sorted(p for p in have - want if p[0] not in gone)),
        remove_accounts=tuple(gone),
        foreign=tuple(foreign),
    )


def qos_changes(
    accounts: Iterable[str],
    listed: Mapping[str, frozenset[str]],
    wanted: Sequence[str],
    inherited: frozenset[str],
) -> list[tuple[str, ...]]:
    """sacctmgr arguments that give each of `accounts` (made here, on the
    cluster) the QOS list `wanted`; [] = inherit `inherited` (the root
    association's). `listed`: account → its QOS as sacctmgr lists them
    (inherited ones included, so a list equal to the parent's reads as
    inherited)."""
    want = frozenset(q.lower() for q in wanted)
    changes: list[tuple[str, ...]] = []
    for name in sorted(accounts):
        have = listed.get(name)
        if have is None:
            continue
        if want and have != want:
            changes.append(
                (
                    "modify",
                    "account",
                    "where",
                    f"name={name}",
                    "set",
                    f"qos={','.join(sorted(want))}",
                )
            )
        elif not want and have != inherited:
            changes.append(("modify", "account", "where", f"name={name}", "set", "qos="))
    return changes


@dataclass(frozen=True)
class IdRange:
    """The ids a directory entry may have: low..high, none reserved (the
    chart's `identity.ldap.minUid`/`maxUid` and reserved ids)."""

    low: int = 1000
    high: int = 59999
    reserved: frozenset[int] = frozenset()

    def allows(self, number: int) -> bool:
        return self.low <= number <= self.high and number not in self.reserved


@dataclass(frozen=True)
class User:
    """A `getent passwd` entry."""

    name: str
    uid: int
    gid: int
    gecos: str = ""
    home: str = ""
    shell: str = ""


@dataclass(frozen=True)
class Group:
    """A `getent group` entry."""

    name: str
    gid: int
    members: tuple[str, ...] = ()


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def parse_passwd(text: str) -> list[User]:
    """`getent passwd` lines; a malformed one is skipped. Lines end at "\\n"
    only (a GECOS field may hold any other line break)."""
    users = []
    for line in text.split("\n"):
        fields = line.split(":")
        if len(fields) != 7 or not fields[0]:
            continue
        uid, gid = _number(fields[2]), _number(fields[3])
        if uid is None or gid is None:
            continue
        users.append(User(fields[0], uid, gid, *fields[4:7]))
    return users


def parse_group(text: str) -> list[Group]:
    """`getent group` lines; a malformed one is skipped."""
    groups = []
    for line in text.split("\n"):
        fields = line.split(":")
        if len(fields) != 4 or not fields[0]:
            continue
        gid = _number(fields[2])
        if gid is None:
            continue
        groups.append(Group(fields[0], gid, tuple(m for m in fields[3].split(",") if m)))
    return groups


def format_passwd(users: Iterable[User]) -> str:
    return "".join(f"{u.name}:x:{u.uid}:{u.gid}:{u.gecos}:{u.home}:{u.shell}\n" for u in users)


def format_group(groups: Iterable[Group]) -> str:
    return "".join(f"{g.name}:x:{g.gid}:{','.join(g.members)}\n" for g in groups)


def parse_groups(
    group_lines: str,
    passwd_lines: str,
    chosen: Sequence[str],
    ids: IdRange | None = None,
    local: Iterable[str] = (),
) -> dict[str, set[str]]:
    """`getent group` and `getent passwd` output → chosen group → members
    (all groups when `chosen` is empty). A group whose gid `ids` does not
    allow is left out; so is a member that does not resolve (`passwd_lines`
    does not list it), one whose uid `ids` does not allow or whose primary
    gid is root's or reserved, and a `local` account (root, a
    daemon, an admin: never a directory user's to give)."""
    ids = ids or IdRange()
    local = set(local)
    users = parse_passwd(passwd_lines)
    refused = {
        u.name for u in users if not ids.allows(u.uid) or u.gid == 0 or u.gid in ids.reserved
    } | local
    # A member must resolve: a name nslcd hides (a reserved uid) is no one's.
    taken = {u.name for u in users} - refused
    groups: dict[str, set[str]] = {}
    by_gid: dict[int, str] = {}
    for group in parse_group(group_lines):
        if (chosen and group.name not in chosen) or not ids.allows(group.gid):
            continue
        groups[group.name] = {m for m in group.members if m in taken}
        by_gid[group.gid] = group.name
    for user in users:
        if user.gid in by_gid and user.name in taken:
            groups[by_gid[user.gid]].add(user.name)
    return groups


def refusals(
    group_lines: str,
    passwd_lines: str,
    chosen: Sequence[str],
    ids: IdRange | None = None,
    local: Iterable[str] = (),
) -> list[str]:
    """Why each group or member that `parse_groups` leaves out is not taken,
    one line each, naming the rule and the value that sets it. A member that
    does not resolve at all is most often one nslcd's filters hid (a uid
    outside the range or reserved): the directory's own entry is not
    readable here, so the line names every rule that hides one."""
    ids = ids or IdRange()
    local = set(local)
    users = {u.name: u for u in parse_passwd(passwd_lines)}
    span = f"identity.ldap.minUid..maxUid ({ids.low}-{ids.high})"
    why_reserved = "reserved (ids, admins, identity.reservedIds)"
    lines = []
    for group in parse_group(group_lines):
        if chosen and group.name not in chosen:
            continue
        if not ids.allows(group.gid):
            rule = why_reserved if group.gid in ids.reserved else f"outside {span}"
            lines.append(f"group {group.name} not taken: gid {group.gid} is {rule}")
            continue
        for name in group.members:
            user = users.get(name)
            if name in local:
                reason = "a local account of the Slurm pods (root, a daemon or an admin)"
            elif user is None:
                reason = (
                    "no directory user of that name resolves: nslcd lists only users with"
                    f" a uid in {span}, neither uid nor primary group reserved (ids, admins,"
                    " identity.reservedIds), and a primary group other than root's"
                )
            elif user.uid in ids.reserved:
                reason = f"uid {user.uid} is {why_reserved}"
            elif not ids.allows(user.uid):
                reason = f"uid {user.uid} is outside {span}"
            elif user.gid == 0 or user.gid in ids.reserved:
                reason = f"primary group {user.gid} is root's or {why_reserved}"
            else:
                continue
            lines.append(f"group {group.name}: member {name} not taken: {reason}")
    return list(dict.fromkeys(lines))


def parse_table(text: str) -> list[list[str]]:
    """`sacctmgr -n -P` rows."""
    return [line.split("|") for line in text.splitlines() if line]


def run(argv: Sequence[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def sacctmgr(*args: str) -> None:
    """One change, logged; one that Slurm refuses is logged with its reason."""
    try:
        run(["sacctmgr", "-i", *args])
    except RuntimeError as refused:
        print(f"not done, tried again next pass: {refused}", flush=True)
        return
    print("done: sacctmgr " + " ".join(args), flush=True)


def sync(
    chosen: Sequence[str],
    ids: IdRange | None = None,
    told: set[str] | None = None,
    qos: Sequence[str] = (),
) -> Plan:
    """One pass. `told` holds the refusals already printed: each is printed
    once while it stands, and again if it comes back after going."""
    if not run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]).strip():
        raise RuntimeError("slurmctld has not registered the cluster with slurmdbd yet")
    group_lines = run(["getent", "-s", "ldap", "group"])
    passwd_lines = run(["getent", "-s", "ldap", "passwd"])
    local = [user.name for user in parse_passwd(run(["getent", "-s", "files", "passwd"]))]
    groups = parse_groups(group_lines, passwd_lines, chosen, ids, local)
    refused = refusals(group_lines, passwd_lines, chosen, ids, local)
    told = set() if told is None else told
    for line in refused:
        if line not in told:
            print(line, flush=True)
    told.intersection_update(refused)
    told.update(refused)
    accounts = {
        row[0]: row[1]
        for row in parse_table(
            run(["sacctmgr", "-n", "-P", "show", "account", "format=account,organization"])
        )
        if len(row) == 2
    }
    rows = [
        row
        for row in parse_table(
            run(["sacctmgr", "-n", "-P", "show", "association", "format=account,user,qos"])
        )
        if len(row) == 3
    ]
    associations = [(row[0], row[1]) for row in rows]
    listed_qos = {
        row[0]: frozenset(q for q in row[2].split(",") if q) for row in rows if not row[1]
    }
    todo = plan(groups, accounts, associations)
    if not groups and (todo.remove_accounts or todo.remove_associations):
        # No group at all reads the same as a directory that did not answer:
        # removing every account on that is not worth the risk.
        print("the directory lists no chosen group: nothing removed this pass", flush=True)
        todo = Plan()
    for name in todo.foreign:
        print(
            f"group {name}: an account of that name exists, not made here; left alone", flush=True
        )
    with_qos = (f"qos={','.join(qos)}",) if qos else ()
    for name in todo.add_accounts:
        sacctmgr(
            "add",
            "account",
            name,
            f"organization={MARK}",
            f"description=directory group {name}",
            *with_qos,
        )
    ours = {name for name, org in accounts.items() if org.lower() == MARK}
    kept = (ours & {g.lower() for g in groups}) - set(todo.add_accounts)
    for change in qos_changes(kept, listed_qos, qos, listed_qos.get("root", frozenset())):
        sacctmgr(*change)
    for account, user in todo.add_associations:
        sacctmgr("add", "user", user, f"account={account}")
    for account, user in todo.remove_associations:
        sacctmgr("remove", "user", user, f"account={account}")
    for name in todo.remove_accounts:
        sacctmgr("remove", "account", name)
    return todo


def settings(path: Path) -> tuple[list[str], float]:
    """The chosen groups ([] = all) and the seconds between passes."""
    loaded = json.loads(path.read_text())
    return [str(g) for g in loaded.get("groups") or []], float(loaded.get("interval", 30))


def account_qos(path: Path) -> list[str]:
    """The QOS list of the accounts made here ([] = inherit the cluster's)."""
    return [str(q).lower() for q in json.loads(path.read_text()).get("qos") or []]


def id_range(path: Path) -> IdRange:
    """The directory range and the reserved ids (the chart's values)."""
    loaded = json.loads(path.read_text())
    return IdRange(
        int(loaded.get("minUid", 1000)),
        int(loaded.get("maxUid", 59999)),
        frozenset(int(i) for i in loaded.get("reserved") or []),
    )


def main() -> None:
    # PID 1 of its container: SIGTERM would otherwise be ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    path = Path(sys.argv[1])
    said = None
    told: set[str] = set()
    while True:
        chosen, interval = settings(path)
        if (chosen, interval) != said:
            print(
                f"groups as accounts: {' '.join(chosen) or 'every group'}; every {interval:g}s",
                flush=True,
            )
            said = (chosen, interval)
        try:
            sync(chosen, id_range(path), told, account_qos(path))
        except (RuntimeError, subprocess.TimeoutExpired) as failed:
            # slurmdbd or nslcd not answering yet: the next pass reads again.
            print(f"pass skipped: {failed}", flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main()
