"""Typed views of what sunk reads from and sends to slurmrestd.

Version-neutral: every data_parser from v0.0.40 to v0.0.45 sends these
fields in the same shape (checked against 24.11 and 26.05). Where versions
differ, `dialect.py` adapts; nothing here knows about versions.

Only fields sunk uses are modelled; the rest is ignored, so a newer Slurm
adding fields does not break parsing. Fields that change on their own all the
time (cpu_load, free_mem, energy, priority of pending jobs) are left out on
purpose: the cached view compares models to emit change events, and those
would make every poll look like a change.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from sunk.slurm.hostlist import expand

# A GPU entry of a job's gres_detail and its indices: "gpu:h100:2(IDX:0-1,3)".
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^,(]*)?\(IDX:([0-9,-]+)\)")


def _no_val(value: Any) -> int | None:
    """Slurm's optional numbers: {"set", "infinite", "number"} -> int, or None.

    None means unset *or* infinite: sunk never needs to tell them apart (an
    unlimited time limit and no time limit behave alike for its decisions).
    """
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        number = value.get("number")
        return int(number) if number is not None else None
    if value is None:
        return None
    return int(value)


def _time(value: Any) -> int | None:
    """A timestamp (epoch seconds); Slurm's 0 means "never"."""
    number = _no_val(value)
    return number or None


def _csv(value: Any) -> tuple[str, ...]:
    """Lists that some replies send as "a,b" strings and others as arrays."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(item for item in value.split(",") if item)
    return tuple(str(item) for item in value)


NoVal = Annotated[int | None, BeforeValidator(_no_val)]
Timestamp = Annotated[int | None, BeforeValidator(_time)]
Csv = Annotated[tuple[str, ...], BeforeValidator(_csv)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# Node base states (the first element of `state`); the rest are flags.
NODE_BASE_STATES = frozenset(
    ["IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "INVALID"]
)


class Node(_Model):
    name: str
    state: tuple[str, ...]
    reason: str = ""
    reason_set_by_user: str = ""
    reason_changed_at: Timestamp = None
    features: Csv = ()
    active_features: Csv = ()
    comment: str = ""
    extra: str = ""
    partitions: Csv = ()
    address: str = ""
    hostname: str = ""
    cpus: int = 0
    alloc_cpus: int = 0
    real_memory: int = 0
    alloc_memory: int = 0
    gres: str = ""
    gres_used: str = ""
    tres: str = ""
    weight: int = 0
    version: str = ""
    boot_time: Timestamp = None
    slurmd_start_time: Timestamp = None

    @property
    def base_state(self) -> str:
        """IDLE, ALLOCATED, MIXED, DOWN, ... (Slurm lists it first)."""
        for item in self.state:
            if item in NODE_BASE_STATES:
                return item
        return self.state[0] if self.state else "UNKNOWN"

    @property
    def flags(self) -> frozenset[str]:
        """DRAIN, NOT_RESPONDING, COMPLETING, DYNAMIC_NORM, ..."""
        return frozenset(self.state) - {self.base_state}

    @property
    def draining(self) -> bool:
        """Marked DRAIN. Read from the flag, never from `reason`: a reason outlives RESUME."""
        return "DRAIN" in self.state

    @property
    def drained(self) -> bool:
        """DRAIN and nothing left running on it: safe to take away."""
        return self.draining and self.idle_or_down

    @property
    def idle_or_down(self) -> bool:
        return (
            self.base_state in ("IDLE", "DOWN", "FUTURE", "UNKNOWN")
            and "COMPLETING" not in self.state
            and self.alloc_cpus == 0
        )

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.state and self.base_state != "DOWN"

    @property
    def dynamic(self) -> bool:
        return "DYNAMIC_NORM" in self.state or "DYNAMIC_FUTURE" in self.state


class ExitCode(_Model):
    status: tuple[str, ...] = ()
    return_code: NoVal = None


class Job(_Model):
    job_id: int
    name: str = ""
    job_state: tuple[str, ...] = ()
    state_reason: str = ""
    state_description: str = ""
    user_name: str = ""
    user_id: int | None = None
    account: str = ""
    partition: str = ""
    qos: str = ""
    nodes: str = ""  # hostlist of allocated nodes, "" while pending
    batch_host: str = ""
    node_count: NoVal = None
    cpus: NoVal = None
    tasks: NoVal = None
    time_limit: NoVal = None  # minutes; None = none or unlimited
    comment: str = ""
    features: str = ""  # the constraint expression
    resv_name: str = ""
    tres_req_str: str = ""
    tres_alloc_str: str = ""
    array_job_id: NoVal = None
    array_task_id: NoVal = None
    batch_flag: bool = False
    submit_time: Timestamp = None
    start_time: Timestamp = None
    end_time: Timestamp = None
    # Set when the job was picked for preemption; it ends once GraceTime is over.
    preempt_time: Timestamp = None
    exit_code: ExitCode | None = None
    current_working_directory: str = ""
    standard_output: str = ""
    # One entry per allocated node, in the order of `nodes`: "gpu:h100:2(IDX:0-1)".
    gres_detail: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        """PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ... (first element)."""
        return self.job_state[0] if self.job_state else "UNKNOWN"

    @property
    def flags(self) -> frozenset[str]:
        """COMPLETING, CONFIGURING, REQUEUED, ..."""
        return frozenset(self.job_state[1:])

    @property
    def finished(self) -> bool:
        return self.state not in ("PENDING", "RUNNING", "SUSPENDED") and (
            "COMPLETING" not in self.job_state
        )

    def gpu_indices(self) -> dict[str, tuple[int, ...]]:
        """The GPU indices the job holds on each of its nodes (`scontrol show
        job -d`'s `GRES=gpu:2(IDX:0-1)`), from `gres_detail`; nodes without
        GPUs are left out."""
        held: dict[str, tuple[int, ...]] = {}
        for node, detail in zip(expand(self.nodes), self.gres_detail, strict=False):
            indices = tuple(
                i for found in _GPU_IDX.findall(detail) for i in GresLayout(index=found).indices
            )
            if indices:
                held[node] = tuple(sorted(indices))
        return held


class PartitionNodes(_Model):
    configured: str = ""
    total: int = 0


class Partition(_Model):
    name: str
    nodes: PartitionNodes = PartitionNodes()
    node_sets: str = ""
    state: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Partition:
        # `state` lives one level down ({"partition": {"state": ["UP"]}}).
        state = (raw.get("partition") or {}).get("state") or ()
        return cls.model_validate({**raw, "state": tuple(state)})


class GresLayout(_Model):
    """One kind of GRES a job holds on one node, with its device indices."""

    name: str = ""  # e.g. "gpu"
    type: str = ""  # e.g. "a100"; "" without types
    count: int = 0
    index: str = ""  # Slurm's device indices on the node, as "0-1,3"

    @property
    def indices(self) -> tuple[int, ...]:
        found: list[int] = []
        for part in filter(None, self.index.split(",")):
            first, _, last = part.partition("-")
            found += range(int(first), int(last or first) + 1)
        return tuple(found)


class NodeLayout(_Model):
    """What a job holds on one node (`GET /resources/{job_id}`, v0.0.44+)."""

    node: str
    mem_alloc: int = 0  # MiB
    core_bitmap: str = ""
    gres: tuple[GresLayout, ...] = ()


class Reservation(_Model):
    name: str
    node_list: str = ""
    node_count: NoVal = None
    start_time: Timestamp = None
    end_time: Timestamp = None
    flags: tuple[str, ...] = ()
    users: Csv = ()
    accounts: Csv = ()
    partition: str = ""


class ControllerPing(_Model):
    hostname: str = ""
    pinged: str = ""  # v0.0.40-44: "UP" or "DOWN"; DOWN also when the *token* is bad
    responding: bool | None = None  # v0.0.42+ only
    latency: int = 0  # microseconds
    mode: str = ""  # v0.0.40-44: primary, backup1, ...
    primary: bool | None = None  # v0.0.42+ only; older versions say it in `mode`

    @model_validator(mode="after")
    def _fill_older_versions(self) -> ControllerPing:
        # v0.0.40/41 send neither field; derive them so callers need not care.
        if self.responding is None:
            object.__setattr__(self, "responding", self.pinged == "UP")
        if self.primary is None:
            object.__setattr__(self, "primary", self.mode == "primary")
        return self

    @property
    def up(self) -> bool:
        if self.pinged:  # v0.0.40-44
            return self.pinged == "UP" and bool(self.responding)
        return bool(self.responding)


class Diag(_Model):
    """A few of slurmctld's scheduler statistics (`sdiag`)."""

    server_thread_count: int = 0
    agent_queue_size: int = 0
    schedule_cycle_last: int = 0  # microseconds
    schedule_cycle_mean: int = 0
    schedule_queue_length: int = 0
    jobs_submitted: int = 0
    jobs_started: int = 0
    jobs_completed: int = 0
    jobs_canceled: int = 0
    jobs_failed: int = 0
    jobs_pending: int = 0
    jobs_running: int = 0
    bf_last_backfilled_jobs: int = 0
    bf_cycle_last: int = 0


class ServerInfo(_Model):
    """Who answered: the Slurm release and the API version in use."""

    release: str
    api_version: str
    cluster: str = ""
    offered: tuple[str, ...] = ()


class SubmitResult(_Model):
    job_id: int
    step_id: str = ""
    user_message: str = ""  # job_submit plugin's message to the user, if any


# -- requests ------------------------------------------------------------------


class JobSpec(_Model):
    """A job as sunk asks for it: a batch job (with `script`) or an allocation
    (without). Renders to the request body in dialect.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    script: str | None = None
    name: str = "sunk"
    partition: str | None = None
    nodes: str | None = None  # count ("2", "1-4") or let Slurm pick
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    tasks: int | None = None
    cpus_per_task: int | None = None
    memory_per_node_mb: int | None = None
    time_limit_minutes: int | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraints: str | None = None
    tres_per_node: str | None = None  # e.g. "gres/gpu:h100:8"
    comment: str | None = None
    exclusive: bool = False
    # Finer than `exclusive`: "none" (whole nodes), "user", "mcs", "topo", or
    # "oversubscribe"; None leaves Slurm's default. Wins over `exclusive`.
    sharing: str | None = None
    hold: bool = False
    # Start now or be refused (salloc --immediate); an allocation that must wait
    # would block slurmrestd's request until it starts.
    immediate: bool = False
    requeue: bool | None = None
    user_id: int | None = None  # run as this uid: the token's own, or any with an admin's
    group_id: int | None = None
    current_working_directory: str = "/tmp"  # noqa: S108 - slurmrestd needs one
    environment: tuple[str, ...] = ("PATH=/usr/bin:/bin",)  # ... and this (2019 otherwise)
    standard_output: str | None = None
    standard_error: str | None = None


class JobUpdate(_Model):
    """Fields to change on a job; None leaves a field as it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    comment: str | None = None
    time_limit_minutes: int | None = None
    partition: str | None = None
    nice: int | None = None
    hold: bool | None = None
    required_nodes: tuple[str, ...] | None = None
    excluded_nodes: tuple[str, ...] | None = None
    constraints: str | None = None
    name: str | None = None


class NodeUpdate(_Model):
    """Fields to change on a node; None leaves a field as it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: str | None = None  # DRAIN, DOWN, RESUME, UNDRAIN, ...
    reason: str | None = None
    features: tuple[str, ...] | None = None
    comment: str | None = None
    extra: str | None = None
    weight: int | None = None


class ReservationSpec(_Model):
    """A reservation, e.g. a maintenance window over some nodes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    nodes: tuple[str, ...] = ()
    start_time: int  # epoch seconds
    duration_minutes: int
    users: tuple[str, ...] = ("root",)
    accounts: tuple[str, ...] = ()
    flags: tuple[str, ...] = ("MAINT", "IGNORE_JOBS")
    partition: str | None = None
    comment: str | None = None
