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
system accounts, SlurmUser) are never granted, and at most 2,000 uids in all
(each has a Slurm token of its own). A refusal names the rule.
"""

from __future__ import annotations

import re

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MIN_ID = 1000  # below: root, system users and groups, SlurmUser
# `sunk tokens` keeps a Slurm token for every granted uid in one Secret (the
# scheduler acts as each tenant with its own); at ~200 bytes a token, this
# many stay well under a Secret's 1 MiB.
MAX_GRANTED_UIDS = 2000
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class TenancyError(ValueError):
    """The tenancy document is invalid; the message names the field."""


def _id_range(value: str) -> tuple[int, int]:
    match = _RANGE.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not N or LOW-HIGH")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if low > high:
        raise ValueError(f"{value!r}: the range is empty")
    if low < MIN_ID:
        raise ValueError(f"{value!r}: ids below {MIN_ID} are never granted")
    return low, high


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

    @field_validator("uids", "gids")
    @classmethod
    def _valid_range(cls, value: str | None) -> str | None:
        if value is not None:
            _id_range(value)
        return value

    @model_validator(mode="after")
    def _defaults_within(self) -> Grant:
        if not self.allows_uid(self.user):
            raise ValueError(f"user {self.user} is outside uids {self.uids}")
        if self.group is not None and not self.allows_gid(self.group):
            raise ValueError(f"group {self.group} is outside gids {self.gids}")
        return self

    def allows_uid(self, uid: int) -> bool:
        low, high = _id_range(self.uids)
        return low <= uid <= high

    def granted_uids(self) -> range:
        low, high = _id_range(self.uids)
        return range(low, high + 1)

    def allows_gid(self, gid: int) -> bool:
        if self.gids is None:
            return False
        low, high = _id_range(self.gids)
        return low <= gid <= high

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

    tenants: list[Grant] = []

    @model_validator(mode="after")
    def _one_grant_per_namespace(self) -> Tenancy:
        seen: set[str] = set()
        for grant in self.tenants:
            for namespace in grant.namespaces:
                if namespace in seen:
                    raise ValueError(f"namespace {namespace} is listed by two tenants")
                seen.add(namespace)
        if (count := len(self.uids())) > MAX_GRANTED_UIDS:
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


def parse_tenancy(text: str, source: str) -> Tenancy:
    """The tenancy from its YAML; TenancyError naming `source` and the field."""
    try:
        document = yaml.safe_load(text) or {}
        return Tenancy.model_validate(document)
    except yaml.YAMLError as error:
        raise TenancyError(f"{source}: not YAML: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'document'}: {e['msg']}"
            for e in error.errors()
        )
        raise TenancyError(f"{source}: {problems}") from None
