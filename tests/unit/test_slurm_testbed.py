"""The Slurm test bed's generated configuration, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import CONTROLLER_HOST, PARTITION, SlurmAccess, SlurmCluster


def conf(tmp_path: Path, **kwargs: object) -> dict[str, list[str]]:
    cluster = SlurmCluster(tmp_path, Supervisor(tmp_path), Path("/nonexistent"), **kwargs)  # type: ignore[arg-type]
    text = cluster._slurm_conf(6817, {n: 7000 + i for i, n in enumerate(cluster.node_names)})
    lines: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        lines.setdefault(key, []).append(value)
    return lines


def test_conf_names_the_sandbox_host_and_the_controller_address(tmp_path: Path) -> None:
    lines = conf(tmp_path, controller_address="10.77.0.1")
    assert lines["SlurmctldHost"] == [f"{CONTROLLER_HOST}(10.77.0.1)"]
    assert lines["SlurmctldPort"] == ["6817"]
    assert lines["AuthAltTypes"] == ["auth/jwt"]
    assert lines["AuthAltParameters"] == ["jwt_key=/etc/slurm/jwt_hs256.key"]
    assert lines["ProctrackType"] == ["proctrack/linuxproc"]
    assert lines["TaskPlugin"] == ["task/none"]
    assert lines["ReturnToService"] == ["2"]


def test_conf_has_static_nodes_with_own_ports_and_room_for_dynamic_ones(tmp_path: Path) -> None:
    lines = conf(tmp_path, nodes=2, max_node_count=64)
    assert [n.split()[0] for n in lines["NodeName"]] == ["tb1", "tb2"]
    assert "Port=7000" in lines["NodeName"][0].split()
    assert "Port=7001" in lines["NodeName"][1].split()
    assert lines["MaxNodeCount"] == ["64"]
    assert lines["NodeSet"] == ["dynamic Feature=dynamic"]
    [partition] = lines["PartitionName"]
    assert partition.startswith(f"{PARTITION} Nodes=tb1,tb2,dynamic Default=YES")


def test_conf_without_static_nodes(tmp_path: Path) -> None:
    lines = conf(tmp_path, nodes=0)
    assert "NodeName" not in lines
    assert lines["PartitionName"][0].startswith(f"{PARTITION} Nodes=dynamic ")


def test_extra_conf_comes_last(tmp_path: Path) -> None:
    text = SlurmCluster(
        tmp_path, Supervisor(tmp_path), Path("/x"), 1, ["MinJobAge=5", "# note"]
    )._slurm_conf(1, {"tb1": 2})
    assert text.splitlines()[-2:] == ["MinJobAge=5", "# note"]


def test_node_conf_adds_items_to_a_static_node_line(tmp_path: Path) -> None:
    lines = conf(tmp_path, nodes=2, node_conf={"tb2": "Gres=gpu:fake:2 Features=f"})
    assert lines["NodeName"][0].endswith("CPUs=2 State=UNKNOWN")
    assert lines["NodeName"][1].endswith("CPUs=2 Gres=gpu:fake:2 Features=f State=UNKNOWN")


def test_node_conf_refuses_nodes_the_bed_does_not_have(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\['tb3'\]"):
        SlurmCluster(tmp_path, Supervisor(tmp_path), Path("/x"), 2, node_conf={"tb3": "Weight=1"})


def test_access_round_trips_through_json(tmp_path: Path) -> None:
    access = SlurmAccess(
        restd_url="http://127.0.0.1:1",
        rootfs=tmp_path / "rootfs",
        conf_dir=tmp_path / "etc",
        jwt_key=tmp_path / "etc/jwt_hs256.key",
        nodes=["tb1"],
        cluster_name="c",
        slurm_version="24.11.5",
        slurmctld_port=2,
        munge_socket_dir=tmp_path / "run-munge",
        munge_key=tmp_path / "munge/munge.key",
    )
    assert SlurmAccess.from_json(access.to_json()) == access
