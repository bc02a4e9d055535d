"""Slurm's topology from the nodes' labels, on the README's cluster (`sunk
local up`: real kubelets, the charts' pods from images/, Debian's Slurm
26.05). The bed's nodes join labelled `topology.kubernetes.io/zone` (local-1
and local-2 in zone-a, local-3 in zone-b) and the slurm chart asks for a
topology/tree on that label: sunk's operator writes topology.yaml into the
topology ConfigMap, the reconfigure sidecar applies it. A relabelled node
moves to its new switch, jobs asking `--switches=1` follow, and no pod
restarts. Beside the tree, blocks of two on the same label: a partition with
Topology=block keeps a job inside one block (docs/training.md, "Topology").
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from plugins.local_cluster import kubectl, poll_ssh, running_slurm_pods, ssh
from sunk.slurm.hostlist import expand

pytestmark = pytest.mark.e2e

ZONE = "topology.kubernetes.io/zone"
AT_UP = {"zone-a": "compute-local-[1-2]", "zone-b": "compute-local-3"}


@pytest.fixture
def cluster(local_cluster: Path) -> Path:
    return local_cluster


def _leaves(topology: str) -> dict[str, str]:
    """`scontrol show topology`: each leaf switch's nodes (a leaf has Level=0)."""
    leaves = {}
    for line in topology.splitlines():
        found = re.match(r"SwitchName=(\S+) Level=0 .*Nodes=(\S*)", line)
        if found:
            leaves[found[1]] = found[2]
    return leaves


def _wait_for_leaves(cluster: Path, wanted: dict[str, str], within: float = 90) -> float:
    """Seconds until slurmctld shows `wanted` (zone switches under the root).
    Asked in its own pod: the login pods' scontrol reads the file too, which
    their kubelet refreshes on its own schedule (up to a minute apart)."""
    started = time.monotonic()
    while True:
        proc = kubectl(
            cluster, "exec", "-n", "slurm", "slurm-slurmctld-0", "-c", "slurmctld", "--",
            "scontrol", "show", "topology",
        )  # fmt: skip
        if _leaves(proc.stdout) == wanted:
            return time.monotonic() - started
        assert time.monotonic() - started < within, f"after {within:.0f} s: {proc.stdout}"
        time.sleep(0.5)


def _label(cluster: Path, node: str, zone: str) -> None:
    proc = kubectl(cluster, "label", "node", node, f"{ZONE}={zone}", "--overwrite")
    assert proc.returncode == 0, proc.stderr


def _switches_1_job(cluster: Path) -> list[str]:
    """Where a 2-node job asking for one leaf switch runs."""
    out = ssh(cluster, "srun -N2 --switches=1 -t 1 hostname | sort", timeout=90)
    return out.split()


def _diagnosis(cluster: Path) -> str:
    """The topology ConfigMap and the operator's log."""
    configmap = kubectl(cluster, "get", "configmap", "-n", "slurm", "slurm-topology", "-o", "yaml")
    operator = kubectl(
        cluster, "logs", "-n", "slurm", "deploy/sunk-operator", "-c", "operator", "--tail=40"
    )
    return f"{configmap.stdout}{configmap.stderr}\n{operator.stdout}{operator.stderr}"


def test_a_relabelled_node_changes_switch_and_switches_1_jobs_follow(cluster: Path) -> None:
    before = running_slurm_pods(cluster)
    try:
        took = _wait_for_leaves(cluster, AT_UP)
        print(f"after up -> scontrol show topology: {took:.1f}s")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_diagnosis(cluster)}") from None
    assert _switches_1_job(cluster) == ["compute-local-1", "compute-local-2"]

    _label(cluster, "local-1", "zone-b")
    try:
        took = _wait_for_leaves(
            cluster, {"zone-a": "compute-local-2", "zone-b": "compute-local-[1,3]"}
        )
        print(f"relabel -> scontrol show topology: {took:.1f}s")
        assert _switches_1_job(cluster) == ["compute-local-1", "compute-local-3"]
    finally:
        _label(cluster, "local-1", "zone-a")
        took = _wait_for_leaves(cluster, AT_UP)
        print(f"relabel back -> scontrol show topology: {took:.1f}s")

    assert running_slurm_pods(cluster) == before  # nothing restarted, nothing replaced
    events = kubectl(
        cluster,
        "get", "events", "-n", "slurm",
        "--field-selector", "involvedObject.name=slurm-topology,reason=TopologyWritten",
        "-o", "jsonpath={.items[*].note}{.items[*].message}",
    )  # fmt: skip
    assert "3 node(s) placed" in events.stdout, events


def _scontrol(cluster: Path, *args: str) -> str:
    proc = kubectl(
        cluster, "exec", "-n", "slurm", "slurm-slurmctld-0", "-c", "slurmctld", "--",
        "scontrol", *args,
    )  # fmt: skip
    assert proc.returncode == 0, f"scontrol {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def test_a_job_of_a_block_partition_stays_inside_one_block(cluster: Path) -> None:
    """On 26.05 the bed's topology.yaml holds, beside the tree, a topology
    `block`: blocks of two on the zone label (zone-a: local-1 and local-2;
    zone-b: local-3 alone). A partition with Topology=block (made at run time,
    as an admin would, then removed) keeps a two-node job inside one block:
    with local-1 taken whole by another job it waits, though local-2 and local-3 are idle, and runs
    on zone-a's two nodes once local-1 is free."""
    _wait_for_leaves(cluster, AT_UP)
    _scontrol(cluster, "create", "PartitionName=blocks", "Nodes=ALL", "Topology=block")
    busy = blocked = ""
    try:
        busy = ssh(
            cluster, "sbatch --parsable --exclusive -w compute-local-1 --wrap 'sleep 300'"
        ).strip()
        poll_ssh(cluster, f"squeue -h -j {busy} -o %T", lambda out: out.strip() == "RUNNING", 60)
        blocked = ssh(cluster, "sbatch --parsable -p blocks -N2 -t 1 --wrap true").strip()
        time.sleep(5)  # slurmctld tries it at submission and on its scheduling passes
        state = ssh(cluster, f"squeue -h -j {blocked} -o '%T %r'").strip()
        assert state.startswith("PENDING"), state
        ssh(cluster, f"scancel {busy}")
        poll_ssh(
            cluster,
            f"sacct -n -X -P -j {blocked} -o State,NodeList",
            lambda out: out.strip().startswith("COMPLETED"),
            90,
        )
        ran = ssh(cluster, f"sacct -n -X -P -j {blocked} -o NodeList").strip()
        # In the order Slurm placed them (26.05 once wrote compute-local-[2,1]).
        assert sorted(expand(ran)) == ["compute-local-1", "compute-local-2"], ran
    finally:
        for job in (busy, blocked):
            if job:
                ssh(cluster, f"scancel {job} || true")
        poll_ssh(
            cluster,
            "squeue -h -p blocks -o %i 2>/dev/null || true",
            lambda out: not out.strip(),
            60,
        )
        _scontrol(cluster, "delete", "PartitionName=blocks")
