"""KubeControlPlane's bookkeeping, without starting any daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from sunk_testbed.control_plane import KubeAccess, KubeControlPlane, Ports
from sunk_testbed.procs import Supervisor


def test_ports_are_distinct() -> None:
    for _ in range(20):
        ports = Ports.allocate().all()
        assert len(set(ports)) == len(ports) == 5


def test_nothing_started_means_no_access(tmp_path: Path) -> None:
    assert KubeControlPlane(tmp_path, Supervisor(tmp_path)).access() is None


def test_issue_kubeconfig_needs_a_started_bed_and_keeps_its_own_names(tmp_path: Path) -> None:
    plane = KubeControlPlane(tmp_path, Supervisor(tmp_path))
    with pytest.raises(RuntimeError, match="start"):
        plane.issue_kubeconfig("node-1", "system:node:node-1", ["system:nodes"])
    for reserved in ("admin", "sunk-operator", "kube-scheduler"):
        with pytest.raises(ValueError, match="control plane"):
            plane.issue_kubeconfig(reserved, "someone", [])


def test_access_round_trips_through_json(tmp_path: Path) -> None:
    access = KubeAccess(
        server="https://127.0.0.1:1",
        ca_file=tmp_path / "ca.crt",
        admin_kubeconfig=tmp_path / "admin.kubeconfig",
        kubeconfigs={"admin": tmp_path / "admin.kubeconfig"},
    )
    assert KubeAccess.from_json(access.to_json()) == access
