"""Directory groups as Slurm accounts: the slurm chart's `identity.ldap.accounts`
(docs/identity.md#groups-partitions-and-accounts).

Runs beside slurmdbd as SlurmUser (an admin of the accounting database, over
munge) and, every `interval` seconds of its settings file, makes Slurm's accounts follow the
directory: one account per chosen group, one association per member (the
group's `memberUid`s and the users whose primary group it is), read through
NSS (`getent -s ldap`, the pod's nslcd). It changes only accounts it made,
marked `Organization=sunk-directory`: an account of the same name that a
person made, and people's associations anywhere else, are left alone. A
removal Slurm refuses (a job of that association still running) is tried
again next pass; nothing here cancels a job.

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


def parse_groups(group_lines: str, passwd_lines: str, chosen: Sequence[str]) -> dict[str, set[str]]:
    """`getent group` and `getent passwd` output → chosen group → members
    (all groups when `chosen` is empty)."""
    groups: dict[str, set[str]] = {}
    by_gid: dict[str, str] = {}
    for line in group_lines.splitlines():
        fields = line.split(":")
        if len(fields) != 4:
            continue
        name, _, gid, members = fields
        if chosen and name not in chosen:
            continue
        groups[name] = {m for m in members.split(",") if m}
        by_gid[gid] = name
    for line in passwd_lines.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[3] in by_gid:
            groups[by_gid[fields[3]]].add(fields[0])
    return groups


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


def sync(chosen: Sequence[str]) -> Plan:
    if not run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]).strip():
        raise RuntimeError("slurmctld has not registered the cluster with slurmdbd yet")
    groups = parse_groups(
        run(["getent", "-s", "ldap", "group"]), run(["getent", "-s", "ldap", "passwd"]), chosen
    )
    accounts = {
        row[0]: row[1]
        for row in parse_table(
            run(["sacctmgr", "-n", "-P", "show", "account", "format=account,organization"])
        )
        if len(row) == 2
    }
    associations = [
        (row[0], row[1])
        for row in parse_table(
            run(["sacctmgr", "-n", "-P", "show", "association", "format=account,user"])
        )
        if len(row) == 2
    ]
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
    for name in todo.add_accounts:
        sacctmgr(
            "add", "account", name, f"organization={MARK}", f"description=directory group {name}"
        )
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


def main() -> None:
    # PID 1 of its container: SIGTERM would otherwise be ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    path = Path(sys.argv[1])
    said = None
    while True:
        chosen, interval = settings(path)
        if (chosen, interval) != said:
            print(
                f"groups as accounts: {' '.join(chosen) or 'every group'}; every {interval:g}s",
                flush=True,
            )
            said = (chosen, interval)
        try:
            sync(chosen)
        except (RuntimeError, subprocess.TimeoutExpired) as failed:
            # slurmdbd or nslcd not answering yet: the next pass reads again.
            print(f"pass skipped: {failed}", flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main()
