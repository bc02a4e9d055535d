"""`sunk tokens`: each grant's Secret gets a fresh token for its Slurm user."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from lightkube import ApiError
from lightkube.resources.core_v1 import Secret

from sunk.scheduler.tenancy import IdSet
from sunk.slurm.auth import (
    MAX_TOKEN_LIFETIME,
    FileKey,
    Key,
    KeyDirectory,
    SigningKey,
    StaticKey,
    mint,
)
from sunk.tokens.run import (
    TOKEN_KEY,
    NewestTakenKey,
    TokenGrant,
    TokenMetrics,
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
    await write_token(kube, "ns", grant, KEY, 3600)  # type: ignore[arg-type]
    first = claims(kube.secrets["hpc-syncer-token"])
    assert first["sun"] == "sunk-syncer"
    assert first["exp"] - first["iat"] == 3600
    await write_token(kube, "ns", grant, KEY, 3600)  # type: ignore[arg-type]
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
    await write_tenant_tokens(kube, "ns", "tenant-tokens", uids, KEY, 3600)  # type: ignore[arg-type]
    data = kube.secrets["tenant-tokens"].data or {}
    assert sorted(data) == ["5000", "7000"]
    subjects = {
        jwt.decode(base64.b64decode(v).decode(), KEY, algorithms=["HS256"])["sun"]
        for v in data.values()
    }
    assert subjects == {"5000", "7000"}


async def test_a_rotated_hs256_key_file_signs_the_next_rounds_tokens(tmp_path: Path) -> None:
    """An HS256 key file replaced (a kubelet updating the mounted Secret): the
    key is read at each round, so the next tokens verify with the new key only."""
    path = tmp_path / "jwt_hs256.key"
    path.write_bytes(KEY)
    kube = FakeKube()
    grant = TokenGrant("t", "sunk-syncer")
    minting = asyncio.create_task(
        run_tokens(kube, "ns", [grant], FileKey(path), lifetime=3600, refresh=0.05)  # type: ignore[arg-type]
    )
    new = b"n" * 64

    def signed_with(key: bytes) -> bool:
        if "t" not in kube.secrets:
            return False
        token = base64.b64decode((kube.secrets["t"].data or {})[TOKEN_KEY]).decode()
        try:
            return bool(jwt.decode(token, key, algorithms=["HS256"])["sun"] == "sunk-syncer")
        except jwt.InvalidSignatureError:
            return False

    try:
        await _until(lambda: signed_with(KEY))
        path.write_bytes(new)
        await _until(lambda: signed_with(new))
        assert not signed_with(KEY)
    finally:
        minting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await minting


async def test_each_round_is_exported_with_its_time_and_tenant_count() -> None:
    """What an alert needs to say the tokens age: when every Secret was last
    written, and how many rounds there were."""
    kube = FakeKube()
    metrics = TokenMetrics()
    before = time.time()
    minting = asyncio.create_task(
        run_tokens(
            kube,  # type: ignore[arg-type]
            "ns",
            [TokenGrant("t", "sunk-syncer")],
            StaticKey(KEY),
            lifetime=3600,
            refresh=0.05,
            metrics=metrics,
        )
    )

    def value(name: str) -> float:
        return metrics.registry.get_sample_value(name) or 0.0

    try:
        await _until(lambda: value("sunk_tokens_writes_total") >= 2)
        assert value("sunk_tokens_written_timestamp_seconds") >= before
        assert value("sunk_tokens_tenant_uids") == 0
    finally:
        minting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await minting


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- RS256 keys: signing with the newest Slurm takes ------------------------------


def _rsa_pem() -> bytes:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="module")
def pems() -> dict[str, bytes]:
    """Three keys, by kid (UTC creation times, so they sort by age)."""
    return {kid: _rsa_pem() for kid in ("20260101T000000Z", "20260201T000000Z", "20260301T000000Z")}


def _public(pem: bytes) -> rsa.RSAPublicKey:
    private = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(private, rsa.RSAPrivateKey)
    return private.public_key()


def _key_dir(tmp_path: Path, pems: dict[str, bytes], kids: list[str]) -> Path:
    directory = tmp_path / "keys"
    directory.mkdir(exist_ok=True)
    for old in directory.glob("*.pem"):
        old.unlink()
    for kid in kids:
        (directory / f"{kid}.pem").write_bytes(pems[kid])
    # What a kubelet puts beside a Secret's keys: never read as keys.
    (directory / "..data").mkdir(exist_ok=True)
    return directory


def test_an_rs256_token_names_its_key_and_verifies_with_its_public_half(
    pems: dict[str, bytes],
) -> None:
    """What slurmctld checks: alg RS256, the kid of a key in its JWKS, the
    signature by that key's public half, and `sun`, `iat`, `exp`."""
    kid, pem = next(iter(pems.items()))
    token = mint(SigningKey.from_pem(kid, pem), "sunk-syncer", 600, now=1000)
    assert jwt.get_unverified_header(token.value) == {"alg": "RS256", "kid": kid, "typ": "JWT"}
    claims = jwt.decode(
        token.value, _public(pem), algorithms=["RS256"], options={"verify_exp": False}
    )
    assert claims == {"iat": 1000, "exp": 1600, "sun": "sunk-syncer"}
    other = pems[sorted(pems)[-1]]
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token.value, _public(other), algorithms=["RS256"], options={"verify_exp": False})
    assert pem not in repr(SigningKey.from_pem(kid, pem)).encode()


def test_a_key_that_is_not_an_rsa_private_key_is_refused_naming_its_kid() -> None:
    with pytest.raises(ValueError, match="key bad: not an unencrypted PEM private key"):
        SigningKey.from_pem("bad", b"-----BEGIN PRIVATE KEY-----\nxx\n-----END PRIVATE KEY-----\n")


async def test_the_key_directory_lists_the_secrets_keys_oldest_first(
    tmp_path: Path, pems: dict[str, bytes]
) -> None:
    kids = sorted(pems, reverse=True)
    directory = _key_dir(tmp_path, pems, kids)
    (directory / "README").write_text("not a key")
    assert [k.kid for k in await KeyDirectory(directory).keys()] == sorted(pems)


class Slurm:
    """Which kids slurmctld's JWKS lists; None: it does not answer."""

    def __init__(self, kids: set[str] | None) -> None:
        self.kids = kids
        self.asked: list[str] = []

    async def probe(self, key: SigningKey) -> bool | None:
        self.asked.append(key.kid)
        return None if self.kids is None else key.kid in self.kids


async def test_the_newest_key_slurm_takes_signs_and_a_newer_one_waits_until_it_does(
    tmp_path: Path, pems: dict[str, bytes]
) -> None:
    """The rotation (docs/charts.md): a key added to the Secret signs only once
    slurmctld takes it; until then the one in use goes on, and the new one is
    asked about at every round."""
    first, second, _ = sorted(pems)
    directory = _key_dir(tmp_path, pems, [first])
    slurm = Slurm({first})
    choice = NewestTakenKey(KeyDirectory(directory), slurm.probe)
    assert _kid(await choice.key()) == first
    assert not choice.pending
    _key_dir(tmp_path, pems, [first, second])  # step 1: the new key, not in the JWKS yet
    assert _kid(await choice.key()) == first
    assert choice.pending
    slurm.asked.clear()
    assert _kid(await choice.key()) == first
    assert slurm.asked == [second]  # the key in use is not asked about again
    slurm.kids = {first, second}  # step 2: Slurm reloaded its JWKS
    assert _kid(await choice.key()) == second
    assert not choice.pending
    slurm.asked.clear()
    assert _kid(await choice.key()) == second
    assert slurm.asked == []  # nothing newer: Slurm is not asked
    _key_dir(tmp_path, pems, [second])  # step 4: the old key removed
    slurm.kids = {second}
    assert _kid(await choice.key()) == second


async def test_a_newer_key_waits_while_slurm_does_not_answer(
    tmp_path: Path, pems: dict[str, bytes]
) -> None:
    """No answer is no yes: the key in use goes on; at a first start with no
    answer, the oldest key (in the JWKS until its successor signs)."""
    first, second, third = sorted(pems)
    directory = _key_dir(tmp_path, pems, [first, second, third])
    slurm = Slurm(None)
    choice = NewestTakenKey(KeyDirectory(directory), slurm.probe)
    assert _kid(await choice.key()) == first
    assert choice.pending
    slurm.kids = {first, second}
    assert _kid(await choice.key()) == second  # the newest taken, the third still waits
    assert choice.pending
    slurm.kids = None
    assert _kid(await choice.key()) == second


async def test_a_fresh_start_signs_with_the_newest_key_slurm_takes(
    tmp_path: Path, pems: dict[str, bytes]
) -> None:
    first, second, third = sorted(pems)
    directory = _key_dir(tmp_path, pems, [first, second, third])
    slurm = Slurm({first, second})
    choice = NewestTakenKey(KeyDirectory(directory), slurm.probe)
    assert _kid(await choice.key()) == second
    assert slurm.asked == [third, second]


async def test_tokens_follow_the_key_as_soon_as_slurm_takes_it(
    tmp_path: Path, pems: dict[str, bytes]
) -> None:
    """The loop looks at the keys every `key_poll` seconds: a key added to the
    Secret while it waits for the next refresh is tried, and once Slurm takes
    it every token is written with it at once (not at the next refresh)."""
    first, second, _ = sorted(pems)
    directory = _key_dir(tmp_path, pems, [first])
    slurm = Slurm({first})
    kube = FakeKube()
    grant = TokenGrant("t", "sunk-syncer")
    choice = NewestTakenKey(KeyDirectory(directory), slurm.probe)
    minting = asyncio.create_task(
        run_tokens(kube, "ns", [grant], choice, lifetime=3600, refresh=1000, key_poll=0.01)  # type: ignore[arg-type]
    )
    try:
        await _until(lambda: _secret_kid(kube) == first)
        _key_dir(tmp_path, pems, [first, second])  # step 1
        await _until(lambda: second in slurm.asked)
        assert _secret_kid(kube) == first  # not taken yet: the key in use goes on
        slurm.kids = {first, second}  # step 2
        await _until(lambda: _secret_kid(kube) == second)
        token = base64.b64decode((kube.secrets["t"].data or {})[TOKEN_KEY]).decode()
        decoded = jwt.decode(token, _public(pems[second]), algorithms=["RS256"])
        assert decoded["sun"] == "sunk-syncer"
    finally:
        minting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await minting


def _kid(key: Key) -> str:
    assert isinstance(key, SigningKey)
    return key.kid


def _secret_kid(kube: FakeKube) -> str | None:
    if "t" not in kube.secrets:
        return None
    token = base64.b64decode((kube.secrets["t"].data or {})[TOKEN_KEY]).decode()
    kid: str = jwt.get_unverified_header(token)["kid"]
    return kid
