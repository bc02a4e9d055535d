"""The shared storage's manifests (sunk_testbed.storage), as built, without a bed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightkube import codecs

from sunk_testbed.images import Image
from sunk_testbed.nodeconf import NodePaths
from sunk_testbed.storage import (
    DRIVER,
    STORAGE_CLASS,
    StorageImages,
    manifests,
)

NODES = Path("/tmp/sunk-tb-x/nodes")


def built() -> list[dict[str, Any]]:
    image = Image("sunk/x", "0123", "sha256:00")
    return manifests(
        StorageImages(image, image, image, image),
        nodes_dir=NODES,
        data_dir=Path("/tmp/sunk-tb-x/shared-storage/seaweedfs"),
        access_key="AK",
        secret_key="SK",
    )


def one(kind: str) -> dict[str, Any]:
    (found,) = [m for m in built() if m["kind"] == kind]
    return found


def test_every_manifest_is_a_known_kind() -> None:
    for manifest in built():
        codecs.from_dict(manifest)


def test_the_node_plugin_finds_its_kubelets_directories_by_node_name() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    driver, registrar = pod["containers"]
    env = {e["name"]: e.get("value") for e in driver["env"]}
    kubelet = NodePaths(NODES / "$(NODE_NAME)").kubelet_dir
    assert env["PLUGIN_DIR"] == f"{kubelet}/plugins/{DRIVER}"
    assert f"--registration-dir={kubelet}/plugins_registry" in registrar["args"]
    assert "--csi-address=$(PLUGIN_DIR)/csi.sock" in registrar["args"]
    # kubelet's paths are the same inside, and the FUSE mounts flow back out.
    assert driver["volumeMounts"] == [
        {"name": "nodes", "mountPath": str(NODES), "mountPropagation": "Bidirectional"}
    ]
    assert pod["volumes"][0]["hostPath"]["path"] == str(NODES)
    assert driver["securityContext"] == {"privileged": True}


def test_the_class_hands_the_driver_its_login_at_each_step() -> None:
    storage_class = one("StorageClass")
    assert storage_class["metadata"]["name"] == STORAGE_CLASS
    assert "annotations" not in storage_class["metadata"]  # not the default class
    parameters = storage_class["parameters"]
    assert parameters["mounter"] == "s3fs"
    for step in ("provisioner", "node-stage", "node-publish"):
        assert parameters[f"csi.storage.k8s.io/{step}-secret-name"] == "csi-s3-secret"
    secrets = {m["metadata"]["name"]: m["stringData"] for m in built() if m["kind"] == "Secret"}
    assert secrets["csi-s3-secret"]["accessKeyID"] == "AK"
    identities = json.loads(secrets["seaweedfs-s3-config"]["s3.json"])["identities"]
    assert identities[0]["credentials"] == [{"accessKey": "AK", "secretKey": "SK"}]


def test_every_storage_pod_tolerates_every_taint() -> None:
    """On the bed every node is a Slurm node: sunk's node lock (NoExecute)
    must not evict SeaweedFS or the driver, or every home goes with them."""
    workloads = [m for m in built() if m["kind"] in ("Deployment", "DaemonSet")]
    assert len(workloads) == 3
    for workload in workloads:
        tolerations = workload["spec"]["template"]["spec"]["tolerations"]
        assert {"operator": "Exists"} in tolerations, workload["metadata"]["name"]
