"""Tokens for slurmrestd: JWTs minted from the cluster's keys.

slurmctld accepts any token that carries `iat`, `exp` and `sun` (the Slurm
user name) and is signed with its `jwt_key` (HS256) or with the private half
of an RS256 key its JWKS lists, found by the token's `kid`. So sunk mints its
own short-lived tokens instead of asking `scontrol token` (which would need
munge). A key comes from a `KeySource`: an HS256 key (bytes) or a
`SigningKey` (RS256, with its kid); `KeyDirectory` reads the RS256 keys of a
mounted Secret, one `<kid>.pem` each.

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
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass(frozen=True)
class Token:
    """A bearer token; `value` is excluded from repr/str so it cannot leak into logs."""

    user: str
    expires_at: float  # time.time() seconds; inf for tokens of unknown life
    value: str = field(repr=False)

    def __str__(self) -> str:
        return repr(self)


@dataclass(frozen=True)
class SigningKey:
    """An RS256 private key (PEM) and its id, which tokens name in their `kid`
    header: slurmctld verifies them with the public key of that id in its JWKS."""

    kid: str
    pem: bytes = field(repr=False)
    private: rsa.RSAPrivateKey = field(repr=False, compare=False)

    @classmethod
    def from_pem(cls, kid: str, pem: bytes) -> SigningKey:
        """Loaded once, here: a file that is no RSA private key fails now, naming
        the kid, not at the first mint."""
        try:
            private = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as error:
            raise ValueError(f"key {kid}: not an unencrypted PEM private key") from error
        if not isinstance(private, rsa.RSAPrivateKey):
            raise ValueError(f"key {kid}: not an RSA key (RS256 needs one)")
        return cls(kid, pem, private)


# An HS256 key (the bytes slurmctld's jwt_key file holds) or an RS256 one.
Key = bytes | SigningKey


class KeySource(Protocol):
    """Where the key comes from (a file, a Kubernetes Secret, ...)."""

    async def key(self) -> Key: ...


KEY_SUFFIX = ".pem"


@dataclass(frozen=True)
class KeyDirectory:
    """The RS256 keys of a mounted Secret, one `<kid>.pem` file each, read at
    every call (a kubelet replaces the files when the Secret changes). Kids
    sort by age: the keys hook and the rotation steps name keys by their UTC
    creation time, so the last is the newest."""

    path: Path

    async def keys(self) -> list[SigningKey]:
        def read() -> list[SigningKey]:
            # A Secret volume's own entries (..data, ..2026_...) start with a dot.
            files = sorted(
                f
                for f in self.path.iterdir()
                if f.name.endswith(KEY_SUFFIX) and not f.name.startswith(".")
            )
            return [
                SigningKey.from_pem(f.name.removesuffix(KEY_SUFFIX), f.read_bytes()) for f in files
            ]

        return await asyncio.to_thread(read)


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


# The longest a token sunk mints may live: slurmctld checks only `exp`, so a
# token's own claims are the only bound on how long a leaked one is good for.
MAX_TOKEN_LIFETIME = 86400


def mint(key: Key, user: str, lifetime: float, now: float) -> Token:
    """One signed token for `user`, valid from `now` for `lifetime` seconds
    (at most MAX_TOKEN_LIFETIME: ValueError beyond): HS256 with an HS256 key,
    RS256 naming the key's kid with a SigningKey."""
    if not lifetime <= MAX_TOKEN_LIFETIME:
        raise ValueError(f"a token lives at most {MAX_TOKEN_LIFETIME}s, not {lifetime}s")
    issued = int(now)
    expires = issued + max(1, int(lifetime))
    claims = {"iat": issued, "exp": expires, "sun": user}
    if isinstance(key, SigningKey):
        value = jwt.encode(claims, key.private, algorithm="RS256", headers={"kid": key.kid})
    else:
        value = jwt.encode(claims, key, algorithm="HS256")
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
        if not 0 < lifetime <= MAX_TOKEN_LIFETIME:
            raise ValueError(f"lifetime must be in (0, {MAX_TOKEN_LIFETIME}], got {lifetime}")
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


class FileToken:
    """Tokens minted elsewhere (by `sunk tokens`), read from a file that is
    replaced before the token in it expires (a mounted Secret). The component
    then holds no key: only a token for its own Slurm user, for an hour at most.

    The file is read again when it changed, when its token is about to expire,
    or after slurmctld refused it; its claims (`sun`, `exp`) are read without
    checking the signature, which is slurmctld's to check.
    """

    def __init__(
        self, path: Path, *, renew_before: float = 60.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self.renew_before = renew_before
        self._clock = clock
        self._current: Token | None = None
        self._read_at: float | None = None  # the file's mtime when read

    @property
    def user(self) -> str:
        return self._current.user if self._current else "(token file)"

    def __repr__(self) -> str:
        return f"FileToken({str(self.path)!r}, user={self.user!r})"

    async def token(self) -> Token:
        mtime = await asyncio.to_thread(lambda: self.path.stat().st_mtime)
        current = self._current
        if (
            current is None
            or mtime != self._read_at
            or current.expires_at - self._clock() <= self.renew_before
        ):
            value = (await asyncio.to_thread(self.path.read_text)).strip()
            current = _read_token(value, str(self.path))
            self._current, self._read_at = current, mtime
        return current

    def invalidate(self) -> None:
        self._current = None


def _read_token(value: str, source: str) -> Token:
    """A token's user and expiry from its claims (the value itself never in an error)."""
    try:
        claims = jwt.decode(value, options={"verify_signature": False})
        return Token(user=str(claims["sun"]), expires_at=float(claims["exp"]), value=value)
    except (jwt.InvalidTokenError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{source}: not a Slurm token ({type(error).__name__})") from None


def slurm_credentials(key_file: Path | None, token_file: Path | None, user: str) -> Credentials:
    """A component's Slurm credentials: tokens for `user` it mints from the
    cluster's key, or the tokens `sunk tokens` mints for it, from a file."""
    if (key_file is None) == (token_file is None):
        raise ValueError("give either the JWT key file or a token file, not both or neither")
    if token_file is not None:
        return FileToken(token_file)
    assert key_file is not None
    return JwtMinter(FileKey(key_file), user)


class TenantCredentials(Protocol):
    """Credentials to act as a uid in Slurm: the scheduler submits, signals and
    cancels each tenant's jobs as the tenant, so its own user needs no right to
    act for another."""

    def for_uid(self, uid: int) -> Credentials: ...


class TenantTokenFiles:
    """The tokens `sunk tokens` keeps for every granted uid, one file per uid
    (a mounted Secret, key = the uid). A uid granted a moment ago may have no
    file yet: its `token()` raises FileNotFoundError until the kubelet brings it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[int, FileToken] = {}

    def for_uid(self, uid: int) -> Credentials:
        if uid not in self._files:
            self._files[uid] = FileToken(self.directory / str(uid))
        return self._files[uid]


class TenantMinter:
    """Tokens for any uid, minted from the cluster's key: for the test beds'
    components, which hold the key (in a cluster, only `sunk tokens` does)."""

    def __init__(self, keys: KeySource) -> None:
        self._keys = keys
        self._minters: dict[int, JwtMinter] = {}

    def for_uid(self, uid: int) -> Credentials:
        if uid not in self._minters:
            self._minters[uid] = JwtMinter(self._keys, str(uid))
        return self._minters[uid]


def tenant_credentials(key_file: Path | None, tokens_dir: Path | None) -> TenantCredentials:
    """How the scheduler acts as each tenant: the tokens `sunk tokens` keeps for
    every granted uid, or tokens minted from the cluster's key (test beds)."""
    if tokens_dir is not None:
        return TenantTokenFiles(tokens_dir)
    if key_file is not None:
        return TenantMinter(FileKey(key_file))
    raise ValueError("the scheduler acts as each tenant: give the tenant tokens' directory")


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
