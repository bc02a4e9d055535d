"""Slurm hostlist expressions: `gpu[01-04,07]`, `rack[1-2]-n[1-3]`, `a,b[1-2]`.

`expand` and `compress` follow Slurm's rules closely enough that what we
write, slurmctld reads back as the same set of names: numbers with leading
zeros keep their width, ranges are inclusive, several bracket groups in one
name multiply out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from itertools import product

# A guard against `node[0-999999999]`: expanding it would exhaust memory long
# before Slurm could tell the user. Slurm's own MaxNodeCount-scale clusters
# stay far below this.
MAX_HOSTS = 1_000_000

_TRAILING_NUMBER = re.compile(r"^(.*?)([0-9]+)([^0-9]*)$")


class HostlistError(ValueError):
    """A malformed hostlist; the message names the expression and the problem."""


def _split_top_level(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(expr):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"{expr!r}: nested '[' at position {i}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"{expr!r}: ']' without '[' at position {i}")
        elif char == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"{expr!r}: '[' is never closed")
    parts.append(expr[start:])
    return parts


def _ranges_of(expr: str, body: str) -> list[tuple[range, int]]:
    """`01-03,7` -> its numbers, each run with its width (0: unpadded)."""
    return [_range(expr, item) for item in body.split(",")]


def _range(expr: str, item: str) -> tuple[range, int]:
    lo, sep, hi = item.partition("-")
    if not _digits(lo) or (sep and not _digits(hi)):
        raise HostlistError(f"{expr!r}: bad range {item!r} (want N or N-M)")
    start, end = int(lo), int(hi) if sep else int(lo)
    if end < start:
        raise HostlistError(f"{expr!r}: range {item!r} runs backwards")
    return range(start, end + 1), len(lo) if lo.startswith("0") or not sep else 0


def _expand_one(expr: str, part: str) -> list[str]:
    # Alternate literal text and bracket bodies: "r[1-2]-n[3]" -> r, 1-2, -n, 3, "".
    pieces = re.split(r"\[([^\]]*)\]", part)
    brackets: list[list[tuple[range, int]]] = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0 and ("[" in piece or "]" in piece):
            raise HostlistError(f"{expr!r}: unbalanced brackets in {part!r}")
        if i % 2:
            brackets.append(_ranges_of(expr, piece))
    # Counted before, not after, multiplying out: `n[0-999999][0-999999]` is refused at once.
    if math.prod(sum(len(numbers) for numbers, _ in runs) for runs in brackets) > MAX_HOSTS:
        raise HostlistError(f"{expr!r}: more than {MAX_HOSTS} hosts")
    numbers = iter(brackets)
    choices = [
        [str(n).zfill(width) for run, width in next(numbers) for n in run] if i % 2 else [piece]
        for i, piece in enumerate(pieces)
    ]
    return ["".join(combo) for combo in product(*choices)]


def _digits(text: str) -> bool:
    """ASCII digits: str.isdigit also takes superscripts, which int() refuses."""
    return text.isascii() and text.isdigit()


def expand(expr: str) -> list[str]:
    """All host names of a hostlist expression, in order, duplicates kept."""
    expr = expr.strip()
    if not expr:
        return []
    names: list[str] = []
    for part in _split_top_level(expr):
        part = part.strip()
        if not part:
            raise HostlistError(f"{expr!r}: empty element")
        if any(c.isspace() for c in part):
            raise HostlistError(f"{expr!r}: whitespace inside {part!r}")
        names.extend(_expand_one(expr, part))
        if len(names) > MAX_HOSTS:
            raise HostlistError(f"{expr!r}: more than {MAX_HOSTS} hosts")
    return names


def _fits(digits: str, width: int) -> bool:
    """May `digits` continue a range whose numbers are `width` wide (0 = unpadded)?"""
    if width:
        return len(digits) == width
    return not (digits.startswith("0") and len(digits) > 1)


def compress(names: Iterable[str]) -> str:
    """The shortest usual hostlist for `names` (duplicates dropped).

    Groups keep the order in which their prefix first appears; numbers within
    a group are sorted. Only the last run of digits is ranged, which is what
    Slurm itself does for one-dimensional names.
    """
    groups: dict[tuple[str, str], set[str]] = {}
    singles: dict[str, None] = {}
    order: list[tuple[str, str] | str] = []
    for name in names:
        match = _TRAILING_NUMBER.match(name)
        if match is None:
            if name not in singles:
                singles[name] = None
                order.append(name)
            continue
        key = (match.group(1), match.group(3))
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(match.group(2))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, suffix = item
        ranges = _ranges(sorted(groups[item], key=lambda d: (int(d), len(d))))
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            out.append(f"{prefix}{ranges[0][0]}{suffix}")
        else:
            body = ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
            out.append(f"{prefix}[{body}]{suffix}")
    return ",".join(out)


def _ranges(numbers: list[str]) -> list[tuple[str, str]]:
    ranges: list[tuple[str, str]] = []
    for digits in numbers:
        if ranges:
            lo, hi = ranges[-1]
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            if int(digits) == int(hi) + 1 and _fits(digits, width):
                ranges[-1] = (lo, digits)
                continue
        ranges.append((digits, digits))
    return ranges
