"""What every leader-elected sunk component is made of, wired once: a
Kubernetes client, a Slurm client with the component's own credentials, and
a Lease. The component's work, its Slurm view included, runs only while it
holds the Lease: a standby polls nothing and writes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from lightkube import AsyncClient

from sunk.kube.leader import LeaderElector
from sunk.slurm.auth import Credentials, slurm_credentials
from sunk.slurm.client import SlurmClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlurmAccess:
    """How a component reaches Slurm: slurmrestd, and tokens for its own user,
    read from the file `sunk tokens` keeps (a cluster) or minted from the
    cluster's key (the test beds). Exactly one of the two files."""

    url: str
    jwt_key_file: Path | None = None
    jwt_token_file: Path | None = None
    user: str = "slurm"

    def credentials(self) -> Credentials:
        return slurm_credentials(self.jwt_key_file, self.jwt_token_file, self.user)


@dataclass(frozen=True)
class Election:
    """The Lease a component's replicas compete for."""

    name: str
    namespace: str = "default"
    identity: str = ""  # "": this host and process

    def holder(self) -> str:
        return self.identity or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Wiring:
    """What the leader's work gets."""

    kube: AsyncClient
    slurm: SlurmClient
    identity: str


async def run_elected(
    component: str,
    kube: AsyncClient,
    slurm: SlurmAccess,
    election: Election,
    lead: Callable[[Wiring], Awaitable[None]],
) -> None:
    """Run `lead` whenever this replica holds the Lease, forever. What every
    replica needs, leader or not (the CRDs, a Secret read at start), is the
    caller's to do first, with `kube`."""
    identity = election.holder()
    async with SlurmClient(slurm.url, slurm.credentials()) as client:
        wiring = Wiring(kube, client, identity)

        async def leading() -> None:
            await lead(wiring)

        elector = LeaderElector(
            kube, namespace=election.namespace, name=election.name, identity=identity
        )
        log.info("%s %s waiting to lead", component, identity)
        await elector.run(leading)
