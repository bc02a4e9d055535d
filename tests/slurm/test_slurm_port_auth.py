"""Tokens: claims slurmctld accepts, renewal before expiry, never shown."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import jwt
import pytest

from sunk.slurm import FileKey, JwtMinter, StaticKey, StaticToken, mint
from sunk.slurm.auth import FileToken, slurm_credentials

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


async def test_a_token_file_is_read_again_when_replaced_or_near_expiry(tmp_path: Path) -> None:
    """What a component holds under `sunk tokens`: no key, the token in a mounted
    Secret that is replaced before it expires."""
    now = [1000.0]
    path = tmp_path / "token"
    path.write_text(mint(KEY, "sunk-syncer", 300, now=1000).value + "\n")
    tokens = FileToken(path, renew_before=60, clock=lambda: now[0])
    first = await tokens.token()
    assert (first.user, first.expires_at) == ("sunk-syncer", 1300)
    assert tokens.user == "sunk-syncer"
    assert await tokens.token() is first  # unchanged file: no second read
    replaced = mint(KEY, "sunk-syncer", 300, now=1100)
    path.write_text(replaced.value)
    os.utime(path, (2000, 2000))  # a new mtime, as the kubelet's swap gives
    assert (await tokens.token()).value == replaced.value
    now[0] = 1350  # within renew_before of the expiry: read again (the newest there is)
    assert (await tokens.token()).expires_at == 1400
    path.write_text("not a token")
    os.utime(path, (3000, 3000))
    with pytest.raises(ValueError, match="not a Slurm token") as bad:
        await tokens.token()
    assert "not a token" not in str(bad.value)


def test_a_component_holds_a_key_or_a_token_file_never_both(tmp_path: Path) -> None:
    assert isinstance(slurm_credentials(tmp_path / "key", None, "slurm"), JwtMinter)
    assert isinstance(slurm_credentials(None, tmp_path / "token", "slurm"), FileToken)
    for key, token in ((None, None), (tmp_path / "key", tmp_path / "token")):
        with pytest.raises(ValueError, match="either"):
            slurm_credentials(key, token, "slurm")
