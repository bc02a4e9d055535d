"""Status conditions, Kubernetes style: lastTransitionTime moves only when status does."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Literal

from sunk.api.nodeset import Condition

Status = Literal["True", "False", "Unknown"]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: Status,
    reason: str,
    message: str = "",
    generation: int | None = None,
) -> list[Condition]:
    """The conditions with `type_` set; other types are kept in their order."""
    previous = next((c for c in conditions if c.type == type_), None)
    moved = previous is None or previous.status != status
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now() if moved or previous is None else previous.last_transition_time,
        observed_generation=generation,
    )
    kept = [c for c in conditions if c.type != type_]
    return sorted([*kept, updated], key=lambda c: c.type)


def same_conditions(a: Sequence[Condition], b: Sequence[Condition]) -> bool:
    """Equal but for transition times (used to skip no-op status writes)."""

    def strip(cs: Sequence[Condition]) -> list[tuple[str, str, str, str, int | None]]:
        return [(c.type, c.status, c.reason, c.message, c.observed_generation) for c in cs]

    return strip(a) == strip(b)
