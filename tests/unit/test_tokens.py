"""`sunk tokens`: each grant's Secret gets a fresh token for its Slurm user."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Secret

from sunk.scheduler.tenancy import IdSet
from sunk.slurm.auth import MAX_TOKEN_LIFETIME, FileKey, StaticKey, mint
from sunk.tokens.run import (
    TOKEN_KEY,
    TokenGrant,
    run_tokens,
    tenant_uids,
    write_tenant_tokens,
    write_token,
)

KEY = b"k" * 32


def not_found() -> ApiError:
    response = httpx2.Response(
        404,
        json={"kind": "Status", "code": 404, "message": "not found"},
        request=httpx2.Request("PUT", "https://apiserver/api/v1/namespaces/ns/secrets/s"),
    )
    return ApiError(response=response)


class FakeKube:
    """The two writes `write_token` makes, on a dict of Secrets."""

    def __init__(self) -> None:
        self.secrets: dict[str, Secret] = {}

    async def replace(self, secret: Secret) -> Any:
        assert secret.metadata is not None
        if secret.metadata.name not in self.secrets:
            raise not_found()
        self.secrets[secret.metadata.name or ""] = secret

    async def create(self, secret: Secret) -> Any:
        assert secret.metadata is not None
        self.secrets[secret.metadata.name or ""] = secret


def claims(secret: Secret) -> dict[str, Any]:
    token = base64.b64decode((secret.data or {})[TOKEN_KEY]).decode()
    decoded: dict[str, Any] = jwt.decode(token, KEY, algorithms=["HS256"])
    return decoded


async def test_a_grant_gets_a_token_for_its_user_created_then_replaced() -> None:
    kube = FakeKube()
    grant = TokenGrant.parse("hpc-syncer-token=sunk-syncer")
    await write_token(kube, "ns", grant, StaticKey(KEY), 3600)  # type: ignore[arg-type]
    first = claims(kube.secrets["hpc-syncer-token"])
    assert first["sun"] == "sunk-syncer"
    assert first["exp"] - first["iat"] == 3600
    await write_token(kube, "ns", grant, StaticKey(KEY), 3600)  # type: ignore[arg-type]
    assert claims(kube.secrets["hpc-syncer-token"])["sun"] == "sunk-syncer"


@pytest.mark.parametrize("text", ["no-user", "=user", "secret=", ""])
def test_a_grant_names_a_secret_and_a_user(text: str) -> None:
    with pytest.raises(ValueError, match="expected <secret>=<slurm user>"):
        TokenGrant.parse(text)


async def test_tokens_are_refreshed_well_before_they_expire() -> None:
    with pytest.raises(ValueError, match="under half the lifetime"):
        await run_tokens(FakeKube(), "ns", [], StaticKey(KEY), lifetime=600, refresh=300)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["s=root", "s=0"])
def test_no_component_is_given_roots_token(text: str) -> None:
    with pytest.raises(ValueError, match="no component acts as root"):
        TokenGrant.parse(text)


async def test_no_token_lives_longer_than_a_day() -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_TOKEN_LIFETIME}s"):
        mint(KEY, "sunk-syncer", MAX_TOKEN_LIFETIME + 1, now=1000)
    with pytest.raises(ValueError, match=f"at most {MAX_TOKEN_LIFETIME}s"):
        await run_tokens(FakeKube(), "ns", [], StaticKey(KEY), lifetime=10**9, refresh=600)  # type: ignore[arg-type]
    token = mint(KEY, "sunk-syncer", MAX_TOKEN_LIFETIME, now=1000)
    assert token.expires_at == 1000 + MAX_TOKEN_LIFETIME


async def test_no_tenant_token_for_a_reserved_uid_or_one_below_1000() -> None:
    """The tenancy refuses such grants; `sunk tokens` holds the line on its own."""
    kube = FakeKube()
    uids = [0, 999, 5000, 64030, 64040, 64041, 65534, 7000]
    assert tenant_uids(uids) == [5000, 7000]
    assert tenant_uids([5000, 7000], IdSet.parse(["7000"])) == [5000]
    await write_tenant_tokens(kube, "ns", "tenant-tokens", uids, StaticKey(KEY), 3600)  # type: ignore[arg-type]
    data = kube.secrets["tenant-tokens"].data or {}
    assert sorted(data) == ["5000", "7000"]
    subjects = {
        jwt.decode(base64.b64decode(v).decode(), KEY, algorithms=["HS256"])["sun"]
        for v in data.values()
    }
    assert subjects == {"5000", "7000"}


async def test_a_rotated_key_file_signs_the_next_tokens(tmp_path: Path) -> None:
    """The JWT key's rotation (docs/charts.md): `sunk tokens` reads its key
    file at each write, so once the kubelet has replaced the mounted Secret,
    its next tokens verify with the new key only."""
    path = tmp_path / "jwt_hs256.key"
    path.write_bytes(KEY)
    kube = FakeKube()
    grant = TokenGrant("t", "sunk-syncer")
    await write_token(kube, "ns", grant, FileKey(path), 3600)  # type: ignore[arg-type]
    assert claims(kube.secrets["t"])["sun"] == "sunk-syncer"
    new = b"n" * 64
    path.write_bytes(new)
    await write_token(kube, "ns", grant, FileKey(path), 3600)  # type: ignore[arg-type]
    token = base64.b64decode((kube.secrets["t"].data or {})[TOKEN_KEY]).decode()
    assert jwt.decode(token, new, algorithms=["HS256"])["sun"] == "sunk-syncer"
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, KEY, algorithms=["HS256"])
