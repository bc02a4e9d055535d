"""Rendered configs are accepted by a real slurmctld and slurmd, and mean what was asked.

Each test starts a private 4-node bed whose slurm.conf, gres.conf and
topology file are rendered by sunk_testbed.slurm_conf (the bed's `conf_writer`).
24.11 gets topology.conf (tree); 26.05 gets topology.yaml with a tree as the
cluster default and a block topology used by one partition.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugins.slurm import external_restd
from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import (
    CONTROLLER_HOST,
    SANDBOX_SETTINGS,
    ConfLayout,
    SlurmCluster,
    ensure_rootfs,
)
from sunk_testbed.slurm_conf import (
    Auth,
    ClusterSpec,
    Controller,
    GpuGroup,
    NamedTopology,
    NodeGroup,
    NodeSet,
    Partition,
    Preemption,
    Scheduler,
    TopologySettings,
    blocks_from_labels,
    node_gres,
    render_gres_conf,
    render_slurm_conf,
    render_topology_conf,
    render_topology_yaml,
    tree_from_labels,
)

pytestmark = pytest.mark.contract

NODES = ["tb1", "tb2", "tb3", "tb4"]
LABELS = {
    name: {"fabric": "f1", "leaf": f"l{i // 2}", "nvlink": f"d{i // 2}"}
    for i, name in enumerate(NODES)
}
# Device files that exist in every sandbox (the host's /dev): slurmd checks them.
GPUS = {name: [GpuGroup(type="fake", count=2, files="/dev/tty[0-1]")] for name in NODES[:2]}

# What the sandboxes need, as free-form settings (each checked against slurm.conf(5)).
BED_SETTINGS: dict[str, str | int] = {
    **SANDBOX_SETTINGS,
    "SlurmdTimeout": 30,
    "MessageTimeout": 5,
    "KillWait": 2,
}


def spec_for(layout: ConfLayout, suite: str) -> ClusterSpec:
    return ClusterSpec(
        cluster_name=layout.cluster_name,
        controllers=(Controller(name=layout.controller_host, address=layout.controller_address),),
        slurmctld_port=layout.slurmctld_port,
        auth=Auth(jwt_key=layout.jwt_key),
        slurmd_spool_dir="/var/spool/slurmd/%n",
        max_node_count=64,
        nodes=tuple(
            NodeGroup(
                names=name,
                address="127.0.0.1",
                hostname=CONTROLLER_HOST,
                port=layout.node_ports[name],
                cpus=2,
                features=("rendered",),
                gres=node_gres(GPUS.get(name, [])),
                state="UNKNOWN",
            )
            for name in NODES
        ),
        node_sets=(NodeSet(name="dynamic", feature="dynamic"),),
        partitions=(
            Partition(name="main", nodes=("tb[1-4]", "dynamic"), default=True),
            Partition(
                name="gpu",
                nodes=("tb[1-2]",),
                priority_tier=2,
                max_time="1-00:00:00",
                preempt_mode=("REQUEUE",),
                settings={"Topology": "blocks"} if suite == "sid" else {},
            ),
        ),
        scheduler=Scheduler(
            parameters=("sched_min_interval=0",), select_type_parameters=("CR_Core",)
        ),
        preemption=Preemption(type="preempt/partition_prio", mode=("REQUEUE",)),
        topology=TopologySettings(plugin="topology/tree") if suite == "trixie" else None,
        settings=BED_SETTINGS,
    )


def etc_files(suite: str) -> dict[str, str]:
    tree = tree_from_labels(LABELS, ["fabric", "leaf"])
    files = {"gres.conf": render_gres_conf(GPUS)}
    if suite == "trixie":
        files["topology.conf"] = render_topology_conf(tree)
    else:
        blocks = blocks_from_labels(LABELS, "nvlink", [2, 4])
        files["topology.yaml"] = render_topology_yaml(
            [NamedTopology("tree", tree, cluster_default=True), NamedTopology("blocks", blocks)]
        )
    return files


@pytest.fixture(params=["trixie", "sid"])
def rendered_bed(request: pytest.FixtureRequest, testbed_external: bool) -> Iterator[SlurmCluster]:
    suite: str = request.param
    if testbed_external or external_restd() is not None:
        pytest.skip("starts beds of its own")
    try:
        rootfs = ensure_rootfs(suite)
    except RuntimeError as exc:
        pytest.skip(f"Debian {suite}'s Slurm is not available: {exc}")
    state = Path(tempfile.mkdtemp(prefix="sunk-cf-", dir="/tmp"))
    cluster = SlurmCluster(
        state,
        Supervisor(state),
        rootfs,
        nodes=len(NODES),
        conf_writer=lambda layout: render_slurm_conf(spec_for(layout, suite)),
        etc_files=etc_files(suite),
    )
    try:
        cluster.start()  # fails unless slurmctld, every slurmd and slurmrestd accept them
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


def test_slurm_accepts_and_applies_the_rendered_configs(rendered_bed: SlurmCluster) -> None:
    run = rendered_bed.run
    suite = "sid" if rendered_bed.rootfs.name == "sid" else "trixie"
    sinfo = run(["sinfo", "-h", "-N", "-o", "%N %P %t %f %G"]).stdout.split("\n")
    rows = {tuple(line.split()) for line in sinfo if line}
    for name in NODES:
        gres = "gpu:fake:2" if name in GPUS else "(null)"
        assert (name, "main*", "idle", "rendered", gres) in rows
    assert ("tb1", "gpu", "idle", "rendered", "gpu:fake:2") in rows

    topology = run(["scontrol", "show", "topology"]).stdout
    assert "SwitchName=f1.l0 " in topology
    assert "Nodes=tb[1-2]" in topology
    assert "Switches=f1.l0,f1.l1" in topology

    config = run(["scontrol", "show", "config"]).stdout
    assert any(
        line.split() == ["PreemptType", "=", "preempt/partition_prio"]
        for line in config.splitlines()
    )
    partition = run(["scontrol", "show", "partition", "gpu"]).stdout
    assert "PriorityTier=2" in partition
    assert "MaxTime=1-00:00:00" in partition
    if suite == "sid":
        assert "Topology=blocks" in partition
    # A job asking for the GRES lands on a node that has it.
    job = run(["srun", "-p", "gpu", "--gres=gpu:fake:1", "hostname"], timeout=30)
    assert job.returncode == 0
