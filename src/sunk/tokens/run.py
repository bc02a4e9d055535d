"""`sunk tokens`: mints each component's Slurm token into a Secret of its own.

The operator, the syncer and the scheduler read what pods and users write, so
they should not hold a signing key (with one, any token for any Slurm user,
root included, can be made). This component holds the keys instead and parses
nothing anyone else writes: every `refresh` seconds it mints a token for each
grant's Slurm user, valid for `lifetime` seconds, into the grant's Secret
(key `token`). Each component mounts only its own Secret (a kubelet brings a
changed Secret to the pod within about a minute) and reads it with
`FileToken`. A component's leaked token is good for an hour at most and names
one user.

The scheduler acts in Slurm as each pod's tenant, not as a user who may act
for others: for every uid the tenancy grants (the admin's ConfigMap, watched),
a token lives in one more Secret, keyed by uid, which the scheduler mounts. A
newly granted uid gets its token at once; a revoked one loses it at the next
write, and what was minted expires within `lifetime`. A token for a reserved id
(a daemon's, an admin's, nobody's: the tenancy's `reserved`) or one below
1000 is never minted for a tenant, whatever the tenancy says; nor one for
root by `--grant`. No token lives longer than a day (MAX_TOKEN_LIFETIME).

With RS256 keys (`KeyDirectory`: several may be there while one is rotated)
it signs with the newest key Slurm takes (`NewestTakenKey`): a key added to
the Secret is used only once slurmctld accepts a token of it, so a key that
has not reached slurmctld's JWKS yet never reaches the components.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Secret, ServiceAccount
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from sunk.kube.client import kube_client
from sunk.kube.retry import until_answered
from sunk.scheduler.tenancy import MIN_ID, RESERVED, IdSet
from sunk.scheduler.tenancy_watch import TenancyWatch
from sunk.slurm.auth import (
    MAX_TOKEN_LIFETIME,
    FileKey,
    Key,
    KeyDirectory,
    KeySource,
    SigningKey,
    StaticToken,
    mint,
)
from sunk.slurm.client import RetryPolicy, SlurmClient
from sunk.slurm.errors import SlurmAuthError, SlurmError

log = logging.getLogger(__name__)

TOKEN_KEY = "token"  # noqa: S105 - the Secret's key name, not a secret
LABELS = {"app.kubernetes.io/name": "sunk", "app.kubernetes.io/component": "tokens"}


@dataclass(frozen=True)
class TokenGrant:
    """A Secret that holds tokens for one Slurm user."""

    secret: str
    user: str

    @classmethod
    def parse(cls, text: str) -> TokenGrant:
        """`<secret>=<slurm user>`, as the command line gives it."""
        secret, sep, user = text.partition("=")
        if not sep or not secret or not user:
            raise ValueError(f"--grant {text!r}: expected <secret>=<slurm user>")
        if user in ("root", "0"):
            raise ValueError(f"--grant {text!r}: no component acts as root")
        return cls(secret, user)


def tenant_uids(uids: Sequence[int], reserved: IdSet = RESERVED) -> list[int]:
    """The uids that get a tenant token: never one below 1000 or reserved (the
    tenancy refuses a grant of them; this holds even if one slipped through)."""
    refused = [uid for uid in uids if uid < MIN_ID or uid in reserved or uid in RESERVED]
    if refused:
        log.error("no token for uids %s: below %d or reserved (%s)", refused, MIN_ID, reserved)
    return [uid for uid in uids if uid not in refused]


def token_secret(
    name: str, namespace: str, tokens: Mapping[str, str], owner: OwnerReference | None = None
) -> Secret:
    """A Secret of tokens by key (`token`, or a tenant's uid)."""
    return Secret(
        metadata=ObjectMeta(
            name=name,
            namespace=namespace,
            labels=dict(LABELS),
            ownerReferences=[owner] if owner else None,
        ),
        type="Opaque",
        data={key: base64.b64encode(value.encode()).decode() for key, value in tokens.items()},
    )


async def owner_of_tokens(
    kube: AsyncClient, namespace: str, service_account: str
) -> OwnerReference:
    """The ServiceAccount of `sunk tokens` as the Secrets' owner: the chart's
    uninstall deletes it, and Kubernetes' garbage collector the Secrets with it
    (helm does not know them)."""
    account = await kube.get(ServiceAccount, service_account, namespace=namespace)
    assert account.metadata is not None
    return OwnerReference(
        apiVersion="v1", kind="ServiceAccount", name=service_account, uid=account.metadata.uid or ""
    )


# Whether Slurm takes tokens of a key: True, False, or None (it could not be asked).
Probe = Callable[[SigningKey], Awaitable[bool | None]]


class NewestTakenKey:
    """The RS256 key to sign with: the newest one Slurm takes.

    Keys newer than the one in use are tried (a short token of each, shown to
    slurmctld) at every call, newest first; one Slurm refuses, or cannot be
    asked about, is tried again at the next call (`pending` says one waits).
    With nothing newer, a call reads the keys and asks Slurm nothing.
    At the first call, when Slurm cannot be asked, the oldest key is taken: a
    new key may not be in the JWKS yet, the oldest is (the rotation steps
    remove a key only once its successor is in use)."""

    def __init__(self, keys: KeyDirectory, probe: Probe) -> None:
        self._keys = keys
        self._probe = probe
        self.current: SigningKey | None = None
        self.pending = False

    async def key(self) -> Key:
        keys = await self._keys.keys()
        if not keys:
            raise FileNotFoundError(f"no <kid>.pem key in {self._keys.path}")
        current = next((k for k in keys if self.current and k.kid == self.current.kid), None)
        newer = [k for k in reversed(keys) if current is None or k.kid > current.kid]
        chosen = current
        self.pending = False
        for candidate in newer:
            taken = await self._probe(candidate)
            if taken:
                chosen = candidate
                break
            self.pending = True
            if taken is None:
                log.info("key %s: Slurm did not answer; asking again later", candidate.kid)
                if chosen is None:
                    chosen = keys[0]
                break
            log.info("key %s: not taken by Slurm yet (not in its JWKS)", candidate.kid)
        if chosen is None:
            log.error("Slurm takes no key of %s: signing with the newest", self._keys.path)
            chosen = keys[-1]
        if self.current is None or chosen.kid != self.current.kid:
            log.info("signing with key %s", chosen.kid)
        self.current = chosen
        return chosen


def slurm_probe(restapi_url: str, user: str) -> Probe:
    """Asks slurmrestd whether slurmctld takes a token of a key: a token for
    `user` living a minute, one read of Slurm's statistics."""

    async def probe(key: SigningKey) -> bool | None:
        token = mint(key, user, 60, time.time())
        client = SlurmClient(
            restapi_url, StaticToken(user, token.value), retry=RetryPolicy(attempts=1), timeout=10
        )
        try:
            async with client:
                await client.diag()
        except SlurmAuthError:
            return False
        except SlurmError as error:
            log.warning("asking Slurm whether it takes key %s: %s", key.kid, error)
            return None
        return True

    return probe


async def write_token(
    kube: AsyncClient,
    namespace: str,
    grant: TokenGrant,
    key: Key,
    lifetime: float,
    owner: OwnerReference | None = None,
) -> None:
    """One fresh token into the grant's Secret, created if missing."""
    token = mint(key, grant.user, lifetime, time.time())
    await _put(kube, token_secret(grant.secret, namespace, {TOKEN_KEY: token.value}, owner))


async def write_tenant_tokens(
    kube: AsyncClient,
    namespace: str,
    secret: str,
    uids: Sequence[int],
    key: Key,
    lifetime: float,
    owner: OwnerReference | None = None,
) -> None:
    """A fresh token for each granted uid (named by the uid: slurmctld looks the
    number up) into one Secret, keyed by uid; a uid no longer granted is gone,
    and a reserved one or one below 1000 never gets one."""
    now = time.time()
    tokens = {str(uid): mint(key, str(uid), lifetime, now).value for uid in tenant_uids(uids)}
    await _put(kube, token_secret(secret, namespace, tokens, owner))


async def _put(kube: AsyncClient, secret: Secret) -> None:
    """Replace whatever is there (nothing else writes these Secrets), or create."""
    try:
        await kube.replace(secret)
    except ApiError as error:
        if error.status.code != 404:
            raise
        await kube.create(secret)


@dataclass(frozen=True)
class TenantTokens:
    """Where the tenants' tokens go, and the tenancy that grants their uids."""

    secret: str
    tenancy: TenancyWatch


class TokenMetrics:
    """What `sunk tokens` exports: when every Secret was last written, so an
    alert can say the components' tokens are ageing towards expiry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.written = Gauge(
            "sunk_tokens_written_timestamp_seconds",
            "When a fresh token was last written into every Secret (Unix time).",
            registry=self.registry,
        )
        self.writes = Counter(
            "sunk_tokens_writes",
            "Rounds in which every Secret got a fresh token.",
            registry=self.registry,
        )
        self.tenant_uids = Gauge(
            "sunk_tokens_tenant_uids",
            "Granted tenant uids with a token in the last round.",
            registry=self.registry,
        )


# Seconds between looks at the keys: a key added to the Secret, or one Slurm
# did not take yet, is tried this often.
KEY_POLL = 10.0


async def run_tokens(
    kube: AsyncClient,
    namespace: str,
    grants: Sequence[TokenGrant],
    keys: KeySource,
    *,
    lifetime: float = 3600.0,
    refresh: float = 600.0,
    owner: OwnerReference | None = None,
    tenants: TenantTokens | None = None,
    key_poll: float = KEY_POLL,
    metrics: TokenMetrics | None = None,
) -> None:
    """Every `refresh` seconds, at once when the tenancy changes, and at once
    when the key to sign with changes, a fresh token in every grant's Secret
    and for every granted uid; forever. The key is looked up every `key_poll`
    seconds (a kubelet may bring a new one at any time)."""
    if refresh * 2 >= lifetime:
        raise ValueError("refresh must be under half the lifetime: tokens must outlive delays")
    if lifetime > MAX_TOKEN_LIFETIME:
        raise ValueError(f"lifetime: a token lives at most {MAX_TOKEN_LIFETIME}s")
    changed = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        if tenants is not None:
            tenants.tenancy.on_change = changed.set
            group.create_task(tenants.tenancy.run())
            await tenants.tenancy.ready.wait()
        written_with: Key | None = None
        due = 0.0
        while True:
            write = changed.is_set()
            changed.clear()
            key = await keys.key()
            if write or key != written_with or time.monotonic() >= due:
                uids = await _write_all(kube, namespace, grants, key, lifetime, owner, tenants)
                written_with, due = key, time.monotonic() + refresh
                if metrics is not None:
                    metrics.written.set_to_current_time()
                    metrics.writes.inc()
                    metrics.tenant_uids.set(uids)
            wait = min(due - time.monotonic(), key_poll)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), max(0.0, wait))


async def _write_all(
    kube: AsyncClient,
    namespace: str,
    grants: Sequence[TokenGrant],
    key: Key,
    lifetime: float,
    owner: OwnerReference | None,
    tenants: TenantTokens | None,
) -> int:
    """Write every Secret; the number of tenant uids given a token."""
    for grant in grants:
        await until_answered(
            f"writing Secret {namespace}/{grant.secret}",
            functools.partial(write_token, kube, namespace, grant, key, lifetime, owner),
        )
    uids: list[int] = []
    if tenants is not None:
        tenancy = tenants.tenancy.current()
        uids = tenant_uids(tenancy.uids(), tenancy.reserved_ids())
        await until_answered(
            f"writing Secret {namespace}/{tenants.secret}",
            functools.partial(
                write_tenant_tokens, kube, namespace, tenants.secret, uids, key, lifetime, owner
            ),
        )
    log.info("tokens for %d grants and %d tenant uids written", len(grants), len(uids))
    return len(uids)


async def main(
    key_file: Path | None,
    namespace: str,
    grants: Sequence[TokenGrant],
    kubeconfig: Path | None,
    lifetime: float,
    refresh: float,
    owner_service_account: str | None,
    tenant_secret: str | None = None,
    tenancy_configmap: str | None = None,
    signing_keys: Path | None = None,
    restapi_url: str | None = None,
    metrics_port: int | None = None,
) -> None:
    metrics = TokenMetrics()
    if metrics_port is not None:
        start_http_server(metrics_port, registry=metrics.registry)
    kube = kube_client(kubeconfig, "sunk-tokens")
    try:
        owner = None
        if owner_service_account:
            account = owner_service_account
            owner = await until_answered(
                f"reading ServiceAccount {namespace}/{account}",
                lambda: owner_of_tokens(kube, namespace, account),
            )
        keys = key_source(key_file, signing_keys, restapi_url, grants)
        tenants = None
        if tenant_secret and tenancy_configmap:
            # The scheduler reports an invalid edit; here it is only logged.
            watch = TenancyWatch(kube, namespace, tenancy_configmap, report_invalid=False)
            tenants = TenantTokens(tenant_secret, watch)
        await run_tokens(
            kube,
            namespace,
            grants,
            keys,
            lifetime=lifetime,
            refresh=refresh,
            owner=owner,
            tenants=tenants,
            metrics=metrics,
        )
    finally:
        await kube.close()


def key_source(
    key_file: Path | None,
    signing_keys: Path | None,
    restapi_url: str | None,
    grants: Sequence[TokenGrant],
) -> KeySource:
    """The HS256 key of a file, or the RS256 keys of a directory: with
    slurmrestd's URL, the newest Slurm takes (a grant's user asks); without,
    the newest."""
    if (key_file is None) == (signing_keys is None):
        raise ValueError("give either the HS256 key file or the RS256 keys' directory")
    if key_file is not None:
        return FileKey(key_file)
    assert signing_keys is not None
    directory = KeyDirectory(signing_keys)
    if restapi_url and grants:
        return NewestTakenKey(directory, slurm_probe(restapi_url, grants[0].user))
    return NewestTakenKey(directory, _always_taken)


async def _always_taken(key: SigningKey) -> bool:
    return True
