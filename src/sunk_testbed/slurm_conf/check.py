"""Checks a slurm.conf text the way slurmctld would read it, before it does.

Catches what makes slurmctld refuse to start or silently ignore a line:
unknown keys, malformed `Key=Value` pairs, bad hostlists, a node defined
twice, a global key set twice. Every problem names its line.
"""

from __future__ import annotations

import re

from sunk.slurm.hostlist import HostlistError, expand
from sunk_testbed.slurm_conf.keys import (
    DOWN_NODE_KEYS,
    FRONTEND_KEYS,
    GLOBAL_KEYS,
    NODE_KEYS,
    NODESET_KEYS,
    PARTITION_KEYS,
    POWER_ACTION_KEYS,
)
from sunk_testbed.slurm_conf.problems import Problem

_PAIR = re.compile(r'([A-Za-z][A-Za-z0-9_]*)=("[^"]*"|\S*)')

# The first key of a line decides what the line defines and which keys it may carry.
_LINE_KINDS: dict[str, frozenset[str]] = {
    "nodename": NODE_KEYS,
    "partitionname": PARTITION_KEYS,
    "nodeset": NODESET_KEYS,
    "downnodes": DOWN_NODE_KEYS,
    "frontendname": FRONTEND_KEYS,
    "poweraction": POWER_ACTION_KEYS,
}
_GLOBAL = {key.lower() for key in GLOBAL_KEYS}
# Keys that may be given more than once (primary and backup controllers).
_REPEATABLE = frozenset(["slurmctldhost", "controlmachine", "backupcontroller"])


def _lower(keys: frozenset[str]) -> frozenset[str]:
    return frozenset(key.lower() for key in keys)


_KIND_KEYS = {kind: _lower(keys) for kind, keys in _LINE_KINDS.items()}


def parse_pairs(line: str) -> list[tuple[str, str]] | None:
    """`A=1 B="x y"` -> [("A", "1"), ("B", "x y")]; None if anything else is on the line."""
    pairs: list[tuple[str, str]] = []
    rest = line
    position = 0
    for match in _PAIR.finditer(line):
        if line[position : match.start()].strip():
            return None
        pairs.append((match.group(1), match.group(2).strip('"')))
        position = match.end()
    rest = line[position:]
    if rest.strip() or not pairs:
        return None
    return pairs


def strip_comment(line: str) -> str:
    """Slurm ends a line at an unescaped '#'."""
    return re.split(r"(?<!\\)#", line, maxsplit=1)[0].strip()


def check_slurm_conf(text: str) -> list[Problem]:
    problems: list[Problem] = []
    node_lines: dict[str, int] = {}
    global_lines: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        where = f"line {number}"
        line = strip_comment(raw)
        if not line:
            continue
        if line.split()[0].lower() == "include":
            continue
        pairs = parse_pairs(line)
        if pairs is None:
            problems.append(Problem(where, f"not Key=Value pairs: {raw.strip()!r}"))
            continue
        kind = pairs[0][0].lower()
        allowed = _KIND_KEYS.get(kind)
        if allowed is None:
            for key, _ in pairs:
                if key.lower() not in _GLOBAL:
                    problems.append(Problem(where, f"unknown key {key!r}"))
                elif key.lower() in global_lines and key.lower() not in _REPEATABLE:
                    first = global_lines[key.lower()]
                    problems.append(Problem(where, f"{key} already set on line {first}"))
                else:
                    global_lines[key.lower()] = number
            continue
        for key, _ in pairs[1:]:
            if key.lower() not in allowed:
                problems.append(Problem(where, f"unknown key {key!r} on a {pairs[0][0]} line"))
        problems += _check_names(where, kind, pairs, node_lines, number)
    return problems


def _check_names(
    where: str,
    kind: str,
    pairs: list[tuple[str, str]],
    node_lines: dict[str, int],
    number: int,
) -> list[Problem]:
    problems: list[Problem] = []
    values = {key.lower(): value for key, value in pairs}
    hostlist_keys = {"nodename": ["nodename"], "partitionname": [], "downnodes": ["downnodes"]}
    for key in hostlist_keys.get(kind, []) + (["nodes"] if "nodes" in values else []):
        value = values.get(key, "")
        if value.upper() in ("DEFAULT", "ALL", ""):
            continue
        try:
            names = expand(value)
        except HostlistError as exc:
            problems.append(Problem(where, f"bad hostlist in {key}: {exc}"))
            continue
        if kind != "nodename" or key != "nodename":
            continue
        for name in names:
            if name in node_lines:
                problems.append(
                    Problem(where, f"node {name} already defined on line {node_lines[name]}")
                )
            else:
                node_lines[name] = number
    return problems
