"""The NodeSet planner: updates and scale-in never take a node with a running job."""

from __future__ import annotations

from typing import Any

from sunk.api import nodeset as api
from sunk.nodeset.plan import (
    REASON_SCALE_IN,
    REASON_UPDATE,
    CreatePod,
    DeletePod,
    DeleteSlurmNode,
    Drain,
    PodView,
    Resume,
    SlurmNodeView,
    max_unavailable,
    plan,
)

NEW, OLD = "new", "old"
ADMIN = "bad DIMM, ticket 42"


def spec(max_unavailable: int | str = 1, strategy: str = "RollingUpdate") -> api.NodeSetSpec:
    return api.NodeSetSpec.model_validate(
        {
            "template": {"spec": {"containers": [{"name": "slurmd"}]}},
            "updateStrategy": {
                "type": strategy,
                "rollingUpdate": {"maxUnavailable": max_unavailable},
            },
        }
    )


def owned(*nodes: str) -> dict[str, str]:
    return {n: f"gpu-{n}" for n in nodes}


def pods(*entries: tuple[str, str], ready: bool = True, **kw: Any) -> dict[str, PodView]:
    return {f"gpu-{n}": PodView(f"gpu-{n}", n, rev, ready, **kw) for n, rev in entries}


def slurm(**nodes: SlurmNodeView) -> dict[str, SlurmNodeView]:
    return {f"gpu-{n}": v for n, v in nodes.items()}


def idle(node: str) -> SlurmNodeView:
    return SlurmNodeView(f"gpu-{node}", drained=False, busy=False)


def busy(node: str) -> SlurmNodeView:
    return SlurmNodeView(f"gpu-{node}", drained=False, busy=True, base_state="ALLOCATED")


def drained(node: str, reason: str = REASON_UPDATE, busy: bool = False) -> SlurmNodeView:
    state = "ALLOCATED" if busy else "IDLE"
    return SlurmNodeView(f"gpu-{node}", drained=True, busy=busy, reason=reason, base_state=state)


def test_every_owned_node_gets_a_pod() -> None:
    result = plan(spec(), NEW, owned("a", "b", "c"), {}, {})
    assert result.actions == [CreatePod("a"), CreatePod("b"), CreatePod("c")]
    assert result.status.desired == 3
    assert result.status.unavailable == 3


def test_a_steady_set_does_nothing() -> None:
    result = plan(
        spec(), NEW, owned("a", "b"), pods(("a", NEW), ("b", NEW)), slurm(a=idle("a"), b=busy("b"))
    )
    assert result.done
    status = result.status
    assert (status.desired, status.ready, status.updated, status.unavailable) == (2, 2, 2, 0)
    assert (status.slurm.idle, status.slurm.allocated) == (1, 1)


def test_an_update_drains_one_node_at_a_time() -> None:
    result = plan(
        spec(),
        NEW,
        owned("a", "b", "c"),
        pods(("a", OLD), ("b", OLD), ("c", OLD)),
        slurm(a=busy("a"), b=idle("b"), c=busy("c")),
    )
    assert result.actions == [Drain("gpu-a", REASON_UPDATE)]
    assert len(result.waiting) == 2


def test_a_drained_idle_node_is_replaced_and_a_busy_one_waits() -> None:
    state = slurm(a=drained("a"), b=idle("b"))
    result = plan(spec(), NEW, owned("a", "b"), pods(("a", OLD), ("b", OLD)), state)
    # "a" uses the whole budget: "b" is not drained yet.
    assert result.actions == [DeletePod("gpu-a", "gpu-a", "replaced by an update")]

    state = slurm(a=drained("a", busy=True), b=idle("b"))
    result = plan(spec(), NEW, owned("a", "b"), pods(("a", OLD), ("b", OLD)), state)
    assert result.actions == []
    assert any("jobs to end" in w for w in result.waiting)


def test_percentages_round_down_but_allow_one() -> None:
    assert max_unavailable(spec("25%").update_strategy, 10) == 2
    assert max_unavailable(spec("10%").update_strategy, 3) == 1
    nodes = [chr(ord("a") + i) for i in range(10)]
    result = plan(
        spec("25%"),
        NEW,
        owned(*nodes),
        pods(*((n, OLD) for n in nodes)),
        {f"gpu-{n}": busy(n) for n in nodes},
    )
    assert [a for a in result.actions if isinstance(a, Drain)] == [
        Drain("gpu-a", REASON_UPDATE),
        Drain("gpu-b", REASON_UPDATE),
    ]


def test_not_ready_pods_count_against_the_budget() -> None:
    state = slurm(a=idle("a"), b=idle("b"))
    result = plan(
        spec(), NEW, owned("a", "b"), {**pods(("a", OLD)), **pods(("b", OLD), ready=False)}, state
    )
    # "b" is already unavailable: "a" must wait.
    assert not any(isinstance(a, Drain) for a in result.actions)


def test_an_admin_drain_is_never_resumed_and_an_idle_one_costs_no_budget() -> None:
    state = slurm(a=drained("a", ADMIN), b=idle("b"))
    result = plan(spec(), NEW, owned("a", "b"), pods(("a", OLD), ("b", OLD)), state)
    # The admin-drained idle node serves no one: replace it, and still drain "b".
    assert DeletePod("gpu-a", "gpu-a", "replaced by an update") in result.actions
    assert Drain("gpu-b", REASON_UPDATE) in result.actions

    # After the replacement the admin's drain stays.
    result = plan(spec(), NEW, owned("a"), pods(("a", NEW)), slurm(a=drained("a", ADMIN)))
    assert result.done
    assert result.status.drained == 1


def test_an_admin_drain_with_jobs_waits_without_blocking_others() -> None:
    state = slurm(a=drained("a", ADMIN, busy=True), b=idle("b"))
    result = plan(spec(), NEW, owned("a", "b"), pods(("a", OLD), ("b", OLD)), state)
    assert result.actions == [Drain("gpu-b", REASON_UPDATE)]


def test_our_drain_is_resumed_once_the_new_pod_is_ready() -> None:
    state = slurm(a=drained("a"))
    assert plan(spec(), NEW, owned("a"), pods(("a", NEW), ready=False), state).actions == []
    result = plan(spec(), NEW, owned("a"), pods(("a", NEW)), state)
    assert result.actions == [Resume("gpu-a", REASON_UPDATE)]


def test_scale_in_drains_then_deletes_then_forgets_the_slurm_node() -> None:
    steps = [
        (slurm(b=busy("b")), [Drain("gpu-b", REASON_SCALE_IN)]),
        (slurm(b=drained("b", REASON_SCALE_IN, busy=True)), []),
        (
            slurm(b=drained("b", REASON_SCALE_IN)),
            [DeletePod("gpu-b", "gpu-b", "the node left the NodeSet")],
        ),
    ]
    for state, expected in steps:
        result = plan(
            spec(), NEW, owned("a"), pods(("a", NEW), ("b", NEW)), {**state, **slurm(a=idle("a"))}
        )
        assert result.actions == expected
        assert result.status.misscheduled == 1
    # The pod is gone: the Slurm record goes too.
    result = plan(spec(), NEW, owned("a"), pods(("a", NEW)), slurm(a=idle("a"), b=drained("b")))
    assert result.actions == [DeleteSlurmNode("gpu-b")]


def test_nothing_risky_happens_while_slurm_is_stale() -> None:
    result = plan(spec(), NEW, owned("a", "c"), pods(("a", OLD), ("b", NEW)), None)
    assert result.actions == [CreatePod("c")]
    assert len(result.waiting) == 2


def test_on_delete_never_replaces_by_itself() -> None:
    result = plan(spec(strategy="OnDelete"), NEW, owned("a"), pods(("a", OLD)), slurm(a=idle("a")))
    assert result.done
    assert result.status.updated == 0


def test_a_deleted_nodeset_drains_everything_out() -> None:
    result = plan(
        spec(),
        NEW,
        owned("a", "b"),
        pods(("a", NEW), ("b", NEW)),
        slurm(a=idle("a"), b=drained("b", ADMIN)),
        deleting=True,
    )
    assert result.actions == [
        Drain("gpu-a", REASON_SCALE_IN),
        DeletePod("gpu-b", "gpu-b", "the node left the NodeSet"),
    ]


def test_a_terminating_pod_blocks_its_successor_of_the_same_name() -> None:
    result = plan(
        spec(), NEW, owned("a"), pods(("a", OLD), terminating=True), slurm(a=drained("a"))
    )
    assert result.actions == []
    result = plan(spec(), NEW, owned("a"), {}, slurm(a=drained("a")))
    assert result.actions == [CreatePod("a")]


def test_a_failed_pod_is_deleted_at_once_and_recreated_afterwards() -> None:
    # kubelet refused it (e.g. stale node labels): no slurmd, so no drain, no Slurm check.
    failed = pods(("a", NEW), ready=False, failed=True)
    result = plan(spec(), NEW, owned("a"), failed, slurm(a=busy("a")))
    assert result.actions == [DeletePod("gpu-a", "gpu-a", "the pod failed", confirm=False)]
    # Once it is gone, the node gets a new pod.
    assert plan(spec(), NEW, owned("a"), {}, slurm(a=busy("a"))).actions == [CreatePod("a")]


def test_a_failed_pod_is_deleted_even_while_slurm_is_stale() -> None:
    failed = pods(("a", OLD), ready=False, failed=True)
    result = plan(spec(), NEW, owned("a"), failed, None)
    assert result.actions == [DeletePod("gpu-a", "gpu-a", "the pod failed", confirm=False)]
