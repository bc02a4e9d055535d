"""The async REST client for slurmrestd: the one way sunk talks to Slurm.

- Version: reads `/openapi/v3` once, speaks the newest data_parser both sides
  know (dialect.py holds every per-version difference).
- Errors: every failure becomes a typed exception with Slurm's own error
  number and message (errors.py), including failures hidden in 200 replies.
- Retries: idempotent requests are retried with jittered exponential back-off
  on connection errors and transient 5xx (slurmctld unreachable, proxy
  errors), never on 4xx or on Slurm's definitive answers. Non-idempotent ones
  (submit, signal, reconfigure) are retried only when the failure proves the
  request never reached slurmctld.
- Auth: a token from `Credentials`, renewed before expiry; a rejected token
  (401/511) is renewed once and the request repeated.
- One connection pool; at most `max_concurrency` requests in flight.

One module over 500 lines on purpose: the transport, the error mapping and
one short method per endpoint share the same private helpers, and a caller
(or a reader) finds every REST call sunk makes in one place.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx2
from pydantic import BaseModel, ConfigDict, ValidationError

from sunk.http_transport import http_transport
from sunk.slurm.auth import Credentials
from sunk.slurm.dialect import (
    SUPPORTED_VERSIONS,
    Dialect,
    choose_version,
    offered_endpoints,
    version_key,
)
from sunk.slurm.errors import (
    ESLURM_ALREADY_DONE,
    ESLURM_INVALID_JOB_ID,
    ESLURM_INVALID_NODE_NAME,
    ESLURM_RESERVATION_INVALID,
    SLURM_PROTOCOL_AUTHENTICATION_ERROR,
    SlurmApiError,
    SlurmAuthError,
    SlurmError,
    SlurmNotFoundError,
    SlurmProblem,
    SlurmUnavailableError,
    SlurmUnsupportedError,
)
from sunk.slurm.hostlist import compress
from sunk.slurm.models import (
    ControllerPing,
    Diag,
    Job,
    JobSpec,
    JobUpdate,
    Node,
    NodeLayout,
    NodeUpdate,
    Partition,
    Reservation,
    ReservationSpec,
    ServerInfo,
    SubmitResult,
    Timestamp,
)

log = logging.getLogger("sunk.slurm")

# Full reads of thousands of nodes take ~1 s; a dead host should fail fast.
DEFAULT_TIMEOUT = httpx2.Timeout(30.0, connect=3.0)

T = TypeVar("T")

# Errors that prove slurmctld never saw the request: safe to resend anything.
_NOT_SENT_ERRNOS = frozenset([1001, 1800])  # (slurmctld) connection failure

# Transport failures before a byte of the request went out.
_NOT_SENT_EXCEPTIONS: tuple[type[Exception], ...] = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.PoolTimeout,
)
# Everything else the transport can raise mid-request.
_MAYBE_SENT_EXCEPTIONS: tuple[type[Exception], ...] = (httpx2.TransportError,)

WarningHook = Callable[[str, str, SlurmProblem], None]


def _log_warning(method: str, path: str, problem: SlurmProblem) -> None:
    log.warning("slurmrestd warning on %s %s: %s", method, path, problem.description)


@dataclass
class ClientStats:
    """Counters for benchmarks and metrics (bytes are status line + headers + body)."""

    requests: int = 0
    not_modified: int = 0
    retries: int = 0
    failures: int = 0
    warnings: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass(frozen=True)
class Listing(Generic[T]):
    """A full list of nodes or jobs and the server's `last_update` for the next poll."""

    items: tuple[T, ...]
    last_update: int  # pass back as `since` for an incremental read


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4  # first try included
    base_delay: float = 0.1
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        """Exponential back-off with jitter, so many clients do not retry in step."""
        ceiling = min(self.max_delay, self.base_delay * (2.0**attempt))
        return ceiling * (0.5 + random.random() / 2)  # noqa: S311 - jitter, not crypto


# -- reply envelopes (parsed straight from bytes: the node list is big) --------


class _WireProblem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    description: str = ""
    error_number: int = 0
    error: str = ""
    source: str = ""

    def problem(self) -> SlurmProblem:
        return SlurmProblem(self.error_number, self.error, self.description, self.source)


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    errors: list[_WireProblem] = []
    warnings: list[_WireProblem] = []


class _NodesReply(_Reply):
    nodes: list[Node] = []
    last_update: Timestamp = None


class _JobsReply(_Reply):
    jobs: list[Job] = []
    last_update: Timestamp = None


class _KillStatusError(BaseModel):
    model_config = ConfigDict(extra="ignore")
    code: int = 0
    string: str = ""
    message: str = ""


class _KillStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")
    error: _KillStatusError = _KillStatusError()
    step_id: str = ""


class _KillReply(_Reply):
    status: list[_KillStatus] | None = None  # absent before v0.0.42


_R = TypeVar("_R", bound=_Reply)


class _PingReply(_Reply):
    pings: list[ControllerPing] = []


class _DiagReply(_Reply):
    statistics: Diag = Diag()


class _SubmitReply(_Reply):
    job_id: int | None = None
    step_id: str = ""
    job_submit_user_msg: str = ""


class _PartitionsReply(_Reply):
    partitions: list[dict[str, Any]] = []


class _JobStateRow(BaseModel):
    model_config = ConfigDict(extra="ignore")
    job_id: str | int  # "12"; an array's or het job's row may read "12_3" or "12+1"
    state: tuple[str, ...] = ()


class _JobStatesReply(_Reply):
    jobs: list[_JobStateRow] = []


class _LayoutReply(_Reply):
    nodes: list[NodeLayout] = []


class _ReservationsReply(_Reply):
    reservations: list[Reservation] = []


def _release(info: Mapping[str, Any]) -> str:
    """The Slurm release from the document's info ("Slurm-24.11.5&openapi/slurmctld")."""
    release = (info.get("x-slurm") or {}).get("release")
    if release:
        return str(release)
    match = re.match(r"Slurm-([\w.-]+?)(&|$)", str(info.get("version", "")))
    return match.group(1) if match else ""


def _header_bytes(headers: httpx2.Headers) -> int:
    return sum(len(k) + len(v) + 4 for k, v in headers.raw)


class SlurmClient:
    """Async client for one slurmrestd. Use as `async with SlurmClient(...) as slurm:`."""

    def __init__(
        self,
        base_url: str,
        credentials: Credentials,
        *,
        api_version: str | None = None,
        supported_versions: tuple[str, ...] = SUPPORTED_VERSIONS,
        timeout: httpx2.Timeout | float = DEFAULT_TIMEOUT,
        max_concurrency: int = 8,
        retry: RetryPolicy = RetryPolicy(),
        on_warning: WarningHook = _log_warning,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        self._pinned = api_version
        self._supported = supported_versions
        self.retry = retry
        self._on_warning = on_warning
        self._semaphore = asyncio.Semaphore(max_concurrency)
        limits = httpx2.Limits(
            max_connections=max_concurrency, max_keepalive_connections=max_concurrency
        )
        self._http = httpx2.AsyncClient(
            base_url=self.base_url,
            timeout=timeout,
            limits=limits,
            transport=transport or http_transport(limits=limits, trust_env=True),
        )
        self._dialect: Dialect | None = None
        self._info: ServerInfo | None = None
        self._negotiating = asyncio.Lock()
        self.stats = ClientStats()

    def __repr__(self) -> str:
        return f"SlurmClient({self.base_url!r}, user={self.credentials.user!r})"

    def acting_as(self, credentials: Credentials) -> SlurmClient:
        """This client's connections, limits and negotiated version with another
        user's credentials (the scheduler acting as a tenant). The copy shares
        this client's connections: close this one, not the copy."""
        other = copy.copy(self)
        other.credentials = credentials
        return other

    async def __aenter__(self) -> SlurmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- version negotiation ---------------------------------------------------

    async def negotiate(self, *, force: bool = False) -> ServerInfo:
        """Pick the API version (once; `force` re-reads, e.g. after an upgrade)."""
        async with self._negotiating:
            if self._info is not None and not force:
                return self._info
            reply = await self._send("GET", "/openapi/v3", idempotent=True)
            self._raise_for(reply, "GET", "/openapi/v3")
            document = reply.json()
            offered = offered_endpoints(document)
            if self._pinned is not None:
                if self._pinned not in offered:
                    raise SlurmUnsupportedError(
                        f"{self._pinned} is not offered (server has {sorted(offered)})"
                    )
                version = self._pinned
            else:
                version = choose_version(offered, self._supported)
            dialect = Dialect(version, offered[version])
            self._dialect = dialect
            self._info = ServerInfo(
                release=_release(document.get("info") or {}),
                api_version=version,
                offered=tuple(sorted(offered, key=version_key)),
            )
            return self._info

    async def dialect(self) -> Dialect:
        if self._dialect is None:
            await self.negotiate()
        assert self._dialect is not None
        return self._dialect

    # -- transport ---------------------------------------------------------------

    async def _headers(self) -> dict[str, str]:
        token = await self.credentials.token()
        headers = {"X-SLURM-USER-NAME": token.user}
        if token.value:  # an empty header is not "no token" to slurmrestd: it is a bad one
            headers["X-SLURM-USER-TOKEN"] = token.value
        return headers

    async def _send(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        read_timeout: float | None = None,
    ) -> httpx2.Response:
        """One request with auth, retries and the concurrency bound; no error mapping."""
        auth_renewed = False
        attempt = 0
        while True:
            headers = await self._headers()
            request = self._http.build_request(
                method,
                path,
                params=params,
                json=json,
                headers=headers,
                timeout=read_timeout if read_timeout is not None else httpx2.USE_CLIENT_DEFAULT,
            )
            failure: SlurmError
            try:
                async with self._semaphore:
                    reply = await self._http.send(request)
            except _NOT_SENT_EXCEPTIONS as exc:
                failure = SlurmUnavailableError(
                    method, path, f"{type(exc).__name__}: {exc}", maybe_applied=False
                )
            except _MAYBE_SENT_EXCEPTIONS as exc:
                failure = SlurmUnavailableError(
                    method, path, f"{type(exc).__name__}: {exc}", maybe_applied=True
                )
                if not idempotent:
                    self.stats.failures += 1
                    raise failure from exc
            else:
                self._count(request, reply)
                if reply.status_code in (401, 511) and not auth_renewed:
                    # Expired or rotated key: renew once; a second refusal is real.
                    auth_renewed = True
                    self.credentials.invalidate()
                    continue
                retryable = self._retryable(reply, idempotent)
                if retryable is None:
                    return reply
                failure = retryable
            attempt += 1
            if attempt >= self.retry.attempts:
                self.stats.failures += 1
                raise failure
            self.stats.retries += 1
            await asyncio.sleep(self.retry.delay(attempt - 1))

    def _retryable(self, reply: httpx2.Response, idempotent: bool) -> SlurmError | None:
        """The error to retry on, or None to hand the reply back as it is."""
        if reply.status_code < 500 or reply.status_code == 511:
            return None
        error = self._api_error(reply, reply.request.method, reply.request.url.path)
        if not error.transient:
            return None
        if idempotent or any(p.errno in _NOT_SENT_ERRNOS for p in error.problems):
            return error
        return None

    def _count(self, request: httpx2.Request, reply: httpx2.Response) -> None:
        stats = self.stats
        stats.requests += 1
        stats.bytes_sent += (
            (len(request.method) + len(str(request.url.raw_path)) + 11)
            + _header_bytes(request.headers)
            + len(request.content)
        )
        stats.bytes_received += 17 + _header_bytes(reply.headers) + len(reply.content)
        if reply.status_code == 304:
            stats.not_modified += 1

    # -- error mapping ----------------------------------------------------------

    def _api_error(
        self,
        reply: httpx2.Response,
        method: str,
        path: str,
        not_found: frozenset[int] = frozenset(),
    ) -> SlurmApiError:
        problems = self._problem_list(reply)
        status = reply.status_code
        if status == 401 or any(p.errno == SLURM_PROTOCOL_AUTHENTICATION_ERROR for p in problems):
            return SlurmAuthError(method, path, status, problems)
        if status == 404 or any(p.errno in not_found for p in problems):
            return SlurmNotFoundError(method, path, status, problems)
        if status == 511:
            return SlurmAuthError(method, path, status, problems)
        return SlurmApiError(method, path, status, problems)

    @staticmethod
    def _problem_list(reply: httpx2.Response) -> tuple[SlurmProblem, ...]:
        if not reply.content:
            return ()
        try:
            parsed = _Reply.model_validate_json(reply.content)
        except ValidationError:
            # Plain text from the HTTP layer ("Authentication failure").
            text = reply.text.strip()[:200]
            return (SlurmProblem(0, text, "", ""),) if text else ()
        return tuple(p.problem() for p in parsed.errors)

    def _raise_for(
        self,
        reply: httpx2.Response,
        method: str,
        path: str,
        not_found: frozenset[int] = frozenset(),
    ) -> None:
        if reply.status_code >= 400:
            raise self._api_error(reply, method, path, not_found)

    def _check(
        self,
        parsed: _Reply,
        reply: httpx2.Response,
        method: str,
        path: str,
        not_found: frozenset[int] = frozenset(),
    ) -> None:
        """Errors inside a reply fail the call whatever its HTTP status; warnings are reported."""
        dialect = self._dialect
        for warning in parsed.warnings:
            if dialect is not None and dialect.expected_warning(warning.description):
                continue
            self.stats.warnings += 1
            self._on_warning(method, path, warning.problem())
        if parsed.errors:
            problems = tuple(p.problem() for p in parsed.errors)
            if reply.status_code == 401 or any(
                p.errno == SLURM_PROTOCOL_AUTHENTICATION_ERROR for p in problems
            ):
                raise SlurmAuthError(method, path, reply.status_code, problems)
            if reply.status_code == 404 or any(p.errno in not_found for p in problems):
                raise SlurmNotFoundError(method, path, reply.status_code, problems)
            raise SlurmApiError(method, path, reply.status_code, problems)
        self._raise_for(reply, method, path, not_found)

    async def _call(
        self,
        method: str,
        tail: str,
        model: type[_R],
        *,
        idempotent: bool,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        not_found: frozenset[int] = frozenset(),
        read_timeout: float | None = None,
    ) -> tuple[_R, httpx2.Response]:
        dialect = await self.dialect()
        path = dialect.path(tail)
        reply = await self._send(
            method, path, idempotent=idempotent, params=params, json=json, read_timeout=read_timeout
        )
        if reply.status_code == 304:
            return model(), reply
        try:
            parsed = model.model_validate_json(reply.content)
        except ValidationError as exc:
            if reply.status_code >= 400:
                raise self._api_error(reply, method, path, not_found) from exc
            raise SlurmApiError(
                method,
                path,
                reply.status_code,
                (SlurmProblem(0, "unparsable reply", str(exc)[:300], ""),),
            ) from exc
        self._check(parsed, reply, method, path, not_found)
        return parsed, reply

    def _require(self, dialect: Dialect, method: str, tail: str, what: str) -> None:
        if not dialect.has(method, tail):
            raise SlurmUnsupportedError(
                f"{what} needs {method} /slurm/{dialect.version}/{tail}, which this "
                f"slurmrestd ({self._info.release if self._info else '?'}) does not offer"
            )

    # -- controller -------------------------------------------------------------------

    async def ping(self) -> list[ControllerPing]:
        """Controllers as slurmrestd sees them. A bad token reports DOWN, not an error."""
        parsed, _ = await self._call("GET", "ping/", _PingReply, idempotent=True)
        return parsed.pings

    async def diag(self) -> Diag:
        parsed, _ = await self._call("GET", "diag/", _DiagReply, idempotent=True)
        return parsed.statistics

    async def reconfigure(self) -> None:
        """`scontrol reconfigure`: slurmctld re-reads its files (24.11 restarts in place)."""
        await self._call("GET", "reconfigure/", _Reply, idempotent=False)

    # -- nodes -----------------------------------------------------------------------

    async def nodes(
        self, since: int | None = None, *, read_timeout: float | None = None
    ) -> Listing[Node] | None:
        """All nodes; with `since` (a previous `last_update`), None if nothing changed.

        Slurm's incremental read is all-or-nothing: any change returns every
        node. Versions without it ignore `since`. May raise SlurmApiError for
        24.11's "Unable to query partitions" defect: callers fall back to a
        full read (the view does).
        """
        dialect = await self.dialect()
        params = {"update_time": since} if since and dialect.incremental_reads else None
        parsed, reply = await self._call(
            "GET", "nodes/", _NodesReply, idempotent=True, params=params, read_timeout=read_timeout
        )
        if reply.status_code == 304:
            return None
        return Listing(tuple(parsed.nodes), parsed.last_update or 0)

    async def node(self, name: str) -> Node | None:
        """One node, or None if Slurm has no such node."""
        try:
            parsed, _ = await self._call("GET", f"node/{name}", _NodesReply, idempotent=True)
        except SlurmApiError as exc:
            # Unknown names come back as 200 with one errno-0 "Failure to query node".
            if exc.status in (200, 404) and exc.errno in (0, ESLURM_INVALID_NODE_NAME):
                return None
            raise
        for node in parsed.nodes:
            if node.name == name:
                return node
        return None

    async def update_node(self, name: str, update: NodeUpdate) -> None:
        """Change state/reason/features/comment; needs an admin (root or SlurmUser) token."""
        await self.update_nodes([name], update)

    async def update_nodes(self, names: Sequence[str], update: NodeUpdate) -> None:
        """Make one change to many nodes in one request, as `scontrol update
        nodename=gpu[01-40]` does: slurmctld takes a hostlist where a name goes.

        Slurm applies it node by node and answers with the last failure, so after
        an error some of the nodes may have changed (all before an unknown name,
        all but the refused ones otherwise).
        """
        if not names:
            raise ValueError("no nodes to update")
        dialect = await self.dialect()
        # slurmrestd takes only unreserved characters in a path, and decodes
        # %XX: the hostlist's brackets and commas go encoded.
        await self._call(
            "POST",
            f"node/{quote(compress(names), safe='')}",
            _Reply,
            idempotent=True,
            json=dialect.node_update_body(update),
            not_found=frozenset([ESLURM_INVALID_NODE_NAME]),
        )

    async def drain(self, name: str, reason: str) -> None:
        await self.update_node(name, NodeUpdate(state="DRAIN", reason=reason))

    async def resume(self, name: str) -> None:
        """Undrain / return to service. Slurm refuses (2028) if the node is neither."""
        await self.update_node(name, NodeUpdate(state="RESUME"))

    async def delete_node(self, name: str) -> None:
        """Remove a dynamic node; static ones are refused with 2028."""
        await self._call(
            "DELETE",
            f"node/{name}",
            _Reply,
            idempotent=True,
            not_found=frozenset([ESLURM_INVALID_NODE_NAME]),
        )

    # -- jobs ------------------------------------------------------------------------

    async def jobs(
        self, since: int | None = None, *, read_timeout: float | None = None
    ) -> Listing[Job] | None:
        """All jobs slurmctld still knows; with `since`, None if nothing changed."""
        dialect = await self.dialect()
        params = {"update_time": since} if since and dialect.incremental_reads else None
        parsed, reply = await self._call(
            "GET", "jobs/", _JobsReply, idempotent=True, params=params, read_timeout=read_timeout
        )
        if reply.status_code == 304 or (
            params and dialect.jobs_unchanged(len(parsed.jobs), parsed.last_update)
        ):
            return None
        return Listing(tuple(parsed.jobs), parsed.last_update or 0)

    async def job_states(
        self, *, read_timeout: float | None = None
    ) -> dict[int, tuple[str, ...]] | None:
        """Every job's state by id (`GET /jobs/state/`, 24.11+): about 80 bytes
        a job, where the full list (`jobs`) renders a few kilobytes each (7 ms
        against 0.5 s of slurmrestd's CPU for 1,000 jobs, measured on 26.05).
        None when a row names an array task or a het job component ("12_3",
        "12+1"): those map to no single job id here, so the caller reads the list.
        """
        parsed, _ = await self._call(
            "GET", "jobs/state/", _JobStatesReply, idempotent=True, read_timeout=read_timeout
        )
        states: dict[int, tuple[str, ...]] = {}
        for row in parsed.jobs:
            if not str(row.job_id).isdigit():
                return None
            states[int(row.job_id)] = row.state
        return states

    async def job(self, job_id: int) -> Job | None:
        """One job, or None once slurmctld has forgotten it (MinJobAge) or never had it."""
        try:
            parsed, _ = await self._call(
                "GET",
                f"job/{job_id}",
                _JobsReply,
                idempotent=True,
                not_found=frozenset([ESLURM_INVALID_JOB_ID]),
            )
        except SlurmNotFoundError:
            return None
        for job in parsed.jobs:
            if job.job_id == job_id:
                return job
        return None

    async def job_layout(self, job_id: int) -> list[NodeLayout] | None:
        """What a running job holds on each node: memory, cores, and each GRES
        with its device indices (`scontrol show job -d`'s `GRES=gpu:2(IDX:0-1)`).
        None if slurmctld does not know the job (or it holds nothing now).

        Needs v0.0.44+ (Slurm 25.11+); raises SlurmUnsupportedError before.
        """
        dialect = await self.dialect()
        self._require(dialect, "GET", "resources/{job_id}", "reading a job's resources")
        try:
            parsed, _ = await self._call(
                "GET",
                f"resources/{job_id}",
                _LayoutReply,
                idempotent=True,
                not_found=frozenset([ESLURM_INVALID_JOB_ID]),
            )
        except SlurmNotFoundError:
            return None
        return parsed.nodes or None

    async def submit(self, spec: JobSpec) -> SubmitResult:
        """Submit a batch job; Slurm's refusal raises SlurmApiError with its reason.

        Never resent once it may have reached slurmctld: a `SlurmUnavailableError`
        with `maybe_applied` means the caller must look (e.g. by comment or name)
        before submitting again.
        """
        if spec.script is None:
            raise ValueError("a batch job needs a script")
        return await self._create_job("job/submit", spec)

    async def allocate(self, spec: JobSpec) -> SubmitResult:
        """Ask for an allocation that starts now (a job without a batch script,
        as `salloc --immediate`); Slurm's refusal raises SlurmApiError, e.g.
        "Requested nodes are busy" (2016) when it cannot start at once.

        Unlike a batch job, which waits for slurmctld's next scheduling pass (up
        to a second even with `batch_sched_delay=0`), an allocation is placed
        within the request. It must be `immediate`: slurmrestd holds the request
        of one that waits until it starts. Nothing runs in it: it ends when
        cancelled, at its time limit, or GraceTime after preemption. Not resent,
        as `submit`.
        """
        if spec.script is not None or not spec.immediate:
            raise ValueError("an allocation has no script and is immediate")
        return await self._create_job("job/allocate", spec)

    async def _create_job(self, tail: str, spec: JobSpec) -> SubmitResult:
        dialect = await self.dialect()
        parsed, _ = await self._call(
            "POST", tail, _SubmitReply, idempotent=False, json=dialect.submit_body(spec)
        )
        if parsed.job_id is None:
            raise SlurmApiError(
                "POST", dialect.path(tail), 200, (SlurmProblem(0, "no job_id", "", ""),)
            )
        return SubmitResult(
            job_id=parsed.job_id, step_id=parsed.step_id, user_message=parsed.job_submit_user_msg
        )

    async def update_job(self, job_id: int, update: JobUpdate) -> None:
        dialect = await self.dialect()
        await self._call(
            "POST",
            f"job/{job_id}",
            _Reply,
            idempotent=True,
            json=dialect.job_update_body(update),
            not_found=frozenset([ESLURM_INVALID_JOB_ID]),
        )

    async def cancel(self, job_id: int) -> None:
        """Cancel a job. Already finished is fine; unknown raises SlurmNotFoundError."""
        await self._kill(job_id, None, idempotent=True)

    async def signal(self, job_id: int, signal: str, *, full: bool = False) -> None:
        """Send a signal (e.g. "SIGUSR1") to a job's steps; `full`: the batch script too."""
        await self._kill(job_id, signal, idempotent=False, full=full)

    async def _kill(
        self, job_id: int, signal: str | None, *, idempotent: bool, full: bool = False
    ) -> None:
        dialect = await self.dialect()
        tail = f"job/{job_id}"
        params: dict[str, str | int] = {}
        if signal:
            params["signal"] = signal
        if full:
            params["flags"] = "FULL_JOB"
        parsed, reply = await self._call(
            "DELETE",
            tail,
            _KillReply,
            idempotent=idempotent,
            params=params or None,
            not_found=frozenset([ESLURM_INVALID_JOB_ID]),
        )
        if parsed.status is None and not dialect.cancel_reports_status:
            # v0.0.40/41 answer 200 even for unknown jobs: ask, or an unknown
            # id would pass silently.
            if await self.job(job_id) is None:
                raise SlurmNotFoundError(
                    "DELETE",
                    dialect.path(tail),
                    200,
                    (SlurmProblem(ESLURM_INVALID_JOB_ID, "Invalid job id specified", "", ""),),
                )
            return
        problems = tuple(
            SlurmProblem(s.error.code, s.error.string, s.error.message, s.step_id)
            for s in parsed.status or ()
            if s.error.code not in (0, ESLURM_ALREADY_DONE)
        )
        if not problems:
            return
        error_type = (
            SlurmNotFoundError
            if any(p.errno == ESLURM_INVALID_JOB_ID for p in problems)
            else SlurmApiError
        )
        raise error_type("DELETE", dialect.path(tail), reply.status_code, problems)

    # -- partitions and reservations ---------------------------------------------------------

    async def partitions(self) -> list[Partition]:
        parsed, _ = await self._call("GET", "partitions/", _PartitionsReply, idempotent=True)
        return [Partition.from_wire(raw) for raw in parsed.partitions]

    async def reservations(self) -> list[Reservation]:
        parsed, _ = await self._call("GET", "reservations/", _ReservationsReply, idempotent=True)
        return parsed.reservations

    async def reservation(self, name: str) -> Reservation | None:
        """One reservation, or None if there is no such reservation."""
        try:
            parsed, _ = await self._call(
                "GET",
                f"reservation/{name}",
                _ReservationsReply,
                idempotent=True,
                not_found=frozenset([ESLURM_RESERVATION_INVALID]),
            )
        except SlurmNotFoundError:
            return None
        except SlurmApiError as exc:
            # An unknown name is reported as 200/errno 0 when there are no
            # reservations at all and as 422/errno 9000 (26.05) otherwise:
            # check the list rather than guess from those.
            if isinstance(exc, SlurmAuthError) or exc.transient:
                raise
            return next((r for r in await self.reservations() if r.name == name), None)
        return next((r for r in parsed.reservations if r.name == name), None)

    async def create_reservation(self, spec: ReservationSpec) -> None:
        """Create, or update if one of that name exists (that is what Slurm does).

        Needs v0.0.43+ (Slurm 25.05+); raises SlurmUnsupportedError before.
        """
        dialect = await self.dialect()
        self._require(dialect, "POST", "reservation", "creating a reservation")
        await self._call(
            "POST", "reservation", _Reply, idempotent=True, json=dialect.reservation_body(spec)
        )

    async def delete_reservation(self, name: str) -> None:
        dialect = await self.dialect()
        self._require(dialect, "DELETE", "reservation/{reservation_name}", "deleting a reservation")
        await self._call(
            "DELETE",
            f"reservation/{name}",
            _Reply,
            idempotent=True,
            not_found=frozenset([ESLURM_RESERVATION_INVALID]),
        )
