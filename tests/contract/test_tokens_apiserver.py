"""`sunk tokens` against the real apiserver: a token Secret is created, then
replaced with a fresher token, owned by the minter's ServiceAccount (so the
garbage collector takes it with the release); the tenants' tokens follow the
tenancy ConfigMap as it is edited."""

from __future__ import annotations

import asyncio
import base64
import contextlib

import jwt
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Secret, ServiceAccount

from sunk.scheduler.tenancy_watch import TENANCY_KEY, TenancyWatch
from sunk.slurm.auth import StaticKey
from sunk.tokens.run import (
    TOKEN_KEY,
    TenantTokens,
    TokenGrant,
    owner_of_tokens,
    run_tokens,
    write_token,
)

pytestmark = pytest.mark.contract

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
    await write_token(kube, namespace, grant, KEY, 3600, owner)
    first = await kube.get(Secret, "syncer-token", namespace=namespace)
    assert token_of(first)["sun"] == "sunk-syncer"
    assert first.metadata is not None
    assert [(o.kind, o.name, o.uid) for o in first.metadata.ownerReferences or []] == [
        ("ServiceAccount", "tokens", owner.uid)
    ]
    await write_token(kube, namespace, grant, KEY, 7200, owner)  # the refresh
    second = await kube.get(Secret, "syncer-token", namespace=namespace)
    claims = token_of(second)
    assert claims["exp"] - claims["iat"] == 7200  # type: ignore[operator]
    assert second.metadata is not None
    assert second.metadata.resourceVersion != first.metadata.resourceVersion


async def test_each_granted_uid_has_a_token_as_the_tenancy_changes(
    kube: AsyncClient, namespace: str
) -> None:
    """A uid granted by an edit has its token at once, not at the next refresh;
    one no longer granted loses it."""

    def tenancy(uids: str) -> str:
        return f"tenants: [{{namespaces: [team-a], uids: '{uids}', user: {uids[:4]}}}]"

    await kube.create(
        ConfigMap(
            metadata=ObjectMeta(name="tenancy", namespace=namespace),
            data={TENANCY_KEY: tenancy("5000-5002")},
        )
    )
    watch = TenancyWatch(kube, namespace, "tenancy", report_invalid=False)
    tenants = TenantTokens("tenant-tokens", watch)
    minting = asyncio.create_task(
        run_tokens(kube, namespace, [], StaticKey(KEY), refresh=600, tenants=tenants)
    )

    async def tokens_for(uids: set[str]) -> None:
        while True:
            with contextlib.suppress(ApiError):
                secret = await kube.get(Secret, "tenant-tokens", namespace=namespace)
                data = secret.data or {}
                if set(data) == uids:
                    for uid, value in data.items():
                        claims = jwt.decode(base64.b64decode(value), KEY, algorithms=["HS256"])
                        assert claims["sun"] == uid  # slurmctld looks the uid up
                    return
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(tokens_for({"5000", "5001", "5002"}), 10)
        await kube.patch(
            ConfigMap, "tenancy", {"data": {TENANCY_KEY: tenancy("6000")}}, namespace=namespace
        )
        await asyncio.wait_for(tokens_for({"6000"}), 5)  # the refresh is 600 s away
    finally:
        minting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await minting
