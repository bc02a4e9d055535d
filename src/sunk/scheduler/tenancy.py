"""Who may use the scheduler, and as whom in Slurm: the tenancy the cluster admin writes (pure).

A pod's annotations ask for a Slurm account, QOS, partition, reservation and
uid/gid; none of them is taken on trust. The admin's tenancy (the scheduler's
ConfigMap, see docs/security.md) grants each namespace what it may use:

    tenants:
      - namespaces: [team-a, team-a-dev]
        uids: 5000-5099        # the uids its pods may run as ("N" or "LOW-HIGH")
        user: 5000             # the uid of a pod that names none
        gids: 5000-5099        # optional; without it, the user's own group only
        group: 5000            # optional: the gid of a pod that names none
        accounts: [team-a]     # the first is the default; [] = the user's default
        partitions: [gpu]      # the first is the default; [] = the scheduler's own
        qos: [normal, high]    # [] = none may be asked (the account's default)
        reservations: []

A namespace no tenant lists is not served. Uids and gids below 1000 (root,
system accounts) are never granted, nor the reserved ids: those the charts
give Slurm's daemons (SlurmUser 64030, slurmrestd 64031, ...), the Slurm
Admins of sunk's operator and syncer (64040, 64041), sunk's own pods (65532)
and `nobody` (65534), reserved whatever the document says; its `reserved`
adds more (ids of a site's own daemons). A range that holds one is refused.
At most 2,000 uids in all (each has a Slurm token of its own). A refusal
names the rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

MIN_ID = 1000  # below: root, system users and groups
# (uid_t)-2 and -1 are "no id" to the kernel and to Slurm (NO_VAL, INFINITE).
MAX_ID = 4294967293
# The ids the charts give a daemon, an admin or `nobody`, never a tenant's:
# the slurm chart's `ids` (SlurmUser 64030, slurmrestd 64031, mysql 64032,
# munge 64033, nslcd 64034, slapd 64035, the ssh key lookup 64036) and
# `admins` (sunk-operator 64040, sunk-syncer 64041), sunk's own pods (65532)
# and nobody (65534). A token for one of them acts as that daemon in Slurm.
DEFAULT_RESERVED: tuple[str, ...] = ("64030-64036", "64040-64041", "65532", "65534")
# `sunk tokens` keeps a Slurm token for every granted uid in one Secret (the
# scheduler acts as each tenant with its own); at ~200 bytes a token, this
# many stay well under a Secret's 1 MiB.
MAX_GRANTED_UIDS = 2000
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class TenancyError(ValueError):
    """The tenancy document is invalid; the message names the field."""


def _bounds(value: str) -> tuple[int, int]:
    """`N` or `LOW-HIGH`, within 0..MAX_ID; ValueError naming the value."""
    match = _RANGE.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not N or LOW-HIGH")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if low > high:
        raise ValueError(f"{value!r}: the range is empty")
    if high > MAX_ID:
        raise ValueError(f"{value!r}: ids above {MAX_ID} are not ids")
    return low, high


def _id_range(value: str) -> tuple[int, int]:
    low, high = _bounds(value)
    if low < MIN_ID:
        raise ValueError(f"{value!r}: ids below {MIN_ID} are never granted")
    return low, high


@dataclass(frozen=True)
class IdSet:
    """Ids as sorted, disjoint, non-adjacent ranges (low, high), both ends in."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, values: Iterable[str | int]) -> IdSet:
        """From `N`/`LOW-HIGH` items; ValueError naming a bad one."""
        return cls.of(_bounds(str(value)) for value in values)

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]]) -> IdSet:
        merged: list[tuple[int, int]] = []
        for low, high in sorted(ranges):
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        return cls(tuple(merged))

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and any(low <= value <= high for low, high in self.ranges)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.ranges)

    def within(self, low: int, high: int) -> IdSet:
        """The part of this set in low..high."""
        return IdSet.of(
            (max(low, a), min(high, b)) for a, b in self.ranges if a <= high and b >= low
        )

    def items(self) -> list[str]:
        """As the document writes it: `N` or `LOW-HIGH` each."""
        return [str(low) if low == high else f"{low}-{high}" for low, high in self.ranges]

    def __str__(self) -> str:
        return ",".join(self.items()) or "none"


RESERVED = IdSet.parse(DEFAULT_RESERVED)


class Grant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    namespaces: list[str] = Field(min_length=1)
    uids: str
    user: int
    gids: str | None = None
    group: int | None = None
    accounts: list[str] = []
    partitions: list[str] = []
    qos: list[str] = []
    reservations: list[str] = []
    # The tenancy's reserved ids, set when the Tenancy is validated (the
    # defaults for a Grant made on its own): never allowed, whatever the range.
    _reserved: IdSet = PrivateAttr(default=RESERVED)

    @field_validator("uids", "gids")
    @classmethod
    def _valid_range(cls, value: str | None) -> str | None:
        if value is not None:
            _id_range(value)
        return value

    @model_validator(mode="after")
    def _defaults_within(self) -> Grant:
        # The ranges only: the tenancy's reserved ids are checked by the Tenancy.
        low, high = _id_range(self.uids)
        if not low <= self.user <= high:
            raise ValueError(f"user {self.user} is outside uids {self.uids}")
        if self.group is not None:
            low, high = _id_range(self.gids) if self.gids is not None else (1, 0)
            if not low <= self.group <= high:
                raise ValueError(f"group {self.group} is outside gids {self.gids}")
        return self

    def allows_uid(self, uid: int) -> bool:
        low, high = _id_range(self.uids)
        return low <= uid <= high and uid not in self._reserved

    def granted_uids(self) -> list[int]:
        low, high = _id_range(self.uids)
        return [uid for uid in range(low, high + 1) if uid not in self._reserved]

    def allows_gid(self, gid: int) -> bool:
        if self.gids is None:
            return False
        low, high = _id_range(self.gids)
        return low <= gid <= high and gid not in self._reserved

    def chosen(self, field: str, asked: str | None, fallback: str | None = None) -> str | None:
        """The `field` (accounts, partitions, qos, reservations) a pod gets: what it
        asked if granted, else the first granted one; ValueError if not granted.
        `fallback` stands for an empty grant (the scheduler's own partition)."""
        granted: list[str] = getattr(self, field) or ([fallback] if fallback else [])
        if asked is None:
            return granted[0] if granted else None
        if asked in granted:
            return asked
        raise ValueError(f"{asked!r} is not granted (granted: {', '.join(granted) or 'none'})")


class Tenancy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Ids no tenant may have (`N` or `LOW-HIGH` each), besides the charts' own
    # (DEFAULT_RESERVED, which this lists by default and which stay reserved
    # when it does not).
    reserved: list[str] = list(DEFAULT_RESERVED)
    tenants: list[Grant] = []

    @field_validator("reserved", mode="before")
    @classmethod
    def _ids_as_text(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("reserved")
    @classmethod
    def _valid_reserved(cls, value: list[str]) -> list[str]:
        IdSet.parse(value)
        return value

    def reserved_ids(self) -> IdSet:
        """The listed ids, and the charts' own whatever the list says."""
        return IdSet.of([*RESERVED, *IdSet.parse(self.reserved)])

    @model_validator(mode="after")
    def _one_grant_per_namespace(self) -> Tenancy:
        reserved = self.reserved_ids()
        for index, grant in enumerate(self.tenants):
            for field, value in (("uids", grant.uids), ("gids", grant.gids)):
                if value is None:
                    continue
                if clash := reserved.within(*_id_range(value)).ranges:
                    raise ValueError(
                        f"tenants.{index}.{field}: {value} holds reserved ids"
                        f" {IdSet(clash)} (a daemon's, an admin's or nobody's;"
                        f" reserved: {reserved})"
                    )
            grant._reserved = reserved
        seen: set[str] = set()
        for grant in self.tenants:
            for namespace in grant.namespaces:
                if namespace in seen:
                    raise ValueError(f"namespace {namespace} is listed by two tenants")
                seen.add(namespace)
        # Counted from the ranges: a range of millions is refused, not listed.
        granted = IdSet.of(_id_range(grant.uids) for grant in self.tenants)
        if (count := sum(high - low + 1 for low, high in granted)) > MAX_GRANTED_UIDS:
            raise ValueError(
                f"{count} uids granted in all; at most {MAX_GRANTED_UIDS}"
                " (each gets a Slurm token of its own, kept in one Secret)"
            )
        return self

    def uids(self) -> list[int]:
        """Every granted uid, once, in order."""
        return sorted({uid for grant in self.tenants for uid in grant.granted_uids()})

    def grant_for(self, namespace: str) -> Grant | None:
        return next((g for g in self.tenants if namespace in g.namespaces), None)

    def to_yaml(self) -> str:
        """The document as `parse_tenancy` reads it (defaults written out)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def parse_tenancy(text: str, source: str) -> Tenancy:
    """The tenancy from its YAML; TenancyError naming `source` and the field."""
    try:
        document = yaml.safe_load(text) or {}
        return Tenancy.model_validate(document)
    except yaml.YAMLError as error:
        raise TenancyError(f"{source}: not YAML: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            ".".join(str(p) for p in e["loc"]) + ": " + e["msg"].removeprefix("Value error, ")
            if e["loc"]
            else e["msg"].removeprefix("Value error, ")
            for e in error.errors()
        )
        raise TenancyError(f"{source}: {problems}") from None
