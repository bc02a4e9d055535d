"""Slurm as pods on real nodes: the objects a NodeSet-style slurmd pod needs.

What a slurmd pod of a NodeSet does, here against the test bed's own
slurmctld (which runs on the host, reachable from pods at the room's host
address), from the slurm image built from `images/slurm`:

- `slurmctld` resolves through a selector-less Service with a hand-made
  EndpointSlice pointing at the gateway (how an external endpoint is given a
  cluster name);
- munge runs in the pod as a native sidecar (an init container with
  restartPolicy Always) with the cluster's key from a Secret, sharing its
  socket with slurmd through an emptyDir; an init container installs the key
  with the owner and mode munged insists on;
- slurmd runs configless (`-Z --conf-server slurmctld:PORT`) as a dynamic node
  named after the pod, with its spool in an emptyDir; its readiness is a TCP
  probe on slurmd's port;
- it tolerates what a NodeSet pod tolerates, sunk's node-lock taint among
  them: without that, a job's NoExecute lock has kube-controller-manager
  evict the slurmd under the job.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightkube import AsyncClient

from sunk.api import LABEL_NODESET
from sunk.api import nodeset as nodeset_api
from sunk.api.install import install_crds
from sunk.nodeset.pods import DAEMON_TOLERATIONS

SLURMD_PORT = 6818
# munge's user and group in the root filesystem (fixed by install-slurm.sh).
MUNGE_ID = 64033
MUNGE_SECRET = "slurm-munge-key"  # noqa: S105 - a Secret's name, not a secret
SERVICE = "slurmctld"

_WAIT_SOCKET = (
    "for i in $(seq 200); do test -S /run/munge/munge.socket.2 && exit 0; sleep 0.05; done; exit 1"
)


def munge_secret(namespace: str, key: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": MUNGE_SECRET, "namespace": namespace},
        "data": {"munge.key": base64.b64encode(key.read_bytes()).decode()},
    }


def controller_service(namespace: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": namespace},
        "spec": {"clusterIP": "None", "ports": [{"name": "slurmctld", "port": port}]},
    }


def controller_endpoints(namespace: str, address: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE}-host",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": SERVICE},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "slurmctld", "port": port, "protocol": "TCP"}],
    }


def slurmd_pod(
    name: str,
    namespace: str,
    ctld_port: int,
    *,
    image: str,
    node: str | None = None,
    cpus: int = 1,
    munge_uid: int = MUNGE_ID,
    munge_gid: int = MUNGE_ID,
    feature: str = "dynamic",
    grace: int = 5,
) -> dict[str, Any]:
    """A slurmd pod (bound to `node` directly when given, else left to the scheduler)."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace,
        "initContainers": [
            {
                "name": "munge-key",
                "image": image,
                "command": [
                    "sh",
                    "-c",
                    "install -d -o munge -g munge -m 0700 /etc/munge"
                    " && install -o munge -g munge -m 0400 /munge-secret/munge.key /etc/munge/"
                    " && install -d -o munge -g munge -m 0755 /run/munge"
                    " && mkdir -p /var/spool/slurmd/$(POD_NAME)",
                ],
                "env": [_pod_name_env()],
                "volumeMounts": [
                    {"name": "munge-secret", "mountPath": "/munge-secret"},
                    {"name": "munge-etc", "mountPath": "/etc/munge"},
                    {"name": "munge-run", "mountPath": "/run/munge"},
                    {"name": "spool", "mountPath": "/var/spool/slurmd"},
                ],
            },
            {
                "name": "munged",
                "image": image,
                "restartPolicy": "Always",  # a native sidecar
                "command": ["munged", "-F"],
                "securityContext": {"runAsUser": munge_uid, "runAsGroup": munge_gid},
                "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", _WAIT_SOCKET]}}},
                "volumeMounts": [
                    {"name": "munge-etc", "mountPath": "/etc/munge"},
                    {"name": "munge-run", "mountPath": "/run/munge"},
                ],
            },
        ],
        "containers": [
            {
                "name": "slurmd",
                "image": image,
                "command": [
                    "slurmd",
                    "-D",
                    "-Z",
                    "-N",
                    "$(POD_NAME)",
                    "--conf-server",
                    f"{SERVICE}:{ctld_port}",
                    "--conf",
                    f"Feature={feature} CPUs={cpus} RealMemory=1000",
                ],
                "env": [_pod_name_env()],
                "ports": [{"name": "slurmd", "containerPort": SLURMD_PORT}],
                "readinessProbe": {
                    "tcpSocket": {"port": "slurmd"},
                    "periodSeconds": 1,
                },
                "resources": {"requests": {"cpu": f"{cpus * 100}m", "memory": "64Mi"}},
                "volumeMounts": [
                    {"name": "munge-run", "mountPath": "/run/munge"},
                    {"name": "spool", "mountPath": "/var/spool/slurmd"},
                ],
            }
        ],
        "volumes": [
            {"name": "munge-secret", "secret": {"secretName": MUNGE_SECRET, "defaultMode": 0o400}},
            {"name": "munge-etc", "emptyDir": {}},
            {"name": "munge-run", "emptyDir": {}},
            {"name": "spool", "emptyDir": {}},
        ],
        "tolerations": [t.to_dict() for t in DAEMON_TOLERATIONS],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "slurmd"}},
        "spec": spec,
    }


def nodeset_template(ctld_port: int, image: str, marker: str = "v1") -> dict[str, Any]:
    """A NodeSet pod template from `slurmd_pod`: slurmd takes its identity (name,
    --conf line) from the NodeSet controller's SLURMD_NODENAME and SLURMD_CONF;
    `marker` is an env var whose change makes a new revision."""
    pod = slurmd_pod("x", "x", ctld_port, image=image, grace=2)
    spec = pod["spec"]
    spec.pop("nodeName", None)
    slurmd = spec["containers"][0]
    slurmd["command"] = [
        "sh",
        "-c",
        f'exec slurmd -D -Z -N "$SLURMD_NODENAME" --conf-server {SERVICE}:{ctld_port}'
        ' --conf "$SLURMD_CONF"',
    ]
    slurmd["env"] = [*slurmd["env"], {"name": "MARKER", "value": marker}]
    return {"metadata": {"labels": {"app": "slurmd"}}, "spec": spec}


def _pod_name_env() -> dict[str, Any]:
    return {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


async def standing_nodeset(kube: AsyncClient, namespace: str, name: str) -> dict[str, Any]:
    """A NodeSet that selects no node, to own slurmd pods made by hand; returns the
    metadata that makes a pod its own (label and controller ownerReference).

    The scheduler and the syncer take for slurmd pods only pods a NodeSet owns:
    beds that run slurmd pods without the NodeSet controller make them so."""
    await install_crds(kube)
    body = {
        "apiVersion": nodeset_api.API_VERSION,
        "kind": nodeset_api.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": {"sunk.test/no-such-node": "true"},
                    "containers": [{"name": "slurmd", "image": "none"}],
                }
            }
        },
    }
    resource = nodeset_api.resource()
    made = await kube.create(resource(body), namespace=namespace)  # type: ignore[call-overload]
    return {
        "labels": {LABEL_NODESET: name},
        "ownerReferences": [
            {
                "apiVersion": nodeset_api.API_VERSION,
                "kind": nodeset_api.KIND,
                "name": name,
                "uid": made["metadata"]["uid"],
                "controller": True,
            }
        ],
    }


def owned(body: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """`body` (a pod) as `standing_nodeset`'s NodeSet's own."""
    meta = body["metadata"]
    meta["labels"] = {**meta.get("labels", {}), **owner["labels"]}
    meta["ownerReferences"] = list(owner["ownerReferences"])
    return body
