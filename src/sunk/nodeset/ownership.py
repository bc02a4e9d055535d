"""Which NodeSet owns each Kubernetes node when several accept it.

A node belongs to at most one NodeSet. The NodeSet whose pod already runs on
the node keeps it while it still accepts the node (moving it would kill the
slurmd under running jobs); otherwise the oldest NodeSet wins, ties broken by
namespace and name, so every controller replica decides the same. The others
report the conflict in their status. Pure function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Claimant:
    """A NodeSet as ownership sees it; ordering is the tie-break."""

    created: str  # RFC 3339; sorts in time order
    namespace: str
    name: str


@dataclass
class Assignment:
    owner: dict[str, Claimant] = field(default_factory=dict)
    # claimant -> [(node, the claimant that owns it instead)]
    conflicts: dict[Claimant, list[tuple[str, Claimant]]] = field(default_factory=dict)

    def nodes_of(self, claimant: Claimant) -> list[str]:
        return sorted(node for node, owner in self.owner.items() if owner == claimant)


def assign(
    feasible: Mapping[Claimant, Sequence[str]], current: Mapping[str, Claimant] | None = None
) -> Assignment:
    """`feasible`: the nodes each NodeSet accepts; `current`: who has a pod on each node."""
    current = current or {}
    wanted: dict[str, list[Claimant]] = {}
    for claimant, nodes in feasible.items():
        for node in nodes:
            wanted.setdefault(node, []).append(claimant)
    result = Assignment()
    for node, claimants in sorted(wanted.items()):
        incumbent = current.get(node)
        winner = incumbent if incumbent in claimants else min(claimants)
        assert winner is not None
        result.owner[node] = winner
        for loser in claimants:
            if loser != winner:
                result.conflicts.setdefault(loser, []).append((node, winner))
    return result
