"""The Slurm port: how every sunk controller talks to Slurm.

- `SlurmClient`: async REST client for slurmrestd (version-aware, typed errors).
- `JwtMinter` & co.: short-lived tokens minted from the cluster's jwt key.
- `SlurmView`: nodes and jobs cached in memory, kept current by incremental
  polling, with change events and an explicit stale state.
- `sunk.slurm.hostlist`: Slurm hostlist expressions.
"""

from sunk.slurm.auth import (
    Credentials,
    FileKey,
    JwtMinter,
    KeySource,
    StaticKey,
    StaticToken,
    Token,
    mint,
)
from sunk.slurm.client import ClientStats, Listing, RetryPolicy, SlurmClient
from sunk.slurm.dialect import SUPPORTED_VERSIONS, Dialect
from sunk.slurm.errors import (
    SlurmApiError,
    SlurmAuthError,
    SlurmError,
    SlurmNotFoundError,
    SlurmProblem,
    SlurmStaleError,
    SlurmUnavailableError,
    SlurmUnsupportedError,
    SlurmVersionError,
)
from sunk.slurm.models import (
    ControllerPing,
    Diag,
    GresLayout,
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
)
from sunk.slurm.view import (
    Change,
    Event,
    JobEvent,
    NodeEvent,
    Resync,
    SlurmView,
    StateEvent,
    Subscription,
    ViewState,
)

__all__ = [
    "SUPPORTED_VERSIONS",
    "Change",
    "ClientStats",
    "ControllerPing",
    "Credentials",
    "Diag",
    "Dialect",
    "Event",
    "FileKey",
    "GresLayout",
    "Job",
    "JobEvent",
    "JobSpec",
    "JobUpdate",
    "JwtMinter",
    "KeySource",
    "Listing",
    "Node",
    "NodeEvent",
    "NodeLayout",
    "NodeUpdate",
    "Partition",
    "Reservation",
    "ReservationSpec",
    "Resync",
    "RetryPolicy",
    "ServerInfo",
    "SlurmApiError",
    "SlurmAuthError",
    "SlurmClient",
    "SlurmError",
    "SlurmNotFoundError",
    "SlurmProblem",
    "SlurmStaleError",
    "SlurmUnavailableError",
    "SlurmUnsupportedError",
    "SlurmVersionError",
    "SlurmView",
    "StateEvent",
    "StaticKey",
    "StaticToken",
    "SubmitResult",
    "Subscription",
    "Token",
    "ViewState",
    "mint",
]
