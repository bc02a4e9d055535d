"""The NodeSet planner: updates and scale-in never take a node with a running job."""

from __future__ import annotations

from typing import Any

from sunk.api import nodeset as api
from sunk.gres.plan import GresLine
from sunk.nodeset.plan import (
    REASON_GRES,
    REASON_SCALE_IN,
    REASON_UPDATE,
    CreatePod,
    DeletePod,
    DeleteSlurmNode,
    Drain,
    GiveGpus,
    PodView,
    Reconfigure,
    Reregister,
    Resume,
    SlurmNodeView,
    max_unavailable,
    plan,
    same_gres,
    with_gres,
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


# -- a node whose GPUs changed registers anew

CONF = "Feature=gpu CPUs=8 RealMemory=1000 Gres=gpu:4"


def gpu_state(gres: str, *, drained_by: str = "", jobs: bool = False) -> SlurmNodeView:
    return SlurmNodeView(
        "gpu-a",
        drained=bool(drained_by),
        busy=jobs,
        reason=drained_by,
        gres=gres,
        base_state="MIXED" if jobs else "IDLE",
    )


def regres(state: SlurmNodeView | None, want: str = "gpu:3", conf: str = CONF) -> Any:
    return plan(
        spec(),
        NEW,
        owned("a"),
        pods(("a", NEW), conf=conf),
        {"gpu-a": state} if state else {},
        gres={"gpu-a": want},
    )


def test_a_node_whose_gpus_changed_is_drained_then_registers_anew_once_idle() -> None:
    drain = f"{REASON_GRES} (gpu:4 -> gpu:3)"
    assert regres(gpu_state("gpu:4")).actions == [Drain("gpu-a", drain)]
    assert regres(gpu_state("gpu:4", jobs=True)).actions == [Drain("gpu-a", drain)]
    waiting = regres(gpu_state("gpu:4", drained_by=drain, jobs=True))
    assert waiting.actions == []
    assert "waiting for its jobs to end" in waiting.waiting[0]
    again = Reregister("gpu-a", "gpu-a", "Feature=gpu CPUs=8 RealMemory=1000 Gres=gpu:3")
    assert regres(gpu_state("gpu:4", drained_by=drain)).actions == [again]
    # Slurm's own drain of a node that reported fewer GPUs than it counts.
    slurms = "gres/gpu count reported lower than configured (3 < 4)"
    assert regres(gpu_state("gpu:4", drained_by=slurms)).actions == [again]


def test_a_persons_drain_is_kept_until_they_resume_it() -> None:
    result = regres(gpu_state("gpu:4", drained_by=ADMIN))
    assert result.actions == []
    assert "registers anew once resumed" in result.waiting[0]


def test_our_gres_drain_is_not_resumed_while_the_gpus_differ() -> None:
    """Resuming a node drained for its GPUs would undo the drain the
    re-registration waits for."""
    result = regres(gpu_state("gpu:4", drained_by=f"{REASON_GRES} (gpu:4 -> gpu:3)", jobs=True))
    assert not [a for a in result.actions if isinstance(a, Resume)]


def test_a_node_registered_with_its_gpus_is_left_alone() -> None:
    assert regres(gpu_state("gpu:3(S:0-1)")).done
    assert regres(gpu_state("gpu:4"), want="gpu:4").done
    # An old pod without the annotation, or a node whose GPUs are not known
    # now (its plugin restarting): nothing.
    assert regres(gpu_state("gpu:4"), conf="").done
    result = plan(spec(), NEW, owned("a"), pods(("a", NEW), conf=CONF), slurm(a=gpu_state("gpu:4")))
    assert result.done


def test_a_node_out_of_slurm_gets_its_new_conf_unless_it_has_it() -> None:
    """Its record deleted and the write of its --conf failed: given again.
    Already given: it is registering, nothing more."""
    assert regres(None).actions == [
        Reregister("gpu-a", "gpu-a", "Feature=gpu CPUs=8 RealMemory=1000 Gres=gpu:3")
    ]
    assert regres(None, conf=with_gres(CONF, "gpu:3")).done


def test_nothing_of_it_while_slurm_is_stale() -> None:
    result = plan(spec(), NEW, owned("a"), pods(("a", NEW), conf=CONF), None, gres={"gpu-a": "x"})
    assert not [a for a in result.actions if isinstance(a, Drain | Reregister)]


def test_gres_compare_as_slurm_writes_them() -> None:
    assert same_gres("gpu:h100:4(S:0-1),shard:8", "shard:8,gpu:h100:4")
    assert not same_gres("gpu:4", "gpu:3")
    assert same_gres("", "")
    assert with_gres(CONF, "") == "Feature=gpu CPUs=8 RealMemory=1000"
    assert with_gres("Feature=gpu CPUs=8", "gpu:2") == "Feature=gpu CPUs=8 Gres=gpu:2"


def test_slurms_drain_of_a_node_whose_count_is_right_is_resumed() -> None:
    """It registered before its gres.conf line reached slurmctld (a new
    node): Slurm drained it for 0 < 4; the count is right, so it is resumed
    (and Slurm drains it again if slurmd still reports too few)."""
    reason = "gres/gpu count reported lower than configured (0 < 4)"

    def resumes(listed: dict[str, GresLine] | None, drained_by: str = reason) -> list[Any]:
        state = gpu_state("gpu:4", drained_by=drained_by)
        return plan(
            spec(), NEW, owned("a"), pods(("a", NEW), conf=CONF), {"gpu-a": state},
            gres={"gpu-a": "gpu:4"}, listed=listed,
        ).actions  # fmt: skip

    assert resumes({"gpu-a": GresLine(4, 0.0)}) == [Resume("gpu-a", reason)]
    # Not while sunk's gres.conf lacks its line, names another count, or is not sunk's.
    assert resumes({}) == []
    assert resumes({"gpu-a": GresLine(3, 0.0)}) == []
    assert resumes(None) == []
    # A person's drain of a node whose count is right: theirs.
    assert resumes({"gpu-a": GresLine(4, 0.0)}, drained_by=ADMIN) == []


def test_sunks_gres_line_changes_first_and_reaches_slurmctld_before_slurmd_starts_again() -> None:
    """With sunk's gres.conf: the drained, idle node's pod gets the GPUs its
    Node lists now (its line changes); once the line counts them and has had
    time to reach slurmctld, the node registers anew."""
    drain = f"{REASON_GRES} (gpu:4 -> gpu:3)"
    state = gpu_state("gpu:4", drained_by=drain)

    def step(pod_gpus: str, line: GresLine | None, now: float) -> Any:
        return plan(
            spec(), NEW, owned("a"), pods(("a", NEW), conf=CONF, gpus=pod_gpus),
            {"gpu-a": state}, now=now, gres={"gpu-a": "gpu:3"},
            node_gpus={"gpu-a": "0,2,3"},
            listed={"gpu-a": line} if line else {},
        )  # fmt: skip

    first = step("0,1,2,3", GresLine(4, 0.0), 1000.0)
    assert first.actions == [GiveGpus("gpu-a", "0,2,3")]
    young = step("0,2,3", GresLine(3, 990.0), 1000.0)
    assert young.actions == []
    assert "waiting for its gres.conf line to reach slurmctld" in young.waiting[0]
    assert step("0,2,3", GresLine(4, 0.0), 1000.0).actions == []  # not written yet
    assert step("0,2,3", GresLine(3, 900.0), 1000.0).actions == [
        Reregister("gpu-a", "gpu-a", "Feature=gpu CPUs=8 RealMemory=1000 Gres=gpu:3")
    ]


def test_a_node_registered_anew_has_slurmctld_read_its_files_once() -> None:
    """Its record deleted, Slurm dropped it from the topology: placed again
    only when slurmctld reads its files, once per registration."""

    def actions(registration: str, reconfigured: str) -> list[Any]:
        return plan(
            spec(), NEW, owned("a"),
            pods(("a", NEW), conf=CONF, registration=registration, reconfigured=reconfigured),
            {"gpu-a": gpu_state("gpu:4")}, gres={"gpu-a": "gpu:4"},
        ).actions  # fmt: skip

    assert actions("2", "1") == [Reconfigure("gpu-a", "2")]
    assert actions("2", "2") == []
    assert actions("", "") == []
