"""`sunk tokens`: each grant's Secret gets a fresh token for its Slurm user."""

from __future__ import annotations

import base64
from typing import Any

import httpx2
import jwt
import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Secret

from sunk.slurm.auth import StaticKey
from sunk.tokens.run import TOKEN_KEY, TokenGrant, run_tokens, write_token

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
