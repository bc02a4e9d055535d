"""Values read from slurm.conf's text (the slurm chart's config ConfigMap).

Only what sunk's components need to agree with Slurm on, so each value is
set in one place: slurm.conf."""

from __future__ import annotations

import re

# Slurm's own default (slurm.conf(5)).
DEFAULT_KILL_WAIT = 30
MAX_KILL_WAIT = 65535  # a uint16 in Slurm
# slurmctld's own pattern for a pair (src/common/parse_config.c): spaces may
# stand around "=", a value is quoted or runs to the next space.
_PAIR = re.compile(r'\s*([A-Za-z0-9_.]+)\s*=\s*(?:"([^"]*)"|(\S+))(?:\s|$)', re.ASCII)
_DIGITS = re.compile(r"[0-9]{1,5}")


class SlurmConfError(ValueError):
    """slurm.conf text with a value sunk cannot take; names the key."""


def _uncommented(line: str) -> str:
    """The line up to its comment: `#` starts one unless escaped as `\\#`."""
    at = 0
    while (at := line.find("#", at)) != -1:
        if at == 0 or line[at - 1] != "\\":
            return line[:at]
        at += 1
    return line


def kill_wait(text: str) -> int:
    """KillWait in seconds; unset is Slurm's default. Keys are
    case-insensitive and may share a line with others. Set twice with
    different values is refused rather than guessed at. An `Include`d file is
    not read: set KillWait in slurm.conf itself."""
    values: list[str] = []
    for line in text.split("\n"):
        line = _uncommented(line)
        at = 0
        while (pair := _PAIR.match(line, at)) is not None:
            if pair[1].lower() == "killwait":
                values.append(pair[2] if pair[2] is not None else pair[3])
            at = pair.end()
    if not values:
        return DEFAULT_KILL_WAIT
    if len(set(values)) > 1:
        raise SlurmConfError(f"KillWait is set more than once: {', '.join(values)}")
    (value, *_) = values
    if _DIGITS.fullmatch(value) is None or int(value) > MAX_KILL_WAIT:
        raise SlurmConfError(f"KillWait={value!r}: not a number of seconds 0-{MAX_KILL_WAIT}")
    return int(value)
