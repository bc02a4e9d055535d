"""A NodeSet update in a maintenance window, as the charts deploy sunk's
operator: it acts in Slurm as its own user (`sunk-operator`, the slurm
chart's `admins`, with the token `sunk tokens` mints for it), not as root.

The operator's platform team schedules an update (here a new memory request
for slurmd, as after resizing it) into a window with `helm upgrade`, which
is how the slurm chart's NodeSets change. Before the window the nodes are
held in a Slurm reservation and nothing is drained, so a job that would run
across the window's start waits while a short one runs; in the window the
update rolls, and the reservation is gone when it is done.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.local_cluster import kubectl, ssh, upgrade_slurm
from sunk_testbed.bed import NAMESPACE
from sunk_testbed.charts import wait_until

pytestmark = pytest.mark.e2e

RESERVATION = f"sunk-update-{NAMESPACE}-compute"


def _slurmd_memory(cluster: Path) -> dict[str, str]:
    """Each running slurmd pod's memory request."""
    listed = kubectl(
        cluster, "get", "pods", "-n", NAMESPACE, "-l", "sunk.dev/nodeset=compute", "-o", "json"
    )
    assert listed.returncode == 0, listed.stderr
    requests = {}
    for pod in json.loads(listed.stdout)["items"]:
        if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running":
            continue
        (slurmd,) = [c for c in pod["spec"]["containers"] if c["name"] == "slurmd"]
        requests[pod["metadata"]["name"]] = slurmd["resources"]["requests"]["memory"]
    return requests


def _reservation(cluster: Path) -> str:
    out = ssh(cluster, f"scontrol show reservation {RESERVATION} 2>&1 || true")
    return out if "Flags=" in out else ""


def _states(cluster: Path) -> dict[str, str]:
    out = ssh(cluster, "sinfo -h -N -o '%N %T'")
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def _progressing(cluster: Path) -> str:
    out = kubectl(cluster, "get", "nodeset", "compute", "-n", NAMESPACE, "-o", "json")
    assert out.returncode == 0, out.stderr
    conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
    return next((c["message"] for c in conditions if c["type"] == "Progressing"), "")


def _operator_slurm_user(cluster: Path) -> str:
    """The Slurm user in the token the operator's pods mount (`sunk tokens` keeps it)."""
    out = kubectl(
        cluster, "get", "secret", "sunk-operator-token", "-n", NAMESPACE,
        "-o", "jsonpath={.data.token}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    payload = base64.b64decode(out.stdout).decode().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sun"])


async def _until(what: str, check: Callable[[], Any], within: float) -> Any:
    """`check()` (blocking: ssh, kubectl) every 2 s until truthy; that value."""
    try:
        return await wait_until(what, lambda: asyncio.to_thread(check), within, interval=2)
    except TimeoutError as late:
        raise AssertionError(str(late)) from None


@pytest.mark.timeout(1500)
async def test_an_update_in_a_window_is_reserved_as_sunk_operator_and_rolls_in_it(
    local_cluster: Path,
) -> None:
    cluster = local_cluster
    values = yaml.safe_load((cluster / "cluster" / "slurm-values.yaml").read_text())
    before = _slurmd_memory(cluster)
    nodes = sorted(_states(cluster))
    assert before
    assert nodes
    opens = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(
        seconds=110
    )
    windowed = copy.deepcopy(values)
    (nodeset,) = windowed["nodesets"]
    nodeset["podResources"] = {"requests": {"memory": "300Mi"}}
    nodeset["updateStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
        "maintenanceWindow": {"start": opens.strftime("%Y-%m-%dT%H:%M:%SZ"), "duration": "20m"},
    }
    long_job = ""
    try:
        started = time.monotonic()
        await asyncio.to_thread(upgrade_slurm, cluster, windowed, "slurm-values-window.yaml")
        assert _operator_slurm_user(cluster) == "sunk-operator"
        shown = await _until("the update's reservation", lambda: _reservation(cluster), 90)
        print(f"helm upgrade -> reservation made: {time.monotonic() - started:.1f}s")
        assert "MAINT" in shown, shown
        assert "IGNORE_JOBS" in shown, shown
        for node in nodes:
            assert node.split("-")[-1] in shown, (node, shown)
        assert "maintenance window" in _progressing(cluster)

        # A job that ends before the window runs; one with no time limit
        # (the partition's MaxTime is INFINITE) would run across it and waits.
        short = ssh(cluster, "sbatch --parsable -t 1 --wrap 'sleep 5'").strip()
        long_job = ssh(cluster, "sbatch --parsable --wrap 'sleep 600'").strip()

        def ran(job: str) -> bool:
            out = ssh(cluster, f"sacct -n -X -P -j {job} -o State")
            return out.strip() == "COMPLETED"

        await _until("the short job done", lambda: ran(short), 60)
        reason = ssh(cluster, f"squeue -h -j {long_job} -o '%T %r'").strip()
        assert reason.startswith("PENDING"), reason
        assert not [s for s in _states(cluster).values() if "drain" in s], _states(cluster)
        assert _slurmd_memory(cluster) == before, "a pod was replaced before the window"

        # In the window: every pod replaced, one at a time, the reservation gone.
        def rolled() -> bool:
            memory = _slurmd_memory(cluster)
            return len(memory) == len(before) and set(memory.values()) == {"300Mi"}

        await _until("the update rolled", rolled, 900)
        assert datetime.datetime.now(datetime.UTC) >= opens
        await _until("the reservation gone", lambda: not _reservation(cluster), 60)
        print(f"window open -> rolled, unreserved: {datetime.datetime.now(datetime.UTC) - opens}")
        await _until(
            "the held job running",
            lambda: ssh(cluster, f"squeue -h -j {long_job} -o %T").strip() == "RUNNING",
            120,
        )
    finally:
        if long_job:
            ssh(cluster, f"scancel {long_job}")
        # The window taken out, the new memory request kept and recorded as the
        # bed's values: no second roll (the pods' template is unchanged), and
        # the modules after this one upgrade from what the cluster now runs.
        kept = copy.deepcopy(values)
        kept["nodesets"][0]["podResources"] = nodeset["podResources"]
        await asyncio.to_thread(upgrade_slurm, cluster, kept, "slurm-values.yaml")
        await _until("every node idle", lambda: set(_states(cluster).values()) == {"idle"}, 900)
