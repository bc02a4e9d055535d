"""What sunk relies on from slurmrestd, pinned against a real one.

Raw HTTP on purpose: these tests document the server, not our client. They
run against the test bed's Slurm (24.11 from Debian trixie), or against any
slurmrestd named by SUNK_SLURMRESTD_URL + SUNK_SLURM_TOKEN (a root token);
tests that drain nodes or need the bed's CLI or keys are skipped then.

Where the server misbehaves (the update_time 500, errors inside 200 replies,
511 for bad tokens) the test pins what it really does, so a Slurm upgrade
that changes it fails here first.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import jwt
import pytest

from plugins.slurm import SlurmCli, external_restd
from sunk_testbed.slurm_cluster import CONTROLLER_HOST, PARTITION, SlurmAccess, SlurmCluster

pytestmark = pytest.mark.contract

API = "/slurm/v0.0.42"
NOT_FOUND_JOB = 2017  # ESLURM_INVALID_JOB_ID
ALREADY_DONE = 2021  # ESLURM_ALREADY_DONE
INVALID_USER = 2010  # ESLURM_USER_ID_MISSING: "Invalid user id"
INVALID_NODE_STATE = 2028  # ESLURM_INVALID_NODE_STATE
AUTH_ERROR = 1007  # SLURM_PROTOCOL_AUTHENTICATION_ERROR


def auth(user: str, token: str) -> dict[str, str]:
    return {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}


@pytest.fixture(scope="module")
def rest(slurmrestd_url: str, slurm_token: str) -> Iterator[httpx2.Client]:
    """A client authenticated as root."""
    with httpx2.Client(
        base_url=slurmrestd_url, headers=auth("root", slurm_token), timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def release(rest: httpx2.Client) -> str:
    """The server's Slurm release, e.g. "24.11.5"."""
    meta = rest.get(f"{API}/ping/").json()["meta"]
    return str(meta["slurm"]["release"])


@pytest.fixture
def bed(request: pytest.FixtureRequest) -> SlurmAccess | None:
    """The test bed's access, or None when the tests run against an outside slurmrestd."""
    if external_restd() is not None:
        return None
    access: SlurmAccess = request.getfixturevalue("slurm_access")
    return access


def errors(reply: httpx2.Response) -> list[dict[str, Any]]:
    return list(reply.json().get("errors", []))


def node(rest: httpx2.Client, name: str) -> dict[str, Any]:
    reply = rest.get(f"{API}/node/{name}")
    assert reply.status_code == 200, reply.text
    nodes: list[dict[str, Any]] = reply.json()["nodes"]
    assert [n["name"] for n in nodes] == [name]
    return nodes[0]


def wait_for(what: str, check: Any, timeout: float = 15.0) -> Any:
    """Poll `check()` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        if result := check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def resumed_after(cli: SlurmCli, name: str) -> Iterator[None]:
    """Whatever a test does to `name`, leave it undrained and responding."""
    try:
        yield
    finally:
        cli(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
        wait_for(
            f"{name} idle again",
            lambda: cli(["sinfo", "-h", "-n", name, "-o", "%t"]).stdout.strip() == "idle",
        )


def job_script(body: str) -> dict[str, Any]:
    """A v0.0.42 submit body; without cwd and environment the submit fails (see below)."""
    return {
        "job": {
            "name": f"sunk-contract-{uuid.uuid4().hex[:6]}",
            "partition": PARTITION,
            "nodes": "1",
            "tasks": 1,
            "time_limit": {"set": True, "number": 5},
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            "standard_output": "/tmp/sunk-contract-%j.out",
            "script": f"#!/bin/sh\n{body}\n",
        }
    }


# -- discovery ---------------------------------------------------------------


def test_openapi_document_lists_the_data_parsers(
    rest: httpx2.Client, slurmrestd_url: str, release: str
) -> None:
    # Like every path, the document itself needs the auth headers.
    anonymous = httpx2.get(f"{slurmrestd_url}/openapi/v3", timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.text.strip() == "Authentication failure"

    reply = rest.get("/openapi/v3")
    assert reply.status_code == 200
    doc = reply.json()
    versions = {
        m.group(1) for path in doc["paths"] if (m := re.match(r"/slurm/(v\d+\.\d+\.\d+)/", path))
    }
    assert "v0.0.42" in versions
    if release.startswith("24.11."):
        assert versions == {"v0.0.40", "v0.0.41", "v0.0.42"}
        # Limited to openapi/slurmctld (no slurmdbd): no /slurmdb paths.
        assert not [p for p in doc["paths"] if p.startswith("/slurmdb/")]
        assert doc["info"]["version"] == f"Slurm-{release}&openapi/slurmctld"
    for path in ("ping/", "nodes/", "node/{node_name}", "job/submit", "job/{job_id}", "jobs/"):
        assert f"{API}/{path}" in doc["paths"]


def test_ping(rest: httpx2.Client) -> None:
    reply = rest.get(f"{API}/ping/")
    assert reply.status_code == 200
    body = reply.json()
    assert body["errors"] == []
    [ping] = [p for p in body["pings"] if p["primary"]]
    assert ping["pinged"] == "UP"
    assert ping["responding"] is True
    assert body["meta"]["plugin"]["data_parser"] == "data_parser/v0.0.42"
    assert re.fullmatch(r"\d+\.\d+\.\d+", body["meta"]["slurm"]["release"])


# -- nodes -------------------------------------------------------------------


def test_list_nodes(rest: httpx2.Client, bed: SlurmAccess | None) -> None:
    reply = rest.get(f"{API}/nodes/")
    assert reply.status_code == 200
    body = reply.json()
    assert body["errors"] == []
    assert body["last_update"]["set"] is True
    nodes = {n["name"]: n for n in body["nodes"]}
    assert nodes
    for n in nodes.values():
        # State is a list: a base state plus flags (["IDLE", "DRAIN"]).
        assert isinstance(n["state"], list)
        assert n["state"]
    if bed is not None:
        assert set(bed.nodes) <= set(nodes)
        for name in bed.nodes:
            assert nodes[name]["partitions"] == [PARTITION]
            assert nodes[name]["address"] == "127.0.0.1"
            assert nodes[name]["hostname"] == CONTROLLER_HOST


def test_nodes_unchanged_since_update_time_is_304(rest: httpx2.Client) -> None:
    # Another change (a job of an earlier test ending) can slip in between
    # the two requests; then the reply is 200 (or the 500 below): try again.
    for _ in range(5):
        full = rest.get(f"{API}/nodes/")
        assert full.status_code == 200
        since = full.json()["last_update"]["number"]
        reply = rest.get(f"{API}/nodes/", params={"update_time": since})
        if reply.status_code == 304:
            assert reply.content == b""
            return
        time.sleep(1)
    raise AssertionError(f"never 304; last reply {reply.status_code}: {reply.text[:500]}")


def test_nodes_update_time_after_a_drain(
    rest: httpx2.Client, slurm_cli: SlurmCli, slurm_access: SlurmAccess, release: str
) -> None:
    """Known 24.11 defect: nodes changed, partitions did not -> 500, not the nodes.

    An incremental poller must fall back to a full read when it sees this.
    """
    name = slurm_access.nodes[-1]
    since = rest.get(f"{API}/nodes/").json()["last_update"]["number"]
    time.sleep(1.1)  # timestamps have 1 s resolution; the change must come after `since`
    with resumed_after(slurm_cli, name):
        drained = rest.post(f"{API}/node/{name}", json={"state": ["DRAIN"], "reason": "poll"})
        assert drained.status_code == 200, drained.text
        reply = rest.get(f"{API}/nodes/", params={"update_time": since})
        if release.startswith("24.11."):
            assert reply.status_code == 500
            assert [e["description"] for e in errors(reply)] == ["Unable to query partitions"]
            # Not transient: the same request keeps failing.
            again = rest.get(f"{API}/nodes/", params={"update_time": since})
            assert again.status_code == 500
        else:  # fixed upstream: the changed nodes come back
            assert reply.status_code == 200, reply.text
            assert name in {n["name"] for n in reply.json()["nodes"]}


def test_update_time_only_works_on_v0_0_42(rest: httpx2.Client, release: str) -> None:
    since = rest.get(f"{API}/nodes/").json()["last_update"]["number"]
    reply = rest.get("/slurm/v0.0.41/nodes/", params={"update_time": since})
    if release.startswith("24.11."):
        assert reply.status_code == 500
        assert "Parsing of" in errors(reply)[0]["description"]


def test_drain_and_resume(
    rest: httpx2.Client, slurm_cli: SlurmCli, slurm_access: SlurmAccess
) -> None:
    name = slurm_access.nodes[1 % len(slurm_access.nodes)]
    reason = f"sunk contract {uuid.uuid4().hex[:6]}"
    with resumed_after(slurm_cli, name):
        reply = rest.post(f"{API}/node/{name}", json={"state": ["DRAIN"], "reason": reason})
        # Success is 200 with an empty error list; failures are 500 (see below).
        assert reply.status_code == 200, reply.text
        assert errors(reply) == []

        drained = node(rest, name)
        assert "DRAIN" in drained["state"]
        assert drained["reason"] == reason
        assert drained["reason_set_by_user"] == "root"
        shown = slurm_cli(["scontrol", "show", "node", name]).stdout
        assert re.search(r"State=\S*DRAIN", shown)
        assert f"Reason={reason} [root@" in shown

        reply = rest.post(f"{API}/node/{name}", json={"state": ["RESUME"]})
        assert reply.status_code == 200, reply.text
        assert errors(reply) == []
        # After RESUME the node shows NOT_RESPONDING briefly, then IDLE.
        resumed = wait_for(
            f"{name} IDLE", lambda: (n := node(rest, name))["state"] == ["IDLE"] and n
        )
        # The reason outlives RESUME (REST and CLI alike): "drained" is the
        # DRAIN flag, never a non-empty reason.
        assert resumed["reason"] == reason
        shown = slurm_cli(["scontrol", "show", "node", name]).stdout
        assert re.search(r"State=IDLE\s", shown)

        # RESUME of a node that is not drained is an error, not a no-op.
        again = rest.post(f"{API}/node/{name}", json={"state": ["RESUME"]})
        assert again.status_code == 500
        assert [e["error_number"] for e in errors(again)] == [INVALID_NODE_STATE]


def test_plain_user_cannot_drain(
    slurm_cluster: SlurmCluster, slurm_access: SlurmAccess, rest: httpx2.Client
) -> None:
    user = slurm_access.plain_user
    name = slurm_access.nodes[0]
    token = slurm_cluster.token(user, lifetime=60)
    with httpx2.Client(
        base_url=slurm_access.restd_url, headers=auth(user, token), timeout=30
    ) as client:
        assert client.get(f"{API}/nodes/").status_code == 200  # reading is fine
        reply = client.post(f"{API}/node/{name}", json={"state": ["DRAIN"], "reason": "no"})
    assert reply.status_code == 500
    assert [e["error_number"] for e in errors(reply)] == [INVALID_USER]
    assert "DRAIN" not in node(rest, name)["state"]


# -- jobs --------------------------------------------------------------------


def test_submit_and_cancel(rest: httpx2.Client) -> None:
    reply = rest.post(f"{API}/job/submit", json=job_script("sleep 300"))
    assert reply.status_code == 200, reply.text
    assert errors(reply) == []
    job_id = reply.json()["job_id"]
    assert isinstance(job_id, int)
    assert job_id > 0

    [job] = rest.get(f"{API}/job/{job_id}").json()["jobs"]
    assert job["job_id"] == job_id
    assert job["job_state"][0] in {"PENDING", "RUNNING"}

    cancelled = rest.delete(f"{API}/job/{job_id}")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == []
    [job] = rest.get(f"{API}/job/{job_id}").json()["jobs"]
    assert job["job_state"][0] == "CANCELLED"  # possibly with COMPLETING still

    # A second cancel is "already done", again only inside a 200 reply.
    again = rest.delete(f"{API}/job/{job_id}")
    assert again.status_code == 200
    codes = [s["error"]["code"] for s in again.json()["status"]]
    assert codes in ([ALREADY_DONE], [])


def test_cancel_unknown_job_is_200_with_error_inside(rest: httpx2.Client) -> None:
    reply = rest.delete(f"{API}/job/999999")
    assert reply.status_code == 200
    [status] = reply.json()["status"]
    assert status["error"]["code"] == NOT_FOUND_JOB
    assert status["error"]["string"] == "Invalid job id specified"
    # Reading it, unlike cancelling it, is a 404.
    assert rest.get(f"{API}/job/999999").status_code == 404
    # An id no job can have (>= 0x3ffffff, Slurm's MAX_JOB_ID) is refused
    # before slurmctld is asked: 404, same code, in the top-level errors.
    out_of_range = rest.delete(f"{API}/job/987654321")
    assert out_of_range.status_code == 404
    assert [e["error_number"] for e in errors(out_of_range)] == [NOT_FOUND_JOB]


def test_submit_needs_cwd_and_environment(rest: httpx2.Client) -> None:
    body = job_script("true")
    del body["job"]["current_working_directory"]
    reply = rest.post(f"{API}/job/submit", json=body)
    assert reply.status_code == 500
    assert [e["error_number"] for e in errors(reply)] == [2063]  # ESLURM_MISSING_WORK_DIR

    body = job_script("true")
    del body["job"]["environment"]
    reply = rest.post(f"{API}/job/submit", json=body)
    assert reply.status_code == 500
    assert [e["error_number"] for e in errors(reply)] == [2019]  # ESLURM_WRITING_TO_FILE


def test_rest_job_runs_to_completion(
    rest: httpx2.Client, bed: SlurmAccess | None, request: pytest.FixtureRequest
) -> None:
    reply = rest.post(f"{API}/job/submit", json=job_script("hostname; id -un"))
    assert reply.status_code == 200, reply.text
    job_id = reply.json()["job_id"]

    def finished() -> dict[str, Any] | None:
        got = rest.get(f"{API}/job/{job_id}")
        if got.status_code == 404:  # purged already (MinJobAge): done, but unseen
            return {"job_state": ["COMPLETED"], "exit_code": None}
        [job] = got.json()["jobs"]
        # COMPLETED+COMPLETING: the epilog still runs; finished means neither.
        states = set(job["job_state"])
        return job if not states & {"PENDING", "RUNNING", "COMPLETING"} else None

    job = wait_for(f"job {job_id} to finish", finished, timeout=30)
    assert job["job_state"] == ["COMPLETED"]
    if job["exit_code"] is not None:
        assert job["exit_code"]["status"] == ["SUCCESS"]
        assert job["exit_code"]["return_code"]["number"] == 0
    if bed is not None:
        assert job["nodes"] in bed.nodes
        cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
        output = (cluster.tmp / f"sunk-contract-{job_id}.out").read_text()
        assert output.split() == [CONTROLLER_HOST, "root"]


def test_cli_job_runs_as_plain_user(slurm_cli: SlurmCli, slurm_access: SlurmAccess) -> None:
    user = slurm_access.plain_user
    done = slurm_cli(["srun", "-N1", "sh", "-c", "id -un; hostname; sleep 0.1"], user=user)
    assert done.stdout.split() == [user, CONTROLLER_HOST]


# -- authentication ----------------------------------------------------------


def test_missing_token_is_401(slurmrestd_url: str) -> None:
    for headers in ({}, {"X-SLURM-USER-NAME": "root"}):
        reply = httpx2.get(f"{slurmrestd_url}{API}/nodes/", headers=headers, timeout=30)
        assert reply.status_code == 401
        assert reply.text.strip() == "Authentication failure"


def test_token_with_a_wrong_key_is_511(slurmrestd_url: str) -> None:
    now = int(time.time())
    forged = jwt.encode({"iat": now, "exp": now + 300, "sun": "root"}, b"x" * 32, "HS256")
    headers = auth("root", forged)
    reply = httpx2.get(f"{slurmrestd_url}{API}/nodes/", headers=headers, timeout=30)
    # slurmrestd passes tokens through; slurmctld rejects them, which comes
    # back as 511 (Network Authentication Required), not 401.
    assert reply.status_code == 511
    assert [e["error_number"] for e in errors(reply)] == [AUTH_ERROR]
    # A trap for health checks: ping does not fail, it reports the controller DOWN.
    ping = httpx2.get(f"{slurmrestd_url}{API}/ping/", headers=headers, timeout=30)
    assert ping.status_code == 200
    assert ping.json()["pings"][0]["pinged"] == "DOWN"


def test_expired_token_is_511_and_a_self_signed_one_works(
    slurmrestd_url: str, slurm_access: SlurmAccess
) -> None:
    key = slurm_access.jwt_key.read_bytes()
    now = int(time.time())
    expired = jwt.encode({"iat": now - 120, "exp": now - 60, "sun": "root"}, key, "HS256")
    reply = httpx2.get(f"{slurmrestd_url}{API}/nodes/", headers=auth("root", expired), timeout=30)
    assert reply.status_code == 511
    assert [e["error_number"] for e in errors(reply)] == [AUTH_ERROR]

    # The same claims `scontrol token` puts in (iat, exp, sun), signed with the
    # cluster's key by us: accepted. sunk can mint its own tokens this way.
    valid = jwt.encode({"iat": now, "exp": now + 60, "sun": "root"}, key, "HS256")
    reply = httpx2.get(f"{slurmrestd_url}{API}/nodes/", headers=auth("root", valid), timeout=30)
    assert reply.status_code == 200


def test_user_name_header_and_token_user(
    slurm_cluster: SlurmCluster, slurm_access: SlurmAccess, slurm_token: str
) -> None:
    url = f"{slurm_access.restd_url}{API}/nodes/"
    # The token alone is enough: its `sun` claim names the user.
    assert httpx2.get(url, headers={"X-SLURM-USER-TOKEN": slurm_token}).status_code == 200
    # A root token may act as another user (impersonation) ...
    as_user = auth(slurm_access.plain_user, slurm_token)
    assert httpx2.get(url, headers=as_user).status_code == 200
    # ... a plain user's token may not act as root.
    user_token = slurm_cluster.token(slurm_access.plain_user, lifetime=60)
    reply = httpx2.get(url, headers=auth("root", user_token))
    assert reply.status_code == 511
    assert [e["error_number"] for e in errors(reply)] == [AUTH_ERROR]
