"""Everything that differs between slurmrestd's data_parser versions, in one place.

Measured against Slurm 24.11.5 (v0.0.40-v0.0.42) and 26.05.5 (v0.0.42-v0.0.45):

| what                                 | v0.0.40/41          | v0.0.42+                     |
| ------------------------------------ | ------------------- | ---------------------------- |
| `update_time` on nodes/jobs          | rejected (500/422)  | 304 / "no change" reply      |
| cancel reply                         | no per-job status:  | `status` list with code      |
|                                      | errors are invisible| (2017 unknown, 2021 done)    |
| exclusive job                        | `exclusive: [true]` | `shared: [none]`             |
| reservation create/delete            | -                   | v0.0.43+ (Slurm 25.05+)      |
| a job's per-node resources (GRES idx)| -                   | v0.0.44+ (`GET /resources/`) |
| ping `responding`, `primary`         | absent (models.py   | present                      |
|                                      | derives them)       |                              |
| ping `pinged`, `mode`                | present             | gone in v0.0.45 (`status`    |
|                                      |                     | instead; `up` = responding)  |

v0.0.45 (26.05) against v0.0.44, for what sunk sends and reads (diffed from
`slurmrestd --generate-openapi-spec`): the ping change above; a job read's
`shared` is deprecated and ignored (sunk does not read it; submissions still
take `shared`); new endpoints sunk does not use yet (`GET /conf`, job
requeue, partition create/delete); the rest is new enum values and fields.
Reads are the same shape in every version for the fields in models.py.
Release-specific defects (24.11's 500 "Unable to query partitions" on
incremental node reads) are not version properties: the view survives them at
run time whatever the version says.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sunk.slurm.errors import SlurmVersionError
from sunk.slurm.models import JobSpec, JobUpdate, NodeUpdate, ReservationSpec

SUPPORTED_VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")

_PATH = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/(.*)$")
_METHODS = ("get", "post", "put", "delete", "patch")

JsonObject = dict[str, Any]


def version_key(version: str) -> tuple[int, ...]:
    """ "v0.0.42" -> (0, 0, 42), for ordering."""
    return tuple(int(part) for part in version.lstrip("v").split("."))


def offered_endpoints(openapi: Mapping[str, Any]) -> dict[str, frozenset[tuple[str, str]]]:
    """Per version, the (METHOD, path-after-version) pairs an OpenAPI document lists."""
    found: dict[str, set[tuple[str, str]]] = {}
    for path, operations in (openapi.get("paths") or {}).items():
        match = _PATH.match(path)
        if match is None or not isinstance(operations, Mapping):
            continue
        version, tail = match.groups()
        methods = {m.upper() for m in operations if m in _METHODS}
        found.setdefault(version, set()).update((m, tail) for m in methods)
    return {version: frozenset(pairs) for version, pairs in found.items()}


def choose_version(offered: Iterable[str], supported: Iterable[str] = SUPPORTED_VERSIONS) -> str:
    """The newest version both sides speak."""
    offered = set(offered)
    common = offered & set(supported)
    if not common:
        raise SlurmVersionError(
            f"slurmrestd offers {sorted(offered, key=version_key) or 'no data_parser'}, "
            f"sunk speaks {list(supported)}"
        )
    return max(common, key=version_key)


def _no_val(number: int) -> JsonObject:
    return {"set": True, "infinite": False, "number": number}


def _drop_none(body: Mapping[str, Any]) -> JsonObject:
    return {key: value for key, value in body.items() if value is not None}


@dataclass(frozen=True)
class Dialect:
    """How to talk to one data_parser version of one server."""

    version: str
    endpoints: frozenset[tuple[str, str]] = frozenset()

    @property
    def _minor(self) -> int:
        return version_key(self.version)[-1]

    # -- capabilities ----------------------------------------------------------

    @property
    def incremental_reads(self) -> bool:
        """`update_time` works on nodes and jobs (v0.0.40/41 reject any number)."""
        return self._minor >= 42

    @property
    def cancel_reports_status(self) -> bool:
        """Cancel replies carry a per-job `status`; older ones hide every failure."""
        return self._minor >= 42

    def has(self, method: str, tail: str) -> bool:
        """Whether the server's document lists this endpoint (True if unknown)."""
        return not self.endpoints or (method.upper(), tail) in self.endpoints

    def path(self, tail: str) -> str:
        return f"/slurm/{self.version}/{tail}"

    # -- request bodies --------------------------------------------------------

    def _exclusive(self, sharing: str = "none") -> JsonObject:
        if self._minor >= 42:
            return {"shared": [sharing]}
        if sharing == "oversubscribe":
            return {"shared": ["oversubscribe"]}
        return {"exclusive": ["true" if sharing == "none" else sharing]}

    def submit_body(self, spec: JobSpec) -> JsonObject:
        job: JsonObject = _drop_none(
            {
                "name": spec.name,
                "partition": spec.partition,
                "nodes": spec.nodes,
                "required_nodes": list(spec.required_nodes) or None,
                "excluded_nodes": list(spec.excluded_nodes) or None,
                "tasks": spec.tasks,
                "cpus_per_task": spec.cpus_per_task,
                "memory_per_node": _no_val(spec.memory_per_node_mb)
                if spec.memory_per_node_mb is not None
                else None,
                "time_limit": _no_val(spec.time_limit_minutes)
                if spec.time_limit_minutes is not None
                else None,
                "account": spec.account,
                "qos": spec.qos,
                "reservation": spec.reservation,
                "constraints": spec.constraints,
                "tres_per_node": spec.tres_per_node,
                "comment": spec.comment,
                "hold": spec.hold or None,
                "immediate": spec.immediate or None,
                "requeue": spec.requeue,
                "user_id": str(spec.user_id) if spec.user_id is not None else None,
                "group_id": str(spec.group_id) if spec.group_id is not None else None,
                "current_working_directory": spec.current_working_directory,
                "environment": list(spec.environment),
                "standard_output": spec.standard_output,
                "standard_error": spec.standard_error,
                "script": spec.script,
            }
        )
        if spec.sharing is not None:
            job.update(self._exclusive(spec.sharing))
        elif spec.exclusive:
            job.update(self._exclusive())
        return {"job": job}

    def job_update_body(self, update: JobUpdate) -> JsonObject:
        # The job description itself, not wrapped in {"job": ...}: a wrapped
        # body is accepted with only a warning "Ignoring unknown field".
        return _drop_none(
            {
                "comment": update.comment,
                "time_limit": _no_val(update.time_limit_minutes)
                if update.time_limit_minutes is not None
                else None,
                "partition": update.partition,
                "nice": update.nice,
                "hold": update.hold,
                "required_nodes": list(update.required_nodes)
                if update.required_nodes is not None
                else None,
                "excluded_nodes": list(update.excluded_nodes)
                if update.excluded_nodes is not None
                else None,
                "constraints": update.constraints,
                "name": update.name,
            }
        )

    def node_update_body(self, update: NodeUpdate) -> JsonObject:
        body = _drop_none(
            {
                "state": [update.state] if update.state is not None else None,
                "reason": update.reason,
                "comment": update.comment,
                "extra": update.extra,
                "weight": _no_val(update.weight) if update.weight is not None else None,
            }
        )
        if update.features is not None:
            # Available and active together: changing only the available set
            # fails with 2031 "Active features not subset of available".
            body["features"] = list(update.features)
            body["features_act"] = list(update.features)
        return body

    def reservation_body(self, spec: ReservationSpec) -> JsonObject:
        return _drop_none(
            {
                "name": spec.name,
                "node_list": list(spec.nodes) or None,  # a string draws a warning
                "start_time": _no_val(spec.start_time),
                "duration": _no_val(spec.duration_minutes),
                "users": list(spec.users) or None,
                "accounts": list(spec.accounts) or None,
                "flags": list(spec.flags) or None,
                "partition": spec.partition,
                "comment": spec.comment,
            }
        )

    # -- replies ----------------------------------------------------------------

    @staticmethod
    def jobs_unchanged(job_count: int, last_update: int | None) -> bool:
        """A jobs read with update_time, and nothing changed.

        Not a 304 like nodes: 200 with no jobs, `last_update` 0 and a warning
        "No job changes since update_time". A cluster without jobs has a real
        `last_update`, which is how the two differ.
        """
        return job_count == 0 and not last_update

    @staticmethod
    def expected_warning(description: str) -> bool:
        """Warnings that are part of normal operation, not worth a log line."""
        return description.startswith(
            ("No job changes since update_time", "Zero jobs to dump")
        ) or any(
            text in description
            for text in (
                "accounting storage is disabled",
                # v0.0.40/41 on submit with hold=True: the hold is what was asked for.
                "Job is in held state, pending scheduler release",
            )
        )
