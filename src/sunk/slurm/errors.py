"""Errors of the Slurm port: Slurm's own error numbers and messages, typed.

slurmrestd reports failures in three ways, and a caller must not care which:
an HTTP status with an `errors` list (500/422/404/502 ...), an HTTP 200 whose
body still carries the failure (cancel of an unknown job: a `status` list
with code 2017), and plain-text 401s from the HTTP layer. All of them become
a `SlurmApiError` (or a subclass) carrying Slurm's error number and message.
"""

from __future__ import annotations

from dataclasses import dataclass

# Slurm's error numbers (slurm_errno.h) that sunk branches on.
ESLURM_ERROR = -1  # "Unspecified error": what the 24.11 partition defect reports
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR = 1800
ESLURM_INVALID_PARTITION_NAME = 2000
ESLURM_USER_ID_MISSING = 2010  # "Invalid user id": e.g. a plain user draining a node
ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2018
ESLURM_ALREADY_DONE = 2021
ESLURM_INVALID_NODE_STATE = 2028
ESLURM_ACTIVE_FEATURE_NOT_SUBSET = 2031
ESLURM_RESERVATION_INVALID = 2053
ESLURM_MISSING_WORK_DIR = 2063

# Errors that say "slurmctld could not be reached or timed out", not "no":
# retrying the same idempotent request later can succeed.
_TRANSIENT_ERRNOS = frozenset(
    [
        1001,  # SLURM_COMMUNICATIONS_CONNECTION_ERROR
        1002,  # SLURM_COMMUNICATIONS_SEND_ERROR
        1003,  # SLURM_COMMUNICATIONS_RECEIVE_ERROR
        1004,  # SLURM_COMMUNICATIONS_SHUTDOWN_ERROR
        1800,  # SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR
        1801,  # SLURMCTLD_COMMUNICATIONS_SEND_ERROR
        1802,  # SLURMCTLD_COMMUNICATIONS_RECEIVE_ERROR
        1803,  # SLURMCTLD_COMMUNICATIONS_SHUTDOWN_ERROR
        5004,  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
    ]
)


def is_transient_errno(errno: int) -> bool:
    return errno in _TRANSIENT_ERRNOS


@dataclass(frozen=True)
class SlurmProblem:
    """One entry of a reply's `errors` (or `warnings`) list."""

    errno: int  # Slurm's error number; 0 for warnings and text-only failures
    error: str  # Slurm's name for the number, e.g. "Invalid job id specified"
    description: str  # what failed, e.g. "Batch job submission failed"
    source: str = ""  # the slurmrestd function or field path that reported it

    def __str__(self) -> str:
        parts = [p for p in (self.error, self.description) if p]
        where = f" [{self.source}]" if self.source else ""
        return f"{': '.join(parts) or 'unknown error'} (slurm errno {self.errno}){where}"


class SlurmError(Exception):
    """Base of every error this package raises."""


class SlurmApiError(SlurmError):
    """slurmrestd answered, and the answer is a failure.

    `errno` and `message` are those of the first error Slurm reported (its
    own number and text); `problems` holds all of them.
    """

    def __init__(
        self, method: str, path: str, status: int, problems: tuple[SlurmProblem, ...]
    ) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.problems = problems
        first = problems[0] if problems else SlurmProblem(0, "", f"HTTP {status}")
        self.errno = first.errno
        self.message = first.error or first.description
        detail = "; ".join(str(p) for p in problems) or f"HTTP {status}"
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")

    @property
    def transient(self) -> bool:
        """True when retrying later may help (slurmctld unreachable, proxy errors)."""
        if self.problems:
            return any(is_transient_errno(p.errno) for p in self.problems)
        return self.status in (502, 503, 504)


class SlurmAuthError(SlurmApiError):
    """The token was missing (401), or rejected by slurmctld (511, errno 1007)."""


class SlurmNotFoundError(SlurmApiError):
    """The node, job or reservation does not exist (or no longer does)."""


class SlurmUnavailableError(SlurmError):
    """slurmrestd could not be reached, or the connection failed mid-request.

    `maybe_applied` is True when the request may have reached Slurm before the
    failure (a read timeout, a dropped connection): a non-idempotent request
    (submit, signal) is then never retried, and the caller must reconcile.
    """

    def __init__(self, method: str, path: str, cause: str, *, maybe_applied: bool) -> None:
        self.method = method
        self.path = path
        self.maybe_applied = maybe_applied
        super().__init__(f"{method} {path}: slurmrestd unavailable: {cause}")


class SlurmUnsupportedError(SlurmError):
    """The server's API version cannot do what was asked (e.g. reservations on 24.11)."""


class SlurmVersionError(SlurmError):
    """The server offers no data_parser version this package speaks."""


class SlurmStaleError(SlurmError):
    """The cached view is stale: slurmrestd has not answered recently; do not act on it."""
