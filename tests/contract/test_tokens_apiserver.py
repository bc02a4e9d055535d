"""`sunk tokens` against the real apiserver: a token Secret is created, then
replaced with a fresher token, owned by the minter's ServiceAccount (so the
garbage collector takes it with the release)."""

from __future__ import annotations

import base64

import jwt
import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret, ServiceAccount

from sunk.slurm.auth import StaticKey
from sunk.tokens.run import TOKEN_KEY, TokenGrant, owner_of_tokens, write_token

pytestmark = pytest.mark.testbed

KEY = b"k" * 32


def token_of(secret: Secret) -> dict[str, object]:
    value = base64.b64decode((secret.data or {})[TOKEN_KEY]).decode()
    claims: dict[str, object] = jwt.decode(value, KEY, algorithms=["HS256"])
    return claims


async def test_a_token_secret_is_created_then_replaced_and_owned(
    kube: AsyncClient, namespace: str
) -> None:
    await kube.create(ServiceAccount(metadata=ObjectMeta(name="tokens", namespace=namespace)))
    owner = await owner_of_tokens(kube, namespace, "tokens")
    grant = TokenGrant("syncer-token", "sunk-syncer")
    await write_token(kube, namespace, grant, StaticKey(KEY), 3600, owner)
    first = await kube.get(Secret, "syncer-token", namespace=namespace)
    assert token_of(first)["sun"] == "sunk-syncer"
    assert first.metadata is not None
    assert [(o.kind, o.name, o.uid) for o in first.metadata.ownerReferences or []] == [
        ("ServiceAccount", "tokens", owner.uid)
    ]
    await write_token(kube, namespace, grant, StaticKey(KEY), 7200, owner)  # the refresh
    second = await kube.get(Secret, "syncer-token", namespace=namespace)
    claims = token_of(second)
    assert claims["exp"] - claims["iat"] == 7200  # type: ignore[operator]
    assert second.metadata is not None
    assert second.metadata.resourceVersion != first.metadata.resourceVersion
