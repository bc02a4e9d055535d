"""Tokens: claims slurmctld accepts, renewal before expiry, never shown."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import jwt
import pytest

from sunk.slurm import FileKey, JwtMinter, StaticKey, StaticToken, mint

KEY = b"k" * 32


def test_mint_has_the_claims_slurm_reads() -> None:
    token = mint(KEY, "root", 300, now=1000.5)
    claims = jwt.decode(token.value, KEY, algorithms=["HS256"], options={"verify_exp": False})
    assert claims == {"iat": 1000, "exp": 1300, "sun": "root"}
    assert token.expires_at == 1300
    assert token.user == "root"


def test_tokens_never_show_in_repr_str_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    token = mint(KEY, "root", 300, now=1000)
    for text in (repr(token), str(token), f"{token}", repr(StaticToken("root", token.value))):
        assert token.value not in text
    assert "root" in repr(token)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("test").info("token %s %r", token, token)
    assert token.value not in caplog.text


async def test_renews_before_expiry_and_after_invalidate() -> None:
    now = [1000.0]
    minter = JwtMinter(StaticKey(KEY), "slurm", lifetime=100, renew_before=20, clock=lambda: now[0])
    first = await minter.token()
    assert await minter.token() is first
    now[0] += 79  # 21 s left: still good
    assert await minter.token() is first
    now[0] += 2  # 19 s left: renew
    second = await minter.token()
    assert second is not first
    assert second.expires_at == 1181
    minter.invalidate()
    assert await minter.token() is not second
    assert minter.minted == 3
    assert "slurm" in repr(minter)


async def test_concurrent_callers_share_one_mint() -> None:
    minter = JwtMinter(StaticKey(KEY), "root")
    tokens = await asyncio.gather(*(minter.token() for _ in range(50)))
    assert len({t.value for t in tokens}) == 1
    assert minter.minted == 1


async def test_file_key_is_read_at_each_mint(tmp_path: Path) -> None:
    path = tmp_path / "jwt.key"
    path.write_bytes(KEY)
    minter = JwtMinter(FileKey(path), "root")
    jwt.decode((await minter.token()).value, KEY, algorithms=["HS256"])
    path.write_bytes(b"r" * 32)  # rotated
    minter.invalidate()
    jwt.decode((await minter.token()).value, b"r" * 32, algorithms=["HS256"])


def test_lifetime_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lifetime"):
        JwtMinter(StaticKey(KEY), "root", lifetime=0)
