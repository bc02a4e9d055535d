"""Shared storage for the test bed: ReadWriteMany volumes from a real
filesystem through a real CSI driver, provisioned from a StorageClass.

SeaweedFS (`weed server`: master, volume server, filer and S3 gateway in one
pod) holds the data; the S3 CSI driver of github.com/yandex-cloud/k8s-csi-s3
(`s3driver`, driver name `ru.yandex.s3.csi`) makes one bucket per volume and
mounts it on each node with Debian's `s3fs` (FUSE), once per node, bind-mounted
into each pod; Kubernetes' `csi-provisioner` sidecar turns PVCs of the class
into volumes; `csi-registrar` (testbed/storage/csi-registrar) registers the
driver with each node's kubelet. Why these, and their limits: docs/testbed.md,
"Shared storage".

Everything is built here (testbed/storage/build.sh, from the Go module proxy)
and installed on a running bed by `install_shared_storage`, as plain manifests
built by the pure functions below.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sunk_testbed.charts import wait_until
from sunk_testbed.control_plane import build_log, build_once
from sunk_testbed.images import Image, ImageSpec, ensure_extra_images
from sunk_testbed.nodeconf import NodePaths
from sunk_testbed.nodes import KubeletNodes
from sunk_testbed.paths import SCRIPTS, cache_dir

Log = Callable[[str], None]

DRIVER = "ru.yandex.s3.csi"
STORAGE_CLASS = "shared"
NAMESPACE = "sunk-storage"
SEAWEEDFS = "seaweedfs"
CONTROLLER = "csi-s3-controller"
NODE = "csi-s3-node"
CONTROLLER_ACCOUNT = "csi-s3-provisioner"
NODE_ACCOUNT = "csi-s3-node"
S3_CONFIG = "seaweedfs-s3-config"  # SeaweedFS's identities
DRIVER_LOGIN = "csi-s3-secret"  # the same login, as the driver reads it
S3_PORT = 8333

SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
CSI_S3_VERSION = "v0.43.7"
PROVISIONER_VERSION = "v5.3.0"
# Bumped whenever testbed/storage/ (build.sh, the patch, the registrar) changes what it makes.
STORAGE_BUILD_REVISION = 3

BINARIES = ("weed", "s3driver", "csi-provisioner", "csi-registrar")


def storage_binaries_dir() -> Path:
    """Keyed by every version and the build's revision."""
    versions = {"seaweedfs": SEAWEEDFS_VERSION, "csi-s3": CSI_S3_VERSION}
    versions["provisioner"] = PROVISIONER_VERSION
    key = "-".join(f"{part}-{version}" for part, version in versions.items())
    return cache_dir() / "storage" / f"{key}-r{STORAGE_BUILD_REVISION}"


def ensure_storage_binaries(log: Log) -> Path:
    """Build weed, s3driver, csi-provisioner and csi-registrar unless cached."""
    out = storage_binaries_dir()
    if not (out / ".complete").exists():
        log(f"building the shared storage into {out} (log: {build_log(out)})")
        versions = (SEAWEEDFS_VERSION, CSI_S3_VERSION, PROVISIONER_VERSION)
        build_once(out, [str(SCRIPTS / "storage" / "build.sh"), str(out), *versions], "storage")
        log("shared storage binaries built")
    return out


# ------------------------------------------------------------------- images


@dataclass(frozen=True)
class StorageImages:
    seaweedfs: Image  # weed, FROM scratch
    csi_s3: Image  # s3driver and s3fs, on Debian
    provisioner: Image  # csi-provisioner, FROM scratch
    registrar: Image  # csi-registrar, FROM scratch


def image_specs(bin_dir: Path) -> list[ImageSpec]:
    """How each image is made from the binaries in `bin_dir`."""

    def binary(key: str, name: str) -> ImageSpec:
        # Root: the sidecars use the driver's root-owned sockets and kubelet's directories.
        return ImageSpec(key, f"sunk/{name}", "binary", (bin_dir / name,), entrypoint=f"/{name}")

    return [
        binary("seaweedfs", "weed"),
        binary("provisioner", "csi-provisioner"),
        binary("registrar", "csi-registrar"),
        ImageSpec(
            "csi_s3",
            "sunk/csi-s3",
            "dockerfile",
            (bin_dir / "s3driver",),
            Path("testbed/images/csi-s3/Dockerfile"),
        ),
    ]


def ensure_storage_images(log: Log) -> StorageImages:
    """The binaries built and their images pushed to the cache's registry (seconds when cached)."""
    bin_dir = ensure_storage_binaries(log)
    return StorageImages(**ensure_extra_images(image_specs(bin_dir), log))


# ---------------------------------------------------------------- manifests


def s3_identities(access_key: str, secret_key: str) -> dict[str, Any]:
    """SeaweedFS's S3 configuration: one identity, the CSI driver's."""
    actions = ["Admin", "Read", "List", "Tagging", "Write"]
    credentials = [{"accessKey": access_key, "secretKey": secret_key}]
    return {"identities": [{"name": "csi", "credentials": credentials, "actions": actions}]}


def _labels(app: str) -> dict[str, Any]:
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "sunk-shared-storage"}


def _meta(name: str, app: str, namespace: str | None = NAMESPACE) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(app)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _workload(kind: str, name: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": _labels(name)},
        "template": {"metadata": {"labels": _labels(name)}, "spec": pod_spec},
    }
    if kind == "Deployment":
        spec |= {"replicas": 1, "strategy": {"type": "Recreate"}}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": _meta(name, name), "spec": spec}


def _node_name_env() -> dict[str, Any]:
    return {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def seaweedfs_manifests(
    image: Image, data_dir: Path, node: str | None = None
) -> list[dict[str, Any]]:
    """SeaweedFS in one pod (master, volume server, filer, S3 gateway), its
    data in `data_dir` on the bed's disk (every node sees the same path, so
    the pod may move), and its S3 Service. `node`: the one node it runs on
    (the storage server of a cluster is a machine no test powers off)."""
    args = [
        "server",
        "-dir=/data",
        # The master hands out the volume server's address: the pod's own
        # filer and S3 gateway are its only clients.
        "-ip=127.0.0.1",
        "-ip.bind=0.0.0.0",
        # Each bucket is a collection with volumes of its own: many small ones.
        "-master.volumeSizeLimitMB=64",
        "-volume.max=200",
        "-s3",
        f"-s3.port={S3_PORT}",
        "-s3.config=/etc/seaweedfs/s3.json",
    ]
    container = {
        "name": "weed",
        "image": image.ref,
        "args": args,
        "ports": [{"name": "s3", "containerPort": S3_PORT}],
        "readinessProbe": {
            "tcpSocket": {"port": S3_PORT},
            "periodSeconds": 2,
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "config", "mountPath": "/etc/seaweedfs", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 (a scratch image has no /tmp)
        ],
    }
    pod = {
        "terminationGracePeriodSeconds": 10,
        # Storage stays put whatever taints a node: on the bed every node is a
        # Slurm node, and sunk's node lock (NoExecute) would evict it, and
        # with it every home (a cluster runs its storage on nodes of its own).
        "tolerations": [{"operator": "Exists"}],
        **_on(node),
        "containers": [container],
        "volumes": [
            {"name": "data", "hostPath": {"path": str(data_dir), "type": "DirectoryOrCreate"}},
            {"name": "config", "secret": {"secretName": S3_CONFIG}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(SEAWEEDFS, SEAWEEDFS),
        "spec": {
            "selector": _labels(SEAWEEDFS),
            "ports": [{"name": "s3", "port": S3_PORT, "targetPort": S3_PORT}],
        },
    }
    return [_workload("Deployment", SEAWEEDFS, pod), service]


def _on(node: str | None) -> dict[str, Any]:
    return {"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}


def csi_manifests(
    images: StorageImages, nodes_dir: Path, controller_node: str | None = None
) -> list[dict[str, Any]]:
    """The driver: its controller (csi-provisioner beside s3driver), its node
    plugin on every node (s3driver beside csi-registrar), the CSIDriver, and
    the RBAC the provisioner needs.

    Each node's kubelet has its own root (`<nodes_dir>/<node>/kubelet`), so
    the node plugin takes `nodes_dir` and finds its node's directories by
    `$(NODE_NAME)`: the driver's socket in `plugins/<driver>/`, the
    registrar's in `plugins_registry/`; kubelet passes staging and target
    paths below the same root, at the same path in the container, where the
    driver's FUSE mounts reach kubelet by Bidirectional propagation.
    """
    kubelet = NodePaths(nodes_dir / "$(NODE_NAME)").kubelet_dir
    plugin_dir = kubelet / "plugins" / DRIVER
    node_env = [_node_name_env(), {"name": "PLUGIN_DIR", "value": str(plugin_dir)}]
    nodes_mount = {"name": "nodes", "mountPath": str(nodes_dir)}
    driver_args = ["--nodeid=$(NODE_NAME)", "--v=4"]
    node_plugin = {
        "serviceAccountName": NODE_ACCOUNT,
        "terminationGracePeriodSeconds": 5,
        # Every node, tainted or not: a pod anywhere may mount the class.
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "csi-s3",
                "image": images.csi_s3.ref,
                # kubelet makes plugins/, not the driver's directory in it.
                "command": ["sh", "-c", 'mkdir -p "$PLUGIN_DIR" && exec s3driver "$@"', "s3driver"],
                "args": ["--endpoint=unix://$(PLUGIN_DIR)/csi.sock", *driver_args],
                "env": node_env,
                "securityContext": {"privileged": True},
                "volumeMounts": [nodes_mount | {"mountPropagation": "Bidirectional"}],
            },
            {
                "name": "csi-registrar",
                "image": images.registrar.ref,
                "args": [
                    f"--driver-name={DRIVER}",
                    "--csi-address=$(PLUGIN_DIR)/csi.sock",
                    f"--registration-dir={kubelet / 'plugins_registry'}",
                ],
                "env": node_env,
                "volumeMounts": [nodes_mount],
            },
        ],
        "volumes": [{"name": "nodes", "hostPath": {"path": str(nodes_dir), "type": "Directory"}}],
    }
    socket = {"name": "socket", "mountPath": "/csi"}
    controller = {
        "serviceAccountName": CONTROLLER_ACCOUNT,
        "terminationGracePeriodSeconds": 5,
        "tolerations": [{"operator": "Exists"}],  # as SeaweedFS's
        **_on(controller_node),
        "containers": [
            {
                "name": "csi-provisioner",
                "image": images.provisioner.ref,
                "args": ["--csi-address=/csi/csi.sock", "--timeout=60s", "--v=2"],
                "volumeMounts": [socket],
            },
            {
                "name": "csi-s3",
                "image": images.csi_s3.ref,
                "args": ["--endpoint=unix:///csi/csi.sock", *driver_args],
                "env": [_node_name_env()],
                "volumeMounts": [socket],
            },
        ],
        "volumes": [{"name": "socket", "emptyDir": {}}],
    }
    return [
        *_provisioner_rbac(),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NODE_ACCOUNT, NODE)},
        _workload("Deployment", CONTROLLER, controller),
        _workload("DaemonSet", NODE, node_plugin),
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": _meta(DRIVER, CONTROLLER, None),
            # No attach step; no recursive chown of a shared tree on each mount.
            "spec": {"attachRequired": False, "podInfoOnMount": True, "fsGroupPolicy": "None"},
        },
    ]


def _provisioner_rbac() -> list[dict[str, Any]]:
    """csi-provisioner's rights (its deploy/kubernetes/rbac.yaml, less snapshots
    and capacity, which this driver has not), and the driver's Secret."""
    cluster_rules = [
        ("", "persistentvolumes", ["get", "list", "watch", "create", "patch", "delete"]),
        ("", "persistentvolumeclaims", ["get", "list", "watch", "update"]),
        ("", "events", ["list", "watch", "create", "update", "patch"]),
        ("", "nodes", ["get", "list", "watch"]),
        ("storage.k8s.io", "storageclasses", ["get", "list", "watch"]),
        ("storage.k8s.io", "csinodes", ["get", "list", "watch"]),
        ("storage.k8s.io", "volumeattachments", ["get", "list", "watch"]),
        ("storage.k8s.io", "volumeattributesclasses", ["get", "list", "watch"]),
    ]
    namespace_rules = [
        ("", "secrets", ["get"]),
        ("coordination.k8s.io", "leases", ["get", "watch", "list", "delete", "update", "create"]),
    ]

    def rules(table: list[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
        return [{"apiGroups": [g], "resources": [r], "verbs": v} for g, r, v in table]

    def binding(kind: str, namespace: str | None) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": f"{kind}Binding",
            "metadata": _meta(CONTROLLER_ACCOUNT, CONTROLLER, namespace),
            "subjects": [
                {"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT, "namespace": NAMESPACE}
            ],
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": kind,
                "name": CONTROLLER_ACCOUNT,
            },
        }

    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(CONTROLLER_ACCOUNT, CONTROLLER),
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": _meta(CONTROLLER_ACCOUNT, CONTROLLER, None),
            "rules": rules(cluster_rules),
        },
        binding("ClusterRole", None),
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": _meta(CONTROLLER_ACCOUNT, CONTROLLER),
            "rules": rules(namespace_rules),
        },
        binding("Role", NAMESPACE),
    ]


def storage_class(name: str = STORAGE_CLASS) -> dict[str, Any]:
    """The class of shared volumes: one bucket per claim, mounted by s3fs.

    s3fs's options: its stat cache expires after 1 s (another node's change
    shows within about that; s3fs would otherwise keep a file's old size);
    it refuses to mount unless 512 MB stay free on the disk of its temporary
    files (its default, 10 % of that disk, refused 26 GB on a 258 GB disk
    with 23 GB free, shared with everything else on this machine).
    """
    secret = {"name": DRIVER_LOGIN, "namespace": NAMESPACE}
    parameters = {"mounter": "s3fs", "options": "-o stat_cache_expire=1 -o ensure_diskfree=512"}
    for stage in ("provisioner", "node-stage", "node-publish"):
        parameters[f"csi.storage.k8s.io/{stage}-secret-name"] = secret["name"]
        parameters[f"csi.storage.k8s.io/{stage}-secret-namespace"] = secret["namespace"]
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": _meta(name, CONTROLLER, None),
        "provisioner": DRIVER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "parameters": parameters,
    }


def secrets_manifests(access_key: str, secret_key: str) -> list[dict[str, Any]]:
    """SeaweedFS's S3 identities, and the same login as the driver reads it."""
    endpoint = f"http://{SEAWEEDFS}.{NAMESPACE}.svc.cluster.local:{S3_PORT}"
    driver = {"accessKeyID": access_key, "secretAccessKey": secret_key, "endpoint": endpoint}
    config = {"s3.json": json.dumps(s3_identities(access_key, secret_key))}
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(S3_CONFIG, SEAWEEDFS),
            "stringData": config,
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(DRIVER_LOGIN, CONTROLLER),
            "stringData": driver,
        },
    ]


def manifests(
    images: StorageImages,
    *,
    nodes_dir: Path,
    data_dir: Path,
    access_key: str,
    secret_key: str,
    node: str | None = None,
) -> list[dict[str, Any]]:
    """Everything `install_shared_storage` applies, in order."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": _meta(NAMESPACE, CONTROLLER, None),
    }
    return [
        namespace,
        *secrets_manifests(access_key, secret_key),
        *seaweedfs_manifests(images.seaweedfs, data_dir, node),
        *csi_manifests(images, nodes_dir, node),
        storage_class(),
    ]


# ------------------------------------------------------------------ install


async def install_shared_storage(
    kube: Any,
    nodes: KubeletNodes,
    images: StorageImages,
    log: Log,
    *,
    within: float = 180,
    node: str | None = None,
) -> None:
    """SeaweedFS, the CSI driver and the `shared` StorageClass on a running
    bed, waited for until a claim of the class can be provisioned and
    mounted on each of `nodes`' nodes: SeaweedFS and the controller ready,
    the node plugin ready everywhere and registered with every kubelet.
    Idempotent; the S3 login is made at the first install and kept (the
    data outlives the pods, in `<state>/shared-storage/`). `node`: the node
    SeaweedFS and the provisioner run on (None: any)."""
    from lightkube import ApiError, codecs
    from lightkube.resources.core_v1 import Secret

    started = time.monotonic()
    try:
        current = await kube.get(Secret, DRIVER_LOGIN, namespace=NAMESPACE)
        access_key, secret_key = (
            base64.b64decode(current.data[key]).decode()
            for key in ("accessKeyID", "secretAccessKey")
        )
    except ApiError as error:
        if error.status.code != 404:
            raise
        access_key, secret_key = secrets.token_hex(10), secrets.token_hex(20)
    data_dir = nodes.dir.parent / "shared-storage" / SEAWEEDFS
    for manifest in manifests(
        images,
        nodes_dir=nodes.dir,
        data_dir=data_dir,
        access_key=access_key,
        secret_key=secret_key,
        node=node,
    ):
        await kube.apply(codecs.from_dict(manifest), field_manager="sunk-testbed", force=True)
    names = nodes.names()
    await wait_until("shared storage ready", lambda: storage_ready(kube, names), within)
    log(f"shared storage ready in {time.monotonic() - started:.1f} s (class {STORAGE_CLASS!r})")


async def storage_ready(kube: Any, names: Sequence[str]) -> bool:
    """SeaweedFS and the controller have a ready pod; the node plugin is ready
    on every node it is scheduled to, and each of `names`' kubelets lists the
    driver in its CSINode (what the registrar's registration makes)."""
    import msgspec
    from lightkube import ApiError
    from lightkube.resources.apps_v1 import DaemonSet, Deployment
    from lightkube.resources.storage_v1 import CSINode

    for name in (SEAWEEDFS, CONTROLLER):
        deployment = await kube.get(Deployment, name, namespace=NAMESPACE)
        if not (deployment.status and deployment.status.readyReplicas):
            return False
    daemons = await kube.get(DaemonSet, NODE, namespace=NAMESPACE)
    status = daemons.status
    if (
        not status
        or not status.desiredNumberScheduled
        or status.numberReady < status.desiredNumberScheduled
    ):
        return False
    for name in names:
        try:
            csi_node = await kube.get(CSINode, name)
        except (ApiError, msgspec.ValidationError):
            # Not made yet, or made by kubelet before any driver registered
            # (`spec.drivers: null`, which the model refuses).
            return False
        if DRIVER not in {d.name for d in (csi_node.spec.drivers or [])}:
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sunk_testbed.storage",
        description="Build the shared storage's binaries and images; with --install, "
        "install it on a running bed.",
    )
    parser.add_argument("--install", type=Path, metavar="STATE", help="a running bed's state dir")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(f"[storage] {message}", file=sys.stderr, flush=True)

    started = time.monotonic()
    images = ensure_storage_images(log)
    for image in (images.seaweedfs, images.csi_s3, images.provisioner, images.registrar):
        print(image.ref, image.digest)
    log(f"built in {time.monotonic() - started:.1f} s")
    if args.install is not None:
        asyncio.run(_install_on(args.install, images, log))
    return 0


async def _install_on(state_dir: Path, images: StorageImages, log: Log) -> None:
    from sunk.kube.client import kube_client
    from sunk_testbed.bed import Bed

    bed = Bed(state_dir)
    access = bed.kube(log).access()
    if access is None:
        raise SystemExit(f"no running bed in {state_dir}")
    client = kube_client(access.admin_kubeconfig, "sunk-testbed")
    try:
        await install_shared_storage(client, bed.node_bed(log).group, images, log)
    finally:
        await client.close()


if __name__ == "__main__":
    sys.exit(main())
