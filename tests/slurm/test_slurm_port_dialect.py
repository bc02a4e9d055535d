"""Version negotiation and the per-version request bodies."""

from __future__ import annotations

import pytest

from sunk.slurm import (
    JobSpec,
    JobUpdate,
    NodeLayout,
    NodeUpdate,
    ReservationSpec,
    SlurmVersionError,
)
from sunk.slurm.dialect import Dialect, choose_version, offered_endpoints

DOC = {
    "paths": {
        "/slurm/v0.0.41/nodes/": {"get": {}},
        "/slurm/v0.0.42/nodes/": {"get": {}, "post": {}},
        "/slurm/v0.0.44/reservation": {"post": {}, "parameters": []},
        "/slurm/v0.0.45/nodes/": {"get": {}},
        "/slurmdb/v0.0.44/jobs/": {"get": {}},
        "/openapi/v3": {"get": {}},
    }
}


def test_offered_endpoints_per_version() -> None:
    offered = offered_endpoints(DOC)
    assert set(offered) == {"v0.0.41", "v0.0.42", "v0.0.44", "v0.0.45"}
    assert offered["v0.0.42"] == {("GET", "nodes/"), ("POST", "nodes/")}
    assert offered["v0.0.44"] == {("POST", "reservation")}


def test_choose_the_newest_common_version() -> None:
    assert choose_version(["v0.0.40", "v0.0.41", "v0.0.42"]) == "v0.0.42"
    assert choose_version(["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"]) == "v0.0.45"
    assert choose_version(["v0.0.44", "v0.0.45", "v0.0.46"]) == "v0.0.45"  # 26.11's is unknown
    assert choose_version(["v0.0.9", "v0.0.40"]) == "v0.0.40"  # numeric, not string order
    with pytest.raises(SlurmVersionError, match=r"v0\.0\.38"):
        choose_version(["v0.0.37", "v0.0.38"])


def test_capabilities_by_version() -> None:
    old, new = Dialect("v0.0.41"), Dialect("v0.0.44", frozenset({("POST", "reservation")}))
    assert not old.incremental_reads
    assert new.incremental_reads
    assert not old.cancel_reports_status
    assert new.cancel_reports_status
    assert new.has("POST", "reservation")
    assert not new.has("DELETE", "reservation/{reservation_name}")
    assert old.has("POST", "anything")  # no document: assume yes, let Slurm say no
    assert new.path("nodes/") == "/slurm/v0.0.44/nodes/"


def test_submit_body() -> None:
    spec = JobSpec(script="#!/bin/sh\ntrue\n", name="j", nodes="1", time_limit_minutes=5)
    body = Dialect("v0.0.42").submit_body(spec)
    assert body == {
        "job": {
            "name": "j",
            "nodes": "1",
            "time_limit": {"set": True, "infinite": False, "number": 5},
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            "script": "#!/bin/sh\ntrue\n",
        }
    }
    exclusive = spec.model_copy(update={"exclusive": True})
    assert Dialect("v0.0.41").submit_body(exclusive)["job"]["exclusive"] == ["true"]
    assert Dialect("v0.0.44").submit_body(exclusive)["job"]["shared"] == ["none"]


def test_update_bodies() -> None:
    dialect = Dialect("v0.0.44")
    assert dialect.node_update_body(NodeUpdate(state="DRAIN", reason="r")) == {
        "state": ["DRAIN"],
        "reason": "r",
    }
    # Active features must move with the available ones (2031 otherwise).
    assert dialect.node_update_body(NodeUpdate(features=("a",))) == {
        "features": ["a"],
        "features_act": ["a"],
    }
    assert dialect.job_update_body(JobUpdate(comment="c", time_limit_minutes=3)) == {
        "comment": "c",
        "time_limit": {"set": True, "infinite": False, "number": 3},
    }
    body = dialect.reservation_body(
        ReservationSpec(name="m", nodes=("n1",), start_time=10, duration_minutes=5)
    )
    assert body["node_list"] == ["n1"]
    assert body["flags"] == ["MAINT", "IGNORE_JOBS"]


def test_unknown_request_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="tim_limit"):
        JobSpec.model_validate({"script": "x", "tim_limit": 5})


def test_jobs_unchanged_marker() -> None:
    assert Dialect.jobs_unchanged(0, None)
    assert not Dialect.jobs_unchanged(0, 1_700_000_000)  # no jobs, but a real reply
    assert not Dialect.jobs_unchanged(3, 1_700_000_000)


def test_a_job_layout_reads_gres_device_indices() -> None:
    """`GET /resources/{job_id}`'s node entry, as v0.0.45's schema gives it."""
    wire = {
        "node": "gpu07",
        "sockets_per_node": 2,
        "cores_per_socket": 32,
        "mem_alloc": 4096,
        "core_bitmap": "0-3",
        "channel": {"set": False, "infinite": False, "number": 0},
        "gres": [
            {"name": "gpu", "type": "h100", "count": 3, "index": "0-1,5"},
            {"name": "shard", "type": "", "count": 0, "index": ""},
        ],
    }
    layout = NodeLayout.model_validate(wire)
    assert layout.node == "gpu07"
    assert layout.mem_alloc == 4096
    gpu, shard = layout.gres
    assert (gpu.name, gpu.type, gpu.count, gpu.indices) == ("gpu", "h100", 3, (0, 1, 5))
    assert shard.indices == ()
