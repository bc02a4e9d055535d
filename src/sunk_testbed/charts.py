"""Both charts on the bed's nodes: what `sunk local up` and the chart tests share.

Every pod runs from its image (`sunk_testbed.images`, served by the bed's
registry) on a real kubelet, sunk's own components included. The values here
turn off what the bed lacks (a mailer), use the bed's Slurm settings, put the
users' homes on a claim of the bed's ReadWriteMany class (`sunk_testbed.storage`)
and the charts' other volumes on static hostPath PersistentVolumes in the
bed's state directory.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient, codecs
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod, Secret, ServiceAccountToken

from sunk.kube.client import pod_ready
from sunk_testbed.helm import CHARTS, Helm, HelmError
from sunk_testbed.images import DEFAULT_SLURM, REGISTRY_HOST, Image, ImageSet
from sunk_testbed.slurm_cluster import SANDBOX_SETTINGS

STORAGE_CLASS = "sunk-local"
NODE_POOL_LABEL = "sunk.dev/pool"
COMPUTE_POOL = "compute"
# `sunk local up`'s topology/tree: one level, the nodes' zones.
ZONE_LABEL = "topology.kubernetes.io/zone"
RESTAPI_PORT = 6820
# A second registry of the bed's, over the same images, that asks for a login
# (a platform team's private registry): container jobs reach it under this
# name with the credentials of the Secret named PRIVATE_REGISTRY_PULL.
PRIVATE_REGISTRY_HOST = "private.sunk.test"
PRIVATE_REGISTRY_PULL = "private-registry-pull"
# The chart account the bed's users and its served namespace's pods run in,
# and the QOS it grants (the slurm chart's defaults; the first is the default).
RESEARCH_ACCOUNT = "research"
RESEARCH_QOS = ("normal", "inference", "high")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    public_key: str


def slurm_values(
    *,
    users: Sequence[User],
    homes_class: str,
    images: ImageSet,
    nodeset: str = "compute",
    backup: bool = False,
    slurm_config: Mapping[str, str | int] | None = None,
    slurm_release: str = DEFAULT_SLURM,
    registry: str = "",
    private_registry: str = "",
    topology_levels: Sequence[str] = (),
    identity: str = "static",
    gpus: int = 0,
) -> dict[str, Any]:
    """Values of the slurm chart for the bed: one NodeSet on the nodes labelled
    `sunk.dev/pool=compute`, homes on a claim of `homes_class` (a
    ReadWriteMany class, the bed's `shared`), every pod from the
    bed's images of `slurm_release`. Slurm keeps the chart's production settings (cgroup process
    tracking and task containment, `PrologFlags=Alloc,Contain`). `registry`, the
    bed registry's HOST:PORT: container jobs pull `registry.sunk.test/...` from it,
    as the nodes' containerd does; `private_registry`, the HOST:PORT of one that
    asks for a login: `private.sunk.test/...`, with the credentials of the
    Secret `registry_auth_secret()` makes. `topology_levels`: a topology/tree from these
    node labels, which sunk's operator keeps (none: no topology plugin); on
    25.05+ also blocks of two on the first of them.
    `identity`: `static` (the users in /etc/passwd) or `ldap` (the chart's
    in-chart directory, seeded with the same users and keys, on a volume).
    `gpus`: the GPUs of every node, whose device files sunk's GPU plugin
    hands the slurmd pods (sunk_testbed.gpus); gres.conf is the chart's
    default, written by sunk's operator from what the plugin finds."""
    # Memory is consumable (the chart's CR_Core_Memory), or a job's --mem sets
    # no cgroup limit; a job without --mem gets 200 MiB a CPU, not the whole
    # node. The bed has no mailer. config_overrides: Slurm takes the NodeSet's
    # declared CPUs and memory (below), whatever slurmd finds on the one host
    # all the bed's nodes share; a small host's nodes are not drained for less.
    settings: dict[str, str | int] = {
        "MailProg": SANDBOX_SETTINGS["MailProg"],
        "SlurmdParameters": SANDBOX_SETTINGS["SlurmdParameters"],
        "DefMemPerCPU": 200,
        **({"GresTypes": "gpu"} if gpus else {}),
    }
    daemons, login = images.slurm_pair(slurm_release)
    return {
        "image": {"repository": _repository(daemons), "tag": daemons.tag},
        "controller": {
            "backup": backup,
            "persistence": {"storageClassName": STORAGE_CLASS},
        },
        "slurmConfig": {
            **settings,
            # Shorter than the chart's SlurmctldTimeout 30 and SlurmdTimeout 300,
            # and Slurm's MessageTimeout 10 and MinJobAge 300: the failover and
            # node-loss tests see a takeover or a DOWN node in seconds, and ended
            # jobs leave squeue sooner. A site picks its own tolerance.
            "SlurmctldTimeout": 10,
            "SlurmdTimeout": 30,
            "MessageTimeout": 5,
            "MinJobAge": 30,
            **(slurm_config or {}),
        },
        "nodesets": [
            {
                "name": nodeset,
                # The compute pool alone: the chart e2e's bed keeps two nodes
                # for the controllers.
                "nodeSelector": {NODE_POOL_LABEL: COMPUTE_POOL},
                # Not the chart's default (the node's allocatable): every bed
                # node reports the whole shared host, so each gets a share.
                "resources": {"cpus": 2, "realMemoryMiB": 1000},
                "nodeName": "{nodeset}-{node}",
            }
        ],
        "partitions": [{"name": "debug", "nodesets": [nodeset], "default": True}],
        # Homes made at each user's first ssh login (the chart's default).
        "homes": {"storageClassName": homes_class},
        # slurmctld's OpenMetrics endpoints came with 25.11; 24.11 refuses MetricsType.
        "metrics": {"enabled": slurm_release >= "25.11"},
        "accounting": {
            "mariadb": {"persistence": {"storageClassName": STORAGE_CLASS}},
            # The bed's users may run jobs in `research`, which grants the chart's
            # inference and high QOS: what a platform team sets for a team it
            # trusts to preempt training (and its namespace's pods, through
            # sunk-cluster's tenants[].accounts and qos). Their own accounts (the
            # directory group's, or `users`) keep the cluster's: normal alone.
            "accounts": {
                RESEARCH_ACCOUNT: {
                    "description": "the bed users: inference and high granted",
                    "qos": list(RESEARCH_QOS),
                    "defaultQos": "normal",
                    "users": [user.name for user in users],
                }
            },
        },
        "login": {
            "authorizedKeys": {user.name: user.public_key for user in users},
            "image": {"repository": _repository(login), "tag": login.tag},
        },
        "identity": {
            "provider": identity,
            "users": [{"name": u.name, "uid": u.uid, "gid": u.uid} for u in users],
            "groups": [{"name": u.name, "gid": u.uid, "members": [u.name]} for u in users],
            **({"ldap": _ldap_server(images.ldap)} if identity == "ldap" else {}),
        },
        "containers": {
            "registriesConf": _registries_conf(registry, private_registry) if registry else "",
            "registryAuthSecret": PRIVATE_REGISTRY_PULL if private_registry else "",
        },
        "topology": _topology(topology_levels, slurm_release),
    }


def _topology(levels: Sequence[str], slurm_release: str) -> dict[str, Any]:
    """A tree on `levels`; on 25.05+ also blocks of two on the top level's
    label (a second topology, `block`, for partitions with Topology=block)."""
    if not levels:
        return {"plugin": "none"}
    if slurm_release < "25.05":
        return {"plugin": "tree", "file": "topology.conf", "tree": {"levels": list(levels)}}
    return {
        "plugin": "tree",
        "file": "topology.yaml",
        "tree": {"levels": list(levels)},
        "block": {"label": levels[0], "sizes": [2]},
    }


def _ldap_server(image: Image) -> dict[str, Any]:
    """The in-chart directory from the bed's image, its database on a volume."""
    return {
        "server": {
            "enabled": True,
            "image": {"repository": _repository(image), "tag": image.tag},
            "persistence": {"storageClassName": STORAGE_CLASS},
        },
        # Every directory group an account, looked at every 5 s.
        "accounts": {"enabled": True, "interval": 5},
    }


def _registries_conf(address: str, private: str = "") -> str:
    """containers-registries.conf(5): the bed's registry names at their plain-HTTP addresses."""
    names = [(REGISTRY_HOST, address)] + ([(PRIVATE_REGISTRY_HOST, private)] if private else [])
    return "\n".join(
        f'[[registry]]\nprefix = "{name}"\nlocation = "{at}"\ninsecure = true\n'
        for name, at in names
    )


def registry_auth_secret(namespace: str, address: str, user: str, password: str) -> dict[str, Any]:
    """The kubernetes.io/dockerconfigjson Secret of the private registry's
    login, as a platform team's imagePullSecret: the login under the name
    researchers use and under its address, the registry skopeo contacts after
    registries.conf maps the name (and looks the credentials up under)."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = {"auths": {PRIVATE_REGISTRY_HOST: {"auth": auth}, address: {"auth": auth}}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": PRIVATE_REGISTRY_PULL, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }


def _repository(image: Image) -> str:
    return image.ref.rsplit(":", 1)[0]


def cluster_values(
    release: str,
    image: Image,
    *,
    namespace: str = "",
    replicas: int = 1,
    tenants: list[dict[str, Any]] | None = None,
    gpu_plugin: Mapping[str, Any] | None = None,
    slurmd_pods: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Values of the sunk-cluster chart beside slurm release `release`: one
    replica of each component and of `sunk tokens` (a two-core machine) from
    the bed's sunk image;
    `tenants`, the scheduler's tenancy (none: no namespace served);
    `gpu_plugin`, the GPU plugin's values (none: not run);
    `slurmd_pods`, what the operator may put in slurmd pods
    (`componentPolicies.slurmdPods`, from `slurmd_pod_allowance`; none: the
    chart's defaults, which fit only a slurm release named `slurm`)."""
    values: dict[str, Any] = {
        "slurm": {
            "restapiUrl": f"http://{release}-slurmrestd:{RESTAPI_PORT}",
            "jwtSecret": f"{release}-jwt",
            "jwtSigningSecret": f"{release}-jwt-signing",
            "namespace": namespace,
            "topologyConfigMap": f"{release}-topology",
            "configMap": f"{release}-config",
        },
        "tokens": {"replicas": 1},
        "operator": {"replicas": replicas},
        "syncer": {"replicas": replicas},
        "scheduler": {"replicas": replicas, "tenants": tenants or []},
        "image": {"repository": _repository(image), "tag": image.tag},
        "gpuPlugin": {"enabled": True, **gpu_plugin} if gpu_plugin else {"enabled": False},
    }
    if slurmd_pods is not None:
        values["componentPolicies"] = {"slurmdPods": dict(slurmd_pods)}
    return values


def slurmd_pod_allowance(rendered: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """`componentPolicies.slurmdPods` of the sunk-cluster chart that lets the
    operator make the pods of the NodeSets among `rendered` (the slurm chart's
    objects, as `helm template` gives them): their images' repositories, the
    Secrets, host paths and claims they use, the capabilities they add."""
    found: dict[str, set[str]] = {
        key: set()
        for key in ("images", "secrets", "hostPaths", "persistentVolumeClaims", "capabilities")
    }
    for doc in rendered:
        if doc.get("kind") != "NodeSet":
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            found["images"].add(image_repository(container["image"]))
            for env in container.get("env") or []:
                if ref := (env.get("valueFrom") or {}).get("secretKeyRef"):
                    found["secrets"].add(ref["name"])
            for source in container.get("envFrom") or []:
                if ref := source.get("secretRef"):
                    found["secrets"].add(ref["name"])
            added = ((container.get("securityContext") or {}).get("capabilities") or {}).get("add")
            found["capabilities"].update(added or [])
        for volume in spec.get("volumes") or []:
            if "secret" in volume:
                found["secrets"].add(volume["secret"]["secretName"])
            for source in (volume.get("projected") or {}).get("sources") or []:
                if "secret" in source:
                    found["secrets"].add(source["secret"]["name"])
            if "hostPath" in volume:
                found["hostPaths"].add(volume["hostPath"]["path"])
            if "persistentVolumeClaim" in volume:
                found["persistentVolumeClaims"].add(volume["persistentVolumeClaim"]["claimName"])
    return {key: sorted(values) for key, values in found.items()}


def image_values(image: Image) -> dict[str, str]:
    """A chart's usual `image` values for one of the bed's images. Never
    Always: the bed's registry is read-only and the tag is a content hash."""
    return {
        "repository": image_repository(image.ref),
        "tag": image.tag,
        "pullPolicy": "IfNotPresent",
    }


def image_repository(image: str) -> str:
    """`registry:5000/a/b` of `registry:5000/a/b:tag` or `...@sha256:...`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


def render_slurmd_pod_allowance(
    helm: Helm, release: str, namespace: str, values: Mapping[str, Any], values_file: Path
) -> dict[str, list[str]]:
    """`slurmd_pod_allowance` of the slurm chart as `release` renders with
    `values` (written to `values_file`), so the sunk-cluster release installed
    before it lets the operator make exactly these NodeSets' pods."""
    values_file.write_text(yaml.safe_dump(dict(values)))
    chart = str(CHARTS / "slurm")
    out = helm.run(["template", release, chart, "-n", namespace, "-f", str(values_file)])
    return slurmd_pod_allowance(doc for doc in yaml.safe_load_all(out) if doc)


VOLUME_COUNT = 4
VOLUME_SIZE = "2Gi"


async def apply_volumes(kube: AsyncClient, directory: Path) -> None:
    """The `sunk-local` StorageClass and static hostPath PersistentVolumes for
    the charts' claims (every node shares the host's file system). Each volume's
    directory outlives `down`, so a later `up` finds the Slurm state again."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        }
    ]
    for index in range(1, VOLUME_COUNT + 1):
        path = directory / f"pv-{index}"
        await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(path.chmod, 0o777)  # any container user, like local-path
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{STORAGE_CLASS}-{index}"},
                "spec": {
                    "storageClassName": STORAGE_CLASS,
                    "capacity": {"storage": VOLUME_SIZE},
                    "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(path), "type": "Directory"},
                },
            }
        )
    for manifest in objects:
        await kube.apply(codecs.from_dict(manifest), force=True)


def new_ssh_key(path: Path) -> str:
    """An ed25519 key pair at `path` (kept if there); returns the public key."""
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sunk-local", "-f", str(path)],
            check=True,
        )
    return Path(f"{path}.pub").read_text().strip()


def ssh_argv(key: Path, user: str, address: str, command: Sequence[str] = ()) -> list[str]:
    """ssh to a login pod (its address on the pod network; no host key to pin yet)."""
    return [
        "ssh",
        "-i",
        str(key),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=5",
        f"{user}@{address}",
        *command,
    ]


async def nodes_offer(kube: AsyncClient, names: Sequence[str], resource: str) -> bool:
    """Every named node has `resource` allocatable."""
    for name in names:
        node = await kube.get(Node, name)
        allocatable = (node.status.allocatable if node.status else None) or {}
        if allocatable.get(resource, "0") in ("", "0"):
            return False
    return True


async def pod_ip(kube: AsyncClient, namespace: str, selector: Mapping[str, str]) -> str | None:
    """The address of a Ready pod matching `selector`, if any."""
    async for pod in kube.list(Pod, namespace=namespace, labels=dict(selector)):
        status = pod.status
        if status is None or not status.podIP or pod.metadata is None:
            continue
        if pod.metadata.deletionTimestamp is not None:
            continue
        if pod_ready(pod):
            return status.podIP
    return None


def component(release: str, name: str) -> dict[str, str]:
    """The slurm chart's selector labels of one component."""
    return {
        "app.kubernetes.io/name": "slurm",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/component": name,
    }


def _write_private(path: Path, content: bytes) -> Path:
    path.touch(mode=0o600)
    path.write_bytes(content)
    return path


async def secret_file(kube: AsyncClient, namespace: str, name: str, key: str, path: Path) -> Path:
    """Write one key of a Secret to `path` (mode 0600), e.g. the JWT key for sunk's components."""
    secret = await kube.get(Secret, name, namespace=namespace)
    content = base64.b64decode((secret.data or {})[key])
    return await asyncio.to_thread(_write_private, path, content)


async def service_account_kubeconfig(
    kube: AsyncClient,
    server: str,
    ca_file: Path,
    namespace: str,
    account: str,
    path: Path,
    lifetime: datetime.timedelta = datetime.timedelta(hours=24),
    bound_to: Pod | None = None,
) -> Path:
    """A kubeconfig that acts as ServiceAccount `namespace/account` (a
    TokenRequest token); `bound_to`: the token is its pod's, as a pod's own
    projected token is (the apiserver names the pod's node in it)."""
    bound = None
    if bound_to is not None and bound_to.metadata is not None:
        bound = BoundObjectReference(
            apiVersion="v1", kind="Pod", name=bound_to.metadata.name, uid=bound_to.metadata.uid
        )
    request = ServiceAccountToken(
        metadata=ObjectMeta(),
        spec=TokenRequestSpec(
            audiences=[],
            expirationSeconds=int(lifetime.total_seconds()),
            boundObjectRef=bound,
        ),
    )
    reply = await kube.create(request, account, namespace=namespace)
    assert reply.status is not None
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": account, "user": {"token": reply.status.token}}],
        "contexts": [
            {
                "name": account,
                "context": {"cluster": "local", "user": account, "namespace": namespace},
            }
        ],
        "current-context": account,
    }
    return await asyncio.to_thread(_write_private, path, yaml.safe_dump(config).encode())


async def unready_pods(kube: AsyncClient, namespace: str) -> str:
    """One line per pod of `namespace` that is not Ready, with why (for errors)."""
    lines = []
    async for pod in kube.list(Pod, namespace=namespace):
        if pod_ready(pod) or pod.metadata is None:
            continue
        why = []
        for status in (pod.status.containerStatuses if pod.status else None) or []:
            waiting = status.state.waiting if status.state else None
            if waiting is not None:
                why.append(f"{status.name}: {waiting.reason}")
            elif not status.ready:
                why.append(f"{status.name}: not ready")
        phase = pod.status.phase if pod.status else "?"
        lines.append(f"  {pod.metadata.name} ({phase}) {'; '.join(why)}")
    return "\n".join(lines) or "  (every pod is Ready)"


async def failed_pod_logs(kube: AsyncClient, namespace: str, lines: int = 20) -> str:
    """The last lines of every container of each Failed pod in `namespace`
    (a hook Job's pods, say), for an error that names why."""
    report = []
    async for pod in kube.list(Pod, namespace=namespace):
        name = pod.metadata.name if pod.metadata else None
        if name is None or pod.status is None or pod.status.phase != "Failed":
            continue
        for status in [
            *(pod.status.initContainerStatuses or []),
            *(pod.status.containerStatuses or []),
        ]:
            text = await _log_tail(kube, name, namespace, lines, status.name)
            report.append(f"--- {name}/{status.name}\n{text}")
    return "\n".join(report) or "(no failed pods)"


async def pods_report(
    kube: AsyncClient, namespace: str, selector: Mapping[str, str], lines: int = 20
) -> str:
    """Each pod matching `selector`: its node, phase, each container's state
    and restarts, its events and its log's last lines (for an error that
    names why a component is not serving)."""
    report = []
    async for pod in kube.list(Pod, namespace=namespace, labels=dict(selector)):
        name = pod.metadata.name if pod.metadata else None
        if name is None:
            continue
        status = pod.status
        node = pod.spec.nodeName if pod.spec else None
        report.append(f"--- {name} on {node}: {status.phase if status else '?'}")
        for container in (status.containerStatuses if status else None) or []:
            state = container.state
            now = (
                f"waiting {state.waiting.reason}: {state.waiting.message}"
                if state and state.waiting
                else "running"
                if state and state.running
                else "terminated"
            )
            last = container.lastState.terminated if container.lastState else None
            ended = f"; last exit {last.exitCode} {last.reason}" if last else ""
            report.append(
                f"  {container.name}: {now}, ready={container.ready}, "
                f"restarts={container.restartCount}{ended}"
            )
        async for event in kube.list(
            Event, namespace=namespace, fields={"involvedObject.name": name}
        ):
            report.append(f"  event {event.type} {event.reason}: {event.message}")
        report.append("  " + (await _log_tail(kube, name, namespace, lines)).replace("\n", "\n  "))
    return "\n".join(report) or "(no such pods)"


async def _log_tail(
    kube: AsyncClient, pod: str, namespace: str, lines: int, container: str | None = None
) -> str:
    """The last `lines` of a container's log, or why there is none (a report must not fail)."""
    try:
        text = [
            line
            async for line in kube.log(
                pod, namespace=namespace, container=container, tail_lines=lines
            )
        ]
    except Exception as error:
        return f"(no log: {error})"
    return "".join(text).rstrip()


async def install(
    helm: Helm,
    kube: AsyncClient,
    release: str,
    chart: str | Path,
    namespace: str,
    values: Mapping[str, Any],
    values_file: Path,
) -> str:
    """`helm upgrade --install`; when it fails, the error carries the logs of
    the pods that failed (helm names a failed hook Job, never why)."""
    try:
        return await asyncio.to_thread(
            helm.upgrade_install, release, chart, namespace, values, values_file=values_file
        )
    except HelmError as error:
        logs = await failed_pod_logs(kube, namespace)
        raise RuntimeError(f"{error}\nfailed pods in {namespace}:\n{logs}") from None


async def wait_until(what: str, check: Any, within: float, interval: float = 0.5) -> Any:
    """Poll `check()` (async) until it returns something truthy; that value."""
    try:
        async with asyncio.timeout(within):
            while True:
                if value := await check():
                    return value
                await asyncio.sleep(interval)
    except TimeoutError:
        raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}") from None
