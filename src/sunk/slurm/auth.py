"""Tokens for slurmrestd: HS256 JWTs minted from the cluster's jwt key.

slurmctld accepts any token signed with its `jwt_key` that carries `iat`,
`exp` and `sun` (the Slurm user name), so sunk mints its own short-lived
tokens instead of asking `scontrol token` (which would need munge). The key
comes from a `KeySource`: a file in the test bed, a Kubernetes Secret later;
only the source changes.

Tokens never appear in logs, reprs or exception messages: they are held in
`Token`, whose repr shows the user and expiry only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import jwt


@dataclass(frozen=True)
class Token:
    """A bearer token; `value` is excluded from repr/str so it cannot leak into logs."""

    user: str
    expires_at: float  # time.time() seconds; inf for tokens of unknown life
    value: str = field(repr=False)

    def __str__(self) -> str:
        return repr(self)


class KeySource(Protocol):
    """Where the HS256 key comes from (a file, a Kubernetes Secret, ...)."""

    async def key(self) -> bytes: ...


@dataclass(frozen=True)
class FileKey:
    """The key in a file, read on every mint so a rotated key is picked up."""

    path: Path

    async def key(self) -> bytes:
        return await asyncio.to_thread(self.path.read_bytes)


@dataclass(frozen=True)
class StaticKey:
    """A key already in memory (e.g. read from a Secret by the caller)."""

    secret: bytes = field(repr=False)

    async def key(self) -> bytes:
        return self.secret


class Credentials(Protocol):
    """What SlurmClient needs: a user name and a currently valid token."""

    @property
    def user(self) -> str: ...

    async def token(self) -> Token: ...

    def invalidate(self) -> None:
        """Forget the current token (slurmctld rejected it); the next call renews."""


def mint(key: bytes, user: str, lifetime: float, now: float) -> Token:
    """One signed token for `user`, valid from `now` for `lifetime` seconds."""
    issued = int(now)
    expires = issued + max(1, int(lifetime))
    value = jwt.encode({"iat": issued, "exp": expires, "sun": user}, key, algorithm="HS256")
    return Token(user=user, expires_at=float(expires), value=value)


class JwtMinter:
    """Mints and caches tokens for one Slurm user; renews `renew_before` s before expiry.

    Short lifetimes bound the damage of a leaked token; renewing ahead of the
    expiry keeps a request from carrying a token that dies in flight.
    """

    def __init__(
        self,
        keys: KeySource,
        user: str,
        *,
        lifetime: float = 600.0,
        renew_before: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lifetime <= 0:
            raise ValueError(f"lifetime must be positive, got {lifetime}")
        self._keys = keys
        self._user = user
        self.lifetime = lifetime
        # Default: renew in the last fifth of the lifetime, at most 60 s ahead.
        self.renew_before = min(60.0, lifetime / 5) if renew_before is None else renew_before
        self._clock = clock
        self._current: Token | None = None
        self._lock = asyncio.Lock()
        self.minted = 0  # how many tokens were made; tests and metrics read it

    @property
    def user(self) -> str:
        return self._user

    def __repr__(self) -> str:
        return f"JwtMinter(user={self._user!r}, lifetime={self.lifetime})"

    def _usable(self, token: Token | None) -> bool:
        return token is not None and token.expires_at - self._clock() > self.renew_before

    async def token(self) -> Token:
        if self._usable(self._current):
            assert self._current is not None
            return self._current
        async with self._lock:  # one mint for many concurrent callers
            if not self._usable(self._current):
                key = await self._keys.key()
                self._current = mint(key, self._user, self.lifetime, self._clock())
                self.minted += 1
            assert self._current is not None
            return self._current

    def invalidate(self) -> None:
        self._current = None


class StaticToken:
    """A token made elsewhere (e.g. `scontrol token`); cannot be renewed."""

    def __init__(self, user: str, value: str) -> None:
        self._token = Token(user=user, expires_at=float("inf"), value=value)

    @property
    def user(self) -> str:
        return self._token.user

    def __repr__(self) -> str:
        return f"StaticToken(user={self._token.user!r})"

    async def token(self) -> Token:
        return self._token

    def invalidate(self) -> None:
        """Nothing to renew: a rejected static token stays rejected."""
