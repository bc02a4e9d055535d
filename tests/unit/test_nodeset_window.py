"""Maintenance windows: an update drains only inside its window, and reserves
its nodes in Slurm before it (pure: the planner and the window arithmetic)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pydantic import ValidationError

from sunk.api import nodeset as api
from sunk.nodeset.plan import (
    REASON_UPDATE,
    DeletePod,
    Drain,
    PodView,
    Reserve,
    SlurmNodeView,
    Unreserve,
    plan,
)
from sunk.nodeset.window import Window, window_at

NEW, OLD = "new", "old"
START = int(datetime.datetime(2026, 12, 5, 2, tzinfo=datetime.UTC).timestamp())
HOUR = 3600


def window(**fields: Any) -> api.MaintenanceWindow:
    return api.MaintenanceWindow.model_validate(
        {"start": "2026-12-05T02:00:00Z", "duration": "4h", **fields}
    )


def spec(windowed: bool = True, **fields: Any) -> api.NodeSetSpec:
    """maxUnavailable 2; a 4 h window from START unless `windowed` is False."""
    strategy: dict[str, Any] = {"rollingUpdate": {"maxUnavailable": 2}}
    if windowed:
        strategy["maintenanceWindow"] = {
            "start": "2026-12-05T02:00:00Z",
            "duration": "4h",
            **fields,
        }
    return api.NodeSetSpec.model_validate(
        {"template": {"spec": {"containers": [{"name": "slurmd"}]}}, "updateStrategy": strategy}
    )


OWNED = {"a": "gpu-a", "b": "gpu-b", "c": "gpu-c"}
OUTDATED = {f"gpu-{n}": PodView(f"gpu-{n}", n, OLD, True) for n in "abc"}
IDLE = {f"gpu-{n}": SlurmNodeView(f"gpu-{n}", drained=False, busy=False) for n in "abc"}


@pytest.mark.parametrize(
    ("fields", "now", "expected"),
    [
        ({}, START - 10, Window(START, START + 4 * HOUR)),
        ({}, START + HOUR, Window(START, START + 4 * HOUR)),
        ({}, START + 4 * HOUR, None),  # a window that does not repeat has passed
        ({"every": "24h"}, START - 10, Window(START, START + 4 * HOUR)),
        ({"every": "24h"}, START + 5 * HOUR, Window(START + 24 * HOUR, START + 28 * HOUR)),
        ({"every": "24h"}, START + 50 * HOUR, Window(START + 48 * HOUR, START + 52 * HOUR)),
        (
            {"every": "24h", "duration": "1h30m"},
            START + 90 * 60,
            Window(START + 86400, START + 86400 + 5400),
        ),
    ],
)
def test_the_window_open_now_or_the_next(
    fields: dict[str, Any], now: int, expected: Window | None
) -> None:
    assert window_at(window(**fields), now) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"start": "2026-12-05T02:00:00"}, "time zone"),
        ({"duration": "0m"}, "at least one minute"),
        ({"duration": "4 hours"}, "String should match pattern"),
        ({"every": "1h"}, "every: must be at least the window's duration"),
    ],
)
def test_a_bad_window_is_refused_naming_its_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        window(**fields)


def test_before_the_window_nothing_drains_and_the_outdated_nodes_are_reserved() -> None:
    result = plan(spec(), NEW, OWNED, OUTDATED, IDLE, now=START - HOUR)
    assert not any(isinstance(a, Drain) for a in result.actions)
    assert result.reservation == Reserve(("gpu-a", "gpu-b", "gpu-c"), START, START + 4 * HOUR)
    assert "update waits for the maintenance window from 2026-12-05T02:00:00Z" in result.waiting[0]
    assert not result.done


def test_without_a_window_an_update_drains_at_once_and_reserves_nothing() -> None:
    result = plan(spec(windowed=False), NEW, OWNED, OUTDATED, IDLE, now=START - HOUR)
    assert result.reservation == Unreserve()
    assert [a for a in result.actions if isinstance(a, Drain)] == [
        Drain("gpu-a", REASON_UPDATE),
        Drain("gpu-b", REASON_UPDATE),
    ]


def test_inside_the_window_the_update_drains_within_its_budget() -> None:
    result = plan(spec(), NEW, OWNED, OUTDATED, IDLE, now=START + 60)
    assert [a for a in result.actions if isinstance(a, Drain)] == [
        Drain("gpu-a", REASON_UPDATE),
        Drain("gpu-b", REASON_UPDATE),
    ]
    assert result.reservation == Reserve(("gpu-a", "gpu-b", "gpu-c"), START, START + 4 * HOUR)


def test_replaced_nodes_leave_the_reservation_and_the_last_one_ends_it() -> None:
    pods = {**OUTDATED, "gpu-a": PodView("gpu-a", "a", NEW, True)}
    result = plan(spec(), NEW, OWNED, pods, IDLE, now=START + 60)
    assert result.reservation == Reserve(("gpu-b", "gpu-c"), START, START + 4 * HOUR)
    current = {n: PodView(n, n[-1], NEW, True) for n in OUTDATED}
    assert plan(spec(), NEW, OWNED, current, IDLE, now=START + 60).reservation == Unreserve()


def test_after_a_one_off_window_undrained_nodes_wait_and_drained_idle_ones_are_replaced() -> None:
    view = {**IDLE, "gpu-a": SlurmNodeView("gpu-a", drained=True, busy=False, reason=REASON_UPDATE)}
    result = plan(spec(), NEW, OWNED, OUTDATED, view, now=START + 5 * HOUR)
    assert result.actions == [DeletePod("gpu-a", "gpu-a", "replaced by an update")]
    assert any("the last one has ended" in w for w in result.waiting)
    assert result.reservation == Unreserve()


def test_a_recurring_window_reserves_the_next_one() -> None:
    result = plan(spec(every="168h"), NEW, OWNED, OUTDATED, IDLE, now=START + 5 * HOUR)
    week = 168 * HOUR
    assert result.reservation == Reserve(
        ("gpu-a", "gpu-b", "gpu-c"), START + week, START + week + 4 * HOUR
    )


def test_a_stale_view_leaves_the_reservation_as_it_is() -> None:
    assert plan(spec(), NEW, OWNED, OUTDATED, None, now=START - HOUR).reservation is None


def test_on_delete_updates_never_reserve() -> None:
    on_delete = spec().model_copy(
        update={"update_strategy": spec().update_strategy.model_copy(update={"type": "OnDelete"})}
    )
    assert plan(on_delete, NEW, OWNED, OUTDATED, IDLE, now=START - HOUR).reservation == Unreserve()
