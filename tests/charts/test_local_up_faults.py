"""Faults a real pool meets, on the README's cluster (`sunk local up`: real
kubelets, the charts' pods from images/, Debian's Slurm 26.05), with the
charts' defaults; docs/reliability.md says what sunk promises for each.

The bed's nodes are host-side (each node's kubelet and containerd on this
machine, sharing its kernel and network): the faults here are those of
Slurm's and sunk's own processes and of Kubernetes objects, not of machines.
"""

from __future__ import annotations

import base64
import concurrent.futures
import itertools
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from plugins.local_cluster import kubectl, poll_ssh, ssh, summary, sunk, tenant_pod
from sunk.scheduler.request import ANNOTATION_JOB_ID
from sunk_testbed.charts import COMPUTE_POOL, NODE_POOL_LABEL

pytestmark = pytest.mark.e2e

NODES = ["local-1", "local-2", "local-3"]
SLURMCTLD = "slurm-slurmctld-0"


@pytest.fixture
def cluster(local_cluster: Path) -> Path:
    return local_cluster


def get_pod(cluster: Path, namespace: str, name: str) -> dict[str, Any]:
    proc = kubectl(cluster, "get", "pod", "-n", namespace, name, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    pod: dict[str, Any] = json.loads(proc.stdout)
    return pod


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))


def squeue(cluster: Path, job: str) -> str:
    """The job's state, nodes and start time (a requeued job starts anew),
    or "" while Slurm does not answer."""
    proc = sunk(cluster, "ssh", f"squeue -h -j {job} -o '%T %N %S'", timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def test_slurmctld_restarted_right_after_a_node_leaves_its_nodeset_ends_no_job_or_pod(
    cluster: Path,
) -> None:
    """A node taken out of the NodeSet (its pool label removed: the set's
    selector no longer matches it) is drained, its slurmd pod deleted and
    then its Slurm record; slurmctld is restarted the moment the record is
    gone (its pod deleted; the StatefulSet makes it again, its state on its
    volume). A batch job and a pod placed by sunk's scheduler on the other
    nodes run on: the same jobs on the same nodes, the pod neither restarted
    nor replaced, and no job started anew. (Slinky's slurm-bridge deleted
    every pod it had placed when slurmctld restarted after a node's
    deletion.) The node then rejoins idle when labelled again."""
    info = summary(cluster)
    batch = ssh(cluster, "sbatch --parsable -w compute-local-1 -t 10 --wrap 'sleep 600'").strip()
    pod_name = "fault-pod"
    body = tenant_pod(info, pod_name).to_dict()
    created = kubectl(cluster, "create", "-f", "-", input=json.dumps(body))
    assert created.returncode == 0, created.stderr
    leaving: str | None = None
    try:
        deadline = time.monotonic() + 120
        while (pod := get_pod(cluster, "default", pod_name))["status"].get("phase") != "Running":
            assert time.monotonic() < deadline, pod["status"]
            time.sleep(1)
        pod_job = pod["metadata"]["annotations"][ANNOTATION_JOB_ID]
        pod_node = pod["spec"]["nodeName"]
        poll_ssh(cluster, f"squeue -h -j {batch} -o %T", lambda out: "RUNNING" in out, 60, 0.5)
        before = {job: squeue(cluster, job) for job in (batch, pod_job)}
        assert [s.split()[:2] for s in before.values()] == [
            ["RUNNING", "compute-local-1"],
            ["RUNNING", f"compute-{pod_node}"],
        ], before
        leaving = next(n for n in reversed(NODES) if n not in ("local-1", pod_node))
        ctld = get_pod(cluster, "slurm", SLURMCTLD)

        label = kubectl(cluster, "label", "node", leaving, f"{NODE_POOL_LABEL}-")
        assert label.returncode == 0, label.stderr
        poll_ssh(
            cluster,
            f"scontrol show node compute-{leaving} 2>&1 || true",
            lambda out: "not found" in out,
            180,
            0.5,
        )
        deleted = kubectl(cluster, "delete", "pod", "-n", "slurm", SLURMCTLD, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        started = time.monotonic()
        deadline = started + 240
        while True:
            proc = kubectl(cluster, "get", "pod", "-n", "slurm", SLURMCTLD, "-o", "json")
            new = json.loads(proc.stdout) if proc.returncode == 0 else None
            replaced = new and new["metadata"]["uid"] != ctld["metadata"]["uid"] and ready(new)
            if replaced and sunk(cluster, "ssh", "squeue -h", timeout=60).returncode == 0:
                break
            assert time.monotonic() < deadline, "slurmctld did not serve again"
            time.sleep(1)
        print(f"slurmctld served again {time.monotonic() - started:.1f} s after its pod's deletion")
        # Until every slurmd has registered with the new slurmctld, and a
        # while after (a node it no longer knew would have its jobs killed).
        poll_ssh(
            cluster,
            "sinfo -h -N -o '%N %T'",
            lambda out: (
                len(out.split()) == 4 and set(out.split()[1::2]) <= {"idle", "mixed", "allocated"}
            ),
            120,
            1,
        )
        time.sleep(15)
        assert {job: squeue(cluster, job) for job in before} == before
        after = get_pod(cluster, "default", pod_name)
        assert after["metadata"]["uid"] == pod["metadata"]["uid"]
        assert after["status"]["phase"] == "Running"
        assert restarts(after) == 0, after["status"]
    finally:
        kubectl(cluster, "delete", "pod", "-n", "default", pod_name, "--wait=false")
        ssh(cluster, f"scancel {batch}")
        if leaving is not None:
            kubectl(cluster, "label", "node", leaving, f"{NODE_POOL_LABEL}={COMPUTE_POOL}")
    poll_ssh(
        cluster,
        "sinfo -h -N -o '%N %T'",
        lambda out: sorted(out.splitlines()) == [f"compute-{n} idle" for n in NODES],
        240,
        2,
    )


# sbatch, one after another for `seconds`: each line the time sbatch
# returned (epoch seconds) and the job id it printed, or "refused" and its error.
SBATCH_STREAM = r"""
end=$((SECONDS + {seconds}))
while [ $SECONDS -lt $end ]; do
  if id=$(sbatch --parsable -t 1 --wrap true 2>"$HOME/.sbatch-err"); then
    echo "$(date +%s.%N) ok ${{id%%;*}}"
  else
    echo "$(date +%s.%N) refused $(head -c 120 "$HOME/.sbatch-err" | tr '\n' ' ')"
  fi
  sleep 0.2
done
"""


def test_every_sbatch_that_printed_a_job_id_is_in_sacct_after_slurmctld_is_replaced(
    cluster: Path,
) -> None:
    """A researcher's stream of `sbatch` from the login pod while slurmctld's
    pod is deleted (as a `helm upgrade`, an eviction or a node drain does:
    SIGTERM, slurmctld saves its state and stops; the StatefulSet makes the
    pod again). Every `sbatch` that printed a job id has its job in `sacct`,
    each id once; those sent while slurmctld was away or stopping were
    refused, and sbatch said so. The longest time between two job ids is
    printed."""
    ctld = get_pod(cluster, "slurm", SLURMCTLD)
    stream = base64.b64encode(SBATCH_STREAM.format(seconds=60).encode()).decode()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        submitted = pool.submit(ssh, cluster, f"echo {stream} | base64 -d | bash", 180)
        time.sleep(15)
        deleted_at = time.time()
        deleted = kubectl(cluster, "delete", "pod", "-n", "slurm", SLURMCTLD, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        lines = [line.split(maxsplit=2) for line in submitted.result().splitlines()]
    assert get_pod(cluster, "slurm", SLURMCTLD)["metadata"]["uid"] != ctld["metadata"]["uid"]
    printed = [(float(at), rest) for at, word, rest in lines if word == "ok"]
    ids = [job for _, job in printed]
    assert len(set(ids)) == len(ids), f"a job id printed twice: {ids}"
    assert [at for at, _ in printed if at < deleted_at], lines
    assert [at for at, _ in printed if at > deleted_at], lines
    # Refused: no slurmctld to connect to, or the connection reset by the
    # one stopping.
    refused = [rest for _, word, rest in lines if word == "refused"]
    assert all("Batch job submission failed" in why for why in refused), refused
    times = [at for at, _ in printed]
    print(
        f"{len(ids)} job ids printed, {len(refused)} sbatch refused; the longest time"
        f" without a job id: {max(b - a for a, b in itertools.pairwise(times)):.1f} s"
    )
    poll_ssh(
        cluster,
        f"sacct -n -X -j {','.join(ids)} -o JobID,State",
        lambda out: (
            sorted(line.split()[0] for line in out.splitlines()) == sorted(ids)
            and {line.split()[1] for line in out.splitlines()} == {"COMPLETED"}
        ),
        180,
        2,
    )


BURST = 200


def scheduler_jobs(cluster: Path) -> list[tuple[str, str]]:
    """(job id, the pod's key in its comment) of every job of the tenant's
    that sunk's scheduler made for a pod of `default`."""
    out = ssh(cluster, "squeue -h -o '%i|%k'")
    found = []
    for line in out.splitlines():
        job, _, comment = line.partition("|")
        key = comment.split(" ", 1)[0]
        if key.startswith("sunk:default/"):
            found.append((job, key.removeprefix("sunk:default/")))
    return found


def test_slurmrestd_killed_during_a_burst_of_pods_leaves_one_job_per_pod(cluster: Path) -> None:
    """200 one-CPU pods for sunk's scheduler created at once (the bed's 3
    nodes hold 6), and slurmrestd killed (SIGKILL, its process on its node)
    while the scheduler submits their jobs; the kubelet starts it again.
    Once the burst settles, each pod has exactly one Slurm job (the pod's
    uid in its comment) and no job is left without a pod: no pod was
    submitted twice, none forgotten. Then the pods' deletion ends every job."""
    info = summary(cluster)
    names = [f"burst-{i:03d}" for i in range(BURST)]
    items = []
    for name in names:
        pod = tenant_pod(info, name).to_dict()
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
        items.append(pod)
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    restd = subprocess_pids("slurmrestd")
    assert len(restd) == 1, restd
    try:
        created = kubectl(cluster, "create", "-f", "-", input=body, timeout=120)
        assert created.returncode == 0, created.stderr
        deadline = time.monotonic() + 60
        while len(scheduler_jobs(cluster)) < 20:
            assert time.monotonic() < deadline, "the scheduler submitted no jobs"
            time.sleep(0.5)
        os.kill(restd[0], signal.SIGKILL)
        killed = time.monotonic()
        uids = {}
        deadline = time.monotonic() + 300
        while True:
            proc = kubectl(cluster, "get", "pods", "-n", "default", "-o", "json", timeout=120)
            pods = json.loads(proc.stdout)["items"] if proc.returncode == 0 else []
            uids = {p["metadata"]["uid"]: p["metadata"]["name"] for p in pods}
            jobs = scheduler_jobs(cluster)
            keys = [key for _, key in jobs]
            if len(jobs) == BURST and set(keys) == {u for u, n in uids.items() if n in names}:
                break
            assert time.monotonic() < deadline, (len(jobs), len(set(keys)), len(uids))
            time.sleep(2)
        print(f"{BURST} pods, one job each, {time.monotonic() - killed:.1f} s after the kill")
        assert subprocess_pids("slurmrestd") != restd
        # Settled: still one job per pod a while later.
        time.sleep(10)
        jobs = scheduler_jobs(cluster)
        assert sorted(key for _, key in jobs) == sorted(u for u, n in uids.items() if n in names)
    finally:
        kubectl(cluster, "delete", "pods", "-n", "default", *names, "--wait=false", timeout=120)
    poll_ssh(cluster, "squeue -h -o '%k'", lambda out: "sunk:default/" not in out, 300, 3)


def subprocess_pids(name: str) -> list[int]:
    """The pids of the processes on this machine (the bed's nodes share it)
    whose command is the program `name` (its thread names may differ)."""
    pattern = f"^([^ ]*/)?{name}( |$)"
    proc = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(pid) for pid in proc.stdout.split()]
