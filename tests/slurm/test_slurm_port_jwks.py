"""RS256 tokens against real slurmctld, on 24.11 (Debian trixie) and 26.05
(Debian sid): what the rotation of sunk's signing key rests on
(docs/charts.md, "Rotating the JWT key").

slurmctld verifies an RS256 token with the public key its JWKS
(`AuthAltParameters=jwks=`) lists under the token's `kid`, and HS256 tokens
with `jwt_key` as before. The JWKS is the chart's (charts/slurm/files/jwks.py
makes it from the keys). `scontrol reconfigure` loads a changed JWKS, and
tokens of a key listed before and after keep working through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from plugins.chart_files import chart_module
from plugins.slurm import external_restd
from sunk.slurm import FileKey, JwtMinter, SlurmAuthError, SlurmClient, SlurmError, StaticToken
from sunk.slurm.auth import SigningKey, mint
from sunk.tokens.run import slurm_probe
from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import SlurmAccess, SlurmCluster, ensure_rootfs

pytestmark = pytest.mark.contract

KIDS = ("20260101T000000Z", "20260201T000000Z", "20260301T000000Z")


@pytest.fixture(scope="module")
def keys() -> dict[str, SigningKey]:
    pems = {
        kid: rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,  # as the keys hook's ssh-keygen
            serialization.NoEncryption(),
        )
        for kid in KIDS
    }
    return {kid: SigningKey.from_pem(kid, pem) for kid, pem in pems.items()}


def jwks_text(keys: dict[str, SigningKey], kids: list[str]) -> str:
    return json.dumps(chart_module("jwks").jwks({kid: keys[kid].pem for kid in kids}))


@dataclass
class JwksBed:
    cluster: SlurmCluster
    access: SlurmAccess
    listed: list[str] = field(default_factory=list)

    def write_jwks(self, keys: dict[str, SigningKey], kids: list[str]) -> None:
        """A new JWKS in place (as a kubelet updates a mounted Secret)."""
        path = self.cluster.etc / "jwks.json"
        staged = path.with_suffix(".new")
        staged.write_text(jwks_text(keys, kids))
        staged.chmod(0o644)
        staged.rename(path)
        self.listed = kids


@pytest.fixture(scope="module", params=["trixie", "sid"])
def bed(
    request: pytest.FixtureRequest, keys: dict[str, SigningKey], testbed_external: bool
) -> Iterator[JwksBed]:
    """A one-node bed of its own per release (its slurm.conf names a JWKS)."""
    if testbed_external or external_restd() is not None:
        pytest.skip("needs a Slurm bed of its own (its slurm.conf names a JWKS)")
    try:
        rootfs = ensure_rootfs(request.param)
    except RuntimeError as exc:  # no mirror, no debootstrap: say so, do not fail
        pytest.skip(f"Debian {request.param}'s Slurm is not available: {exc}")
    state = Path(tempfile.mkdtemp(prefix="sunk-jw-", dir="/tmp"))
    first = list(KIDS[:2])
    cluster = SlurmCluster(
        state,
        Supervisor(state),
        rootfs,
        nodes=1,
        # Slurm takes the last AuthAltParameters: the bed's key, and the JWKS,
        # as the chart's slurm.conf names them.
        extra_conf=["AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key,jwks=/etc/slurm/jwks.json"],
        etc_files={"jwks.json": jwks_text(keys, first)},
    )
    try:
        yield JwksBed(cluster, cluster.start(), first)
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


async def takes(bed: JwksBed, key: SigningKey) -> bool:
    """Whether slurmctld takes a token of `key` (a read through slurmrestd)."""
    token = mint(key, "root", 600, time.time())
    async with SlurmClient(bed.access.restd_url, StaticToken("root", token.value)) as client:
        try:
            await client.diag()
        except SlurmAuthError:
            return False
    return True


async def test_tokens_of_every_listed_key_are_taken_and_others_refused(
    bed: JwksBed, keys: dict[str, SigningKey]
) -> None:
    first, second, third = KIDS
    assert await takes(bed, keys[first])
    assert await takes(bed, keys[second])
    assert not await takes(bed, keys[third])
    # A token naming a listed kid but signed by another key is refused too.
    forged = mint(SigningKey(first, keys[third].pem, keys[third].private), "root", 600, time.time())
    async with SlurmClient(bed.access.restd_url, StaticToken("root", forged.value)) as client:
        with pytest.raises(SlurmAuthError):
            await client.diag()
    # HS256 (users' `scontrol token`, jwt_key) works beside the JWKS.
    async with SlurmClient(
        bed.access.restd_url, JwtMinter(FileKey(bed.access.jwt_key), "root")
    ) as c:
        assert (await c.diag()).server_thread_count >= 1
    token = bed.cluster.token("root", 600)
    async with SlurmClient(bed.access.restd_url, StaticToken("root", token)) as client:
        await client.diag()


async def test_a_reconfigure_loads_a_changed_jwks_and_a_kept_keys_tokens_work_throughout(
    bed: JwksBed, keys: dict[str, SigningKey]
) -> None:
    """The rotation's middle steps on slurmctld alone: the JWKS gains the new
    key and loses the oldest, `scontrol reconfigure` (what the chart's sidecar
    runs when the mounted JWKS changes). A client with a token of the key kept
    (the one sunk tokens signs with) reads Slurm all along: no call refused or
    failed. The new key's tokens are taken after, the removed key's refused."""
    first, second, third = KIDS
    assert bed.listed == [first, second]
    kept = mint(keys[second], "root", 600, time.time())
    calls, failures = 0, []
    stop = asyncio.Event()

    async def poll() -> None:
        nonlocal calls
        async with SlurmClient(bed.access.restd_url, StaticToken("root", kept.value)) as client:
            while not stop.is_set():
                try:
                    await client.nodes()
                except SlurmError as error:
                    failures.append(f"{time.monotonic():.1f}: {error}")
                calls += 1
                await asyncio.sleep(0.05)

    poller = asyncio.create_task(poll())
    try:
        await asyncio.sleep(1)
        bed.write_jwks(keys, [second, third])
        started = time.monotonic()
        await asyncio.to_thread(bed.cluster.run, ["scontrol", "reconfigure"])
        while not await takes(bed, keys[third]):
            assert time.monotonic() - started < 60, "the new key is not taken after reconfigure"
            await asyncio.sleep(0.5)
        print(f"new key taken {time.monotonic() - started:.1f}s after the reconfigure")
        assert not await takes(bed, keys[first])
        await asyncio.sleep(2)  # slurmctld settled: calls go on
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
    print(f"{calls} reads with the kept key's token during the reconfigure, {len(failures)} failed")
    assert failures == []
    assert calls > 20


async def test_sunk_tokens_asks_slurmrestd_whether_slurm_takes_a_key(
    bed: JwksBed, keys: dict[str, SigningKey]
) -> None:
    """`sunk tokens`' probe on the real thing: yes for a listed key, no for
    another, no answer (None) where slurmrestd is not."""
    probe = slurm_probe(bed.access.restd_url, "root")
    listed = [kid for kid in KIDS if kid in bed.listed]
    other = next(kid for kid in KIDS if kid not in bed.listed)
    assert await probe(keys[listed[-1]]) is True
    assert await probe(keys[other]) is False
    assert await slurm_probe("http://127.0.0.1:9", "root")(keys[listed[-1]]) is None
