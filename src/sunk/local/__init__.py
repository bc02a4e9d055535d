"""The local node runtime: Kubernetes nodes on this machine that really run pods.

See docs/local-runtime.md. Entry points: `LocalRuntime` (with `RuntimeConfig`,
`NodeConfig` and `ControlPlaneIdentities`), the CLI `sunk local nodes` /
`sunk local logs`, and `sunk.local.slurmpods` for slurmd pods.
"""

from sunk.local.node import NodeConfig
from sunk.local.runtime import (
    ControlPlaneIdentities,
    Identities,
    LocalRuntime,
    RuntimeConfig,
    cleanup,
)

__all__ = [
    "ControlPlaneIdentities",
    "Identities",
    "LocalRuntime",
    "NodeConfig",
    "RuntimeConfig",
    "cleanup",
]
