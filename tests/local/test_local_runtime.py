"""The local node runtime against the real control plane and a real Slurm.

One runtime with three nodes for the module, on its own state directory, and
its own small Slurm (no static nodes, configless, controller address = the
runtime's gateway) so that slurmd pods register as dynamic nodes. Everything
the tests see goes through the real apiserver, scheduler and controllers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import (
    ConfigMap,
    Event,
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Secret,
    Service,
)
from typer.testing import CliRunner

from plugins.local import LocalBed, local_bed, wait_for
from sunk.cli import app
from sunk.local import slurmpods
from sunk.local.net import is_mount_point, link_names, netns_names
from sunk.local.node import NodeConfig
from sunk.local.port import build
from sunk.local.runtime import ControlPlaneIdentities, LocalRuntime, RuntimeConfig, cleanup
from sunk.local.system import pids_rooted_at
from sunk.testbed.kube import KubeAccess, KubeControlPlane

pytestmark = pytest.mark.testbed


def exists(path: Path) -> bool:
    return path.exists()


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def condition(obj: Any, kind: str) -> str | None:
    for cond in (obj.status.conditions if obj.status else None) or []:
        if cond.type == kind:
            return str(cond.status)
    return None


def container_status(pod: Pod, name: str) -> Any:
    assert pod.status is not None
    statuses = [*(pod.status.initContainerStatuses or []), *(pod.status.containerStatuses or [])]
    return next(s for s in statuses if s.name == name)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def bed(
    kube_control_plane: KubeControlPlane | None, kube_access: KubeAccess, kube: AsyncClient
) -> AsyncIterator[LocalBed]:
    if kube_control_plane is None:
        pytest.skip("the local runtime needs the bed's own CA to mint node identities")

    def nodes(tag: str) -> list[NodeConfig]:
        return [
            NodeConfig(f"ln{tag}-1", labels={"topology.kubernetes.io/zone": "z1"}),
            NodeConfig(f"ln{tag}-2", labels={"topology.kubernetes.io/zone": "z1"}),
            NodeConfig(
                f"ln{tag}-3",
                gpus=2,
                labels={"sunk.dev/rack": "r7", "node-role.kubernetes.io/gpu": ""},
            ),
        ]

    async with local_bed(kube_control_plane, kube_access, kube, nodes) as made:
        yield made


def pod(
    name: str, namespace: str, node: str | None, containers: list[dict[str, Any]], **spec: Any
) -> Pod:
    body: dict[str, Any] = {"containers": containers, "terminationGracePeriodSeconds": 2, **spec}
    if node is not None:
        body["nodeName"] = node
    return build(Pod, {"metadata": {"name": name, "namespace": namespace}, "spec": body})


def shell(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "debian", "command": ["sh", "-c", script], **extra}


async def get_pod(bed: LocalBed, name: str) -> Pod:
    return await bed.kube.get(Pod, name, namespace=bed.namespace)


async def wait_pod(
    bed: LocalBed, name: str, check: Callable[[Pod], bool], what: str, timeout: float = 20
) -> Pod:
    found: list[Pod] = []

    async def ok() -> bool:
        try:
            current = await get_pod(bed, name)
        except ApiError:
            return False
        found[:] = [current]
        try:
            return check(current)
        except (StopIteration, AttributeError, TypeError):
            return False  # not there yet

    try:
        await wait_for(f"{name}: {what}", ok, timeout)
    except AssertionError as exc:
        last = found[0].status.to_dict() if found and found[0].status else None
        raise AssertionError(
            f"{exc}\nlast status: {json.dumps(last, indent=1, default=str)}"
        ) from None
    return found[0]


def is_ready(p: Pod) -> bool:
    return condition(p, "Ready") == "True"


def phase_is(phase: str) -> Callable[[Pod], bool]:
    return lambda p: p.status is not None and p.status.phase == phase


# --------------------------------------------------------------------- nodes


async def test_nodes_register_ready_with_capacity_lease_and_labels(bed: LocalBed) -> None:
    subnet = bed.runtime.subnet
    for name in bed.nodes:
        node = await bed.kube.get(Node, name)
        assert node.status is not None
        assert condition(node, "Ready") == "True"
        assert node.status.allocatable is not None
        assert node.status.allocatable["cpu"] == "4"
        assert node.status.allocatable["pods"] == "110"
        address = next(a.address for a in node.status.addresses or [] if a.type == "InternalIP")
        assert subnet.contains(address)
        lease = await bed.kube.get(Lease, name, namespace="kube-node-lease")
        assert lease.spec is not None
        assert lease.spec.holderIdentity == name
    gpu = await bed.kube.get(Node, bed.nodes[2])
    assert gpu.status is not None
    assert gpu.status.capacity is not None
    assert gpu.status.capacity["nvidia.com/gpu"] == "2"
    assert gpu.metadata is not None
    labels = gpu.metadata.labels or {}
    assert labels["sunk.dev/rack"] == "r7"
    # NodeRestriction forbids a kubelet this label; the runtime set it as an admin would.
    assert labels["node-role.kubernetes.io/gpu"] == ""


async def test_each_node_has_its_own_restricted_identity(bed: LocalBed) -> None:
    await bed.kube.create(
        build(
            Secret,
            {
                "metadata": {"name": "unrelated", "namespace": bed.namespace},
                "stringData": {"k": "v"},
            },
        )
    )
    api = bed.runtime.node(bed.nodes[0]).api
    # The Node authorizer lets a node read only what pods bound to it reference.
    with pytest.raises(ApiError) as denied:
        await api.secret(bed.namespace, "unrelated")
    assert denied.value.status.code == 403
    assert f"system:node:{bed.nodes[0]}" in str(denied.value)


# ---------------------------------------------------------------- slurmd pods


async def test_slurmd_pods_register_as_dynamic_nodes_and_run_srun(bed: LocalBed) -> None:
    ns, port = bed.namespace, await bed.serve_slurm_to_pods()
    started = time.monotonic()
    names = [f"slurmd-{i}" for i in range(1, 4)]
    for name, node in zip(names, bed.nodes, strict=True):
        await bed.kube.create(build(Pod, slurmpods.slurmd_pod(name, ns, port, node=node)))
    for name in names:
        await wait_pod(bed, name, is_ready, "Ready", timeout=40)

    def registered() -> dict[str, str]:
        out = bed.cluster.run(["sinfo", "-h", "-N", "-o", "%N %t %f"], check=False).stdout
        return {line.split()[0]: line for line in out.splitlines() if line.strip()}

    async def all_idle() -> bool:
        nodes = await asyncio.to_thread(registered)
        return all(n in nodes and " idle " in nodes[n] + " " for n in names)

    await wait_for("three idle dynamic nodes", all_idle, timeout=20)
    print(f"3 slurmd pods Ready and idle in Slurm after {time.monotonic() - started:.1f}s")
    result = await asyncio.to_thread(bed.cluster.run, ["srun", "-N3", "hostname"], timeout=60)
    assert sorted(result.stdout.split()) == names
    # Each pod has its own address; slurmctld saw each node at it.
    addresses = set()
    for name in names:
        p = await get_pod(bed, name)
        assert p.status is not None
        addresses.add(p.status.podIP)
        shown = bed.cluster.run(["scontrol", "show", "node", name]).stdout
        assert f"NodeAddr={p.status.podIP} " in shown
    assert len(addresses) == 3


# ------------------------------------------------------- restarts and probes


async def test_a_killed_container_restarts(bed: LocalBed) -> None:
    await bed.kube.create(
        pod("sleeper", bed.namespace, bed.nodes[0], [shell("main", "echo up; exec sleep 1000")])
    )
    await wait_pod(bed, "sleeper", is_ready, "Ready")

    async def said_up() -> bool:
        return bed.log("sleeper") == "up\n"

    await wait_for("its output", said_up)
    pids = bed.runtime.container_pids(bed.namespace, "sleeper", "main")
    assert pids
    for pid in pids:
        os.kill(pid, 9)

    def restarted(p: Pod) -> bool:
        status = container_status(p, "main")
        return status.restartCount == 1 and status.state.running is not None

    current = await wait_pod(bed, "sleeper", restarted, "restarted once")
    last = container_status(current, "main").lastState.terminated
    assert last.exitCode == 137
    assert last.reason == "Error"
    assert bed.log("sleeper", previous=True) == "up\n"
    new = bed.runtime.container_pids(bed.namespace, "sleeper", "main")
    assert new
    assert not set(new) & set(pids)


async def test_crash_loop_backs_off(bed: LocalBed) -> None:
    await bed.kube.create(pod("crasher", bed.namespace, bed.nodes[1], [shell("main", "exit 3")]))

    def backing_off(p: Pod) -> bool:
        status = container_status(p, "main")
        waiting = status.state.waiting
        return waiting is not None and waiting.reason == "CrashLoopBackOff"

    current = await wait_pod(bed, "crasher", backing_off, "CrashLoopBackOff")
    status = container_status(current, "main")
    assert status.restartCount >= 1
    assert status.lastState.terminated.exitCode == 3
    assert current.status is not None
    assert current.status.phase == "Running"  # as kubelet reports a crash-looping pod


async def test_a_failing_readiness_probe_makes_the_pod_not_ready(bed: LocalBed) -> None:
    # The flag comes from a ConfigMap volume: its updates must reach the running pod.
    await bed.kube.create(
        build(
            ConfigMap,
            {"metadata": {"name": "flag", "namespace": bed.namespace}, "data": {"ready": "yes"}},
        )
    )
    probe = {
        "exec": {"command": ["grep", "-qx", "yes", "/flag/ready"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    container = shell(
        "main",
        "exec sleep 1000",
        readinessProbe=probe,
        volumeMounts=[{"name": "flag", "mountPath": "/flag"}],
    )
    await bed.kube.create(
        pod(
            "probed",
            bed.namespace,
            bed.nodes[1],
            [container],
            volumes=[{"name": "flag", "configMap": {"name": "flag"}}],
        )
    )
    await wait_pod(bed, "probed", is_ready, "Ready")
    await bed.kube.patch(ConfigMap, "flag", {"data": {"ready": "no"}}, namespace=bed.namespace)
    current = await wait_pod(bed, "probed", lambda p: condition(p, "Ready") == "False", "NotReady")
    assert condition(current, "ContainersReady") == "False"
    assert current.status is not None
    assert current.status.phase == "Running"
    assert container_status(current, "main").ready is False
    await bed.kube.patch(ConfigMap, "flag", {"data": {"ready": "yes"}}, namespace=bed.namespace)
    await wait_pod(bed, "probed", is_ready, "Ready again")


async def test_a_failing_liveness_probe_restarts_the_container(bed: LocalBed) -> None:
    container = shell(
        "main",
        "touch /tmp/alive; sleep 1; rm /tmp/alive; exec sleep 1000",
        livenessProbe={
            "exec": {"command": ["test", "-f", "/tmp/alive"]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
    )
    await bed.kube.create(pod("live", bed.namespace, bed.nodes[0], [container]))
    current = await wait_pod(
        bed, "live", lambda p: container_status(p, "main").restartCount >= 1, "a restart"
    )
    assert container_status(current, "main").lastState.terminated is not None

    async def unhealthy_event() -> bool:
        events = [
            e
            async for e in bed.kube.list(
                Event, namespace=bed.namespace, fields={"involvedObject.name": "live"}
            )
        ]
        return any(
            e.reason == "Unhealthy" and "Liveness probe failed" in (e.message or "") for e in events
        )

    await wait_for("an Unhealthy event", unhealthy_event)


async def test_http_and_tcp_probes_and_service_names(bed: LocalBed) -> None:
    server = (
        "use IO::Socket::INET;"
        " my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 5, ReuseAddr => 1) or die;"
        " while (my $c = $s->accept) {"
        ' <$c>; print $c "HTTP/1.0 200 OK\\r\\n\\r\\nhello from $ENV{HOSTNAME}\\n"; close $c }'
    )
    web = {
        "name": "web",
        "image": "perl",
        "command": ["perl", "-e", server],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
        "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        # Liveness and readiness wait until this succeeds.
        "startupProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1, "failureThreshold": 30},
    }
    body = pod("web", bed.namespace, bed.nodes[0], [web])
    assert body.metadata is not None
    body.metadata.labels = {"app": "web"}
    await bed.kube.create(body)
    await bed.kube.create(
        build(
            Service,
            {
                "metadata": {"name": "web", "namespace": bed.namespace},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
            },
        )
    )
    server_pod = await wait_pod(bed, "web", is_ready, "Ready (HTTP probe)")
    assert server_pod.status is not None
    assert container_status(server_pod, "web").started is True
    # A ClusterIP Service resolves to its ready endpoint (no kube-proxy); pod to pod
    # over the bridge.
    client = shell(
        "main",
        "until getent hosts web >/dev/null; do sleep 0.1; done; getent hosts web; curl -s http://web:8080/",
    )
    await bed.kube.create(
        pod("client", bed.namespace, bed.nodes[1], [client], restartPolicy="Never")
    )
    await wait_pod(bed, "client", phase_is("Succeeded"), "Succeeded")
    out = bed.log("client")
    assert out.split()[0] == server_pod.status.podIP
    assert "hello from web" in out


# ---------------------------------------------------------------- deletion


async def test_deletion_honours_the_grace_period_and_prestop(bed: LocalBed) -> None:
    marks = Path(tempfile.mkdtemp(prefix="sunk-lr-marks-", dir="/tmp"))
    try:
        container = shell(
            "main",
            "trap 'echo TERM' TERM; while true; do sleep 0.1; done",
            lifecycle={
                "preStop": {"exec": {"command": ["sh", "-c", "echo stopping > /marks/prestop"]}}
            },
            volumeMounts=[{"name": "marks", "mountPath": "/marks"}],
        )
        await bed.kube.create(
            pod(
                "stubborn",
                bed.namespace,
                bed.nodes[1],
                [container],
                terminationGracePeriodSeconds=3,
                volumes=[{"name": "marks", "hostPath": {"path": str(marks), "type": "Directory"}}],
            )
        )
        await wait_pod(bed, "stubborn", is_ready, "Ready")
        pids = bed.runtime.container_pids(bed.namespace, "stubborn", "main")
        assert pids
        deleted = time.monotonic()
        await bed.kube.delete(Pod, "stubborn", namespace=bed.namespace)
        await asyncio.sleep(1.5)
        assert any(map(alive, pids)), "killed before the grace period"
        while any(map(alive, pids)):
            assert time.monotonic() - deleted < 3 + 1.0, "still running after the grace period"
            await asyncio.sleep(0.05)

        async def gone() -> bool:
            try:
                await get_pod(bed, "stubborn")
                return False
            except ApiError as exc:
                return exc.status.code == 404

        await wait_for("the pod object to be finalized", gone, timeout=5)
        assert (marks / "prestop").read_text() == "stopping\n"
        assert "TERM" in bed.log("stubborn")
    finally:
        shutil.rmtree(marks, ignore_errors=True)


# ------------------------------------------------------ environment, volumes


async def test_env_volumes_init_containers_and_token(bed: LocalBed) -> None:
    ns = bed.namespace
    await bed.kube.create(
        build(
            ConfigMap,
            {
                "metadata": {"name": "settings", "namespace": ns},
                "data": {"color": "blue", "size": "L"},
            },
        )
    )
    await bed.kube.create(
        build(
            Secret,
            {"metadata": {"name": "creds", "namespace": ns}, "stringData": {"password": "s3cret"}},
        )
    )
    script = (
        'echo "name=$MY_NAME ip=$MY_IP node=$MY_NODE color=$COLOR pass=$PASSWORD"'
        ' "cfg_size=$CFG_size mem=$MEM"; '
        'echo "expanded=$EXPANDED"; echo "args=$0 $1"; '
        "cat /order/log; cat /settings/shade; echo; stat -L -c %a /creds/password; "
        "cat /info/labels; echo; "
        "hostname; grep -c . /var/run/secrets/kubernetes.io/serviceaccount/ca.crt; "
        "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; "
        "cut -d. -f2 /var/run/secrets/kubernetes.io/serviceaccount/token"
    )
    main = {
        "name": "main",
        "image": "debian",
        "command": ["sh", "-c", script],
        "args": ["$(COLOR)", "$$(COLOR)"],
        "env": [
            {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {
                "name": "COLOR",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "color"}},
            },
            {
                "name": "PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}},
            },
            {
                "name": "MEM",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {"name": "EXPANDED", "value": "$(COLOR)-$(MY_NAME)-$(MISSING)"},
        ],
        "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
        "resources": {"limits": {"memory": "64Mi", "cpu": "500m"}},
        "volumeMounts": [
            {"name": "order", "mountPath": "/order"},
            {"name": "settings", "mountPath": "/settings"},
            {"name": "creds", "mountPath": "/creds"},
            {"name": "info", "mountPath": "/info"},
        ],
    }
    init = [
        shell(
            "first",
            "echo first >> /order/log",
            volumeMounts=[{"name": "order", "mountPath": "/order"}],
        ),
        shell(
            "second",
            "echo second >> /order/log",
            volumeMounts=[{"name": "order", "mountPath": "/order"}],
        ),
    ]
    spec_pod = pod(
        "envy",
        ns,
        bed.nodes[2],
        [main],
        restartPolicy="Never",
        hostname="custom-host",
        initContainers=init,
        volumes=[
            {"name": "order", "emptyDir": {}},
            {
                "name": "settings",
                "configMap": {"name": "settings", "items": [{"key": "color", "path": "shade"}]},
            },
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
            {
                "name": "info",
                "downwardAPI": {
                    "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                },
            },
        ],
    )
    assert spec_pod.metadata is not None
    spec_pod.metadata.labels = {"tier": "test"}
    await bed.kube.create(spec_pod)
    done = await wait_pod(bed, "envy", phase_is("Succeeded"), "Succeeded")
    assert done.status is not None
    lines = bed.log("envy", "main").splitlines()
    assert lines[0] == (
        f"name=envy ip={done.status.podIP} node={bed.nodes[2]} color=blue pass=s3cret"
        " cfg_size=L mem=64"
    )
    assert lines[1] == "expanded=blue-envy-$(MISSING)"
    assert lines[2] == "args=blue $(COLOR)"
    assert lines[3:5] == ["first", "second"]
    assert lines[5] == "blue"
    assert lines[6] == "400"
    assert lines[7] == 'tier="test"'
    assert lines[8] == "custom-host"
    assert int(lines[9]) > 1  # the cluster CA
    assert lines[10] == bed.namespace
    claims = json.loads(base64.urlsafe_b64decode(lines[11] + "=" * (-len(lines[11]) % 4)))
    assert claims["kubernetes.io"]["pod"]["name"] == "envy"  # a token bound to the pod
    assert claims["kubernetes.io"]["node"]["name"] == bed.nodes[2]
    status = container_status(done, "main")
    assert status.state.terminated.exitCode == 0
    assert status.state.terminated.reason == "Completed"
    assert condition(done, "Initialized") == "True"
    assert condition(done, "Ready") == "False"

    # cpu/memory limits: enforced only with delegated cgroup v2 controllers.
    if not bed.runtime.env.cgroups.limits:

        async def reported() -> bool:
            events = [
                e
                async for e in bed.kube.list(
                    Event, namespace=ns, fields={"involvedObject.name": "envy"}
                )
            ]
            return any(e.reason == "LimitsNotEnforced" for e in events)

        await wait_for("a LimitsNotEnforced event", reported)


async def test_pods_reach_the_apiserver_with_their_token(bed: LocalBed) -> None:
    # In-cluster config: KUBERNETES_SERVICE_HOST, the CA and the projected token.
    script = (
        "cd /var/run/secrets/kubernetes.io/serviceaccount && curl -sS --cacert ca.crt"
        ' -H "Authorization: Bearer $(cat token)" -H "Content-Type: application/json"'
        ' -d \'{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}\''
        " https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
        "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    )
    await bed.kube.create(
        pod(
            "incluster", bed.namespace, bed.nodes[1], [shell("main", script)], restartPolicy="Never"
        )
    )
    await wait_pod(bed, "incluster", phase_is("Succeeded"), "Succeeded")
    review = json.loads(bed.log("incluster"))
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{bed.namespace}:default"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["incluster"]


async def test_a_failed_init_container_fails_a_never_restarting_pod(bed: LocalBed) -> None:
    await bed.kube.create(
        pod(
            "bad-init",
            bed.namespace,
            bed.nodes[0],
            [shell("main", "echo never")],
            restartPolicy="Never",
            initContainers=[shell("init", "exit 7")],
        )
    )
    done = await wait_pod(bed, "bad-init", phase_is("Failed"), "Failed")
    assert container_status(done, "init").state.terminated.exitCode == 7
    assert container_status(done, "main").state.waiting is not None
    assert condition(done, "Initialized") == "False"


async def test_pods_over_allocatable_are_refused(bed: LocalBed) -> None:
    hungry = shell("main", "sleep 1000", resources={"requests": {"cpu": "64"}})
    await bed.kube.create(pod("hungry", bed.namespace, bed.nodes[0], [hungry]))
    rejected = await wait_pod(bed, "hungry", phase_is("Failed"), "Failed")
    assert rejected.status is not None
    assert rejected.status.reason == "OutOfcpu"
    assert "Node didn't have enough resource: cpu, requested: 64000" in (
        rejected.status.message or ""
    )
    gpus = shell(
        "main", "echo $NVIDIA_VISIBLE_DEVICES", resources={"limits": {"nvidia.com/gpu": "2"}}
    )
    await bed.kube.create(pod("gpu", bed.namespace, bed.nodes[2], [gpus], restartPolicy="Never"))
    await wait_pod(bed, "gpu", phase_is("Succeeded"), "Succeeded")
    assert bed.log("gpu") == "0,1\n"


async def test_host_network_pods_use_the_node_address(bed: LocalBed) -> None:
    await bed.kube.create(
        pod(
            "hostnet",
            bed.namespace,
            bed.nodes[1],
            [shell("main", "hostname")],
            hostNetwork=True,
            restartPolicy="Never",
        )
    )
    done = await wait_pod(bed, "hostnet", phase_is("Succeeded"), "Succeeded")
    assert done.status is not None
    assert done.status.podIP == done.status.hostIP == bed.runtime.subnet.node_address(2)
    assert bed.log("hostnet") == f"{bed.nodes[1]}\n"


async def test_a_claim_is_provisioned_locally_and_bound_through_the_scheduler(
    bed: LocalBed,
) -> None:
    ns = bed.namespace
    await bed.kube.create(
        build(
            PersistentVolumeClaim,
            {
                "metadata": {"name": "data", "namespace": ns},
                "spec": {
                    "storageClassName": "sunk-local",
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "10Mi"}},
                },
            },
        )
    )
    writer = shell(
        "main", "echo kept > /data/file", volumeMounts=[{"name": "data", "mountPath": "/data"}]
    )
    await bed.kube.create(
        pod(
            "writer",
            ns,
            None,  # the scheduler picks the node; the claim follows it
            [writer],
            restartPolicy="Never",
            nodeSelector={"kubernetes.io/hostname": bed.nodes[1]},
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        )
    )
    await wait_pod(bed, "writer", phase_is("Succeeded"), "Succeeded", timeout=30)
    claim = await bed.kube.get(PersistentVolumeClaim, "data", namespace=ns)
    assert claim.status is not None
    assert claim.status.phase == "Bound"
    assert claim.spec is not None
    volume = await bed.kube.get(PersistentVolume, claim.spec.volumeName or "")
    assert volume.spec is not None
    assert volume.spec.local is not None
    path = Path(volume.spec.local.path)
    assert (path / "file").read_text() == "kept\n"
    terms = volume.spec.nodeAffinity.required.nodeSelectorTerms
    assert terms[0].matchExpressions[0].values == [bed.nodes[1]]
    # Reclaim policy Delete: claim gone -> volume and directory gone.
    await bed.kube.delete(Pod, "writer", namespace=ns)
    await bed.kube.delete(PersistentVolumeClaim, "data", namespace=ns)

    async def reclaimed() -> bool:
        try:
            await bed.kube.get(PersistentVolume, volume.metadata.name if volume.metadata else "")
            return False
        except ApiError:
            return not exists(path)

    await wait_for("the volume to be reclaimed", reclaimed, timeout=30)


async def test_a_cordoned_node_gets_no_new_pods_from_the_scheduler(bed: LocalBed) -> None:
    node = bed.nodes[0]
    await bed.kube.patch(Node, node, {"spec": {"unschedulable": True}})
    try:
        await bed.kube.create(
            pod(
                "placed",
                bed.namespace,
                None,
                [shell("main", "sleep 1000")],
                nodeSelector={"kubernetes.io/hostname": node},
            )
        )

        def unschedulable(p: Pod) -> bool:
            return condition(p, "PodScheduled") == "False"

        current = await wait_pod(bed, "placed", unschedulable, "unschedulable")
        assert current.spec is not None
        assert current.spec.nodeName is None
    finally:
        await bed.kube.patch(Node, node, {"spec": {"unschedulable": False}})
    current = await wait_pod(bed, "placed", is_ready, "Ready after uncordon")
    assert current.spec is not None
    assert current.spec.nodeName == node


async def test_logs_command_shows_container_output(bed: LocalBed) -> None:
    await bed.kube.create(
        pod(
            "chatty",
            bed.namespace,
            bed.nodes[0],
            [shell("main", "echo out; echo err >&2"), shell("side", "echo side")],
            restartPolicy="Never",
            initContainers=[shell("init", "echo init")],
        )
    )
    await wait_pod(bed, "chatty", phase_is("Succeeded"), "Succeeded")
    runner = CliRunner()
    base = ["local", "logs", "chatty", "-n", bed.namespace, "--state", str(bed.state)]
    result = runner.invoke(app, base)
    assert result.exit_code == 0, result.output
    assert "out\nerr\n" in result.output  # stdout and stderr, like kubectl logs
    assert 'Defaulted container "main" out of: init, main, side' in result.output
    for container, text in (("init", "init\n"), ("side", "side\n")):
        result = runner.invoke(app, [*base, "-c", container])
        assert result.exit_code == 0, result.output
        assert result.output == text
    result = runner.invoke(app, [*base, "-c", "nope"])
    assert result.exit_code == 1
    result = runner.invoke(
        app, ["local", "logs", "nope", "-n", bed.namespace, "--state", str(bed.state)]
    )
    assert result.exit_code == 1
    assert 'pod "nope" not found' in result.output


# ------------------------------------------------------------ node failure


async def test_a_stopped_node_goes_not_ready_and_comes_back(bed: LocalBed) -> None:
    node = bed.nodes[2]
    await bed.kube.create(pod("survivor", bed.namespace, node, [shell("main", "exec sleep 1000")]))
    before = await wait_pod(bed, "survivor", is_ready, "Ready")
    pids = bed.runtime.container_pids(bed.namespace, "survivor", "main")
    assert pids
    stopped = time.monotonic()
    await bed.runtime.stop_node(node)
    assert not any(map(alive, pids))  # power off: its pods are gone

    async def not_ready() -> bool:
        return condition(await bed.kube.get(Node, node), "Ready") != "True"

    await wait_for("the node to go NotReady", not_ready, timeout=30)
    print(f"NotReady {time.monotonic() - stopped:.1f}s after the node stopped")
    # The node lifecycle controller marks the pods of a NotReady node not ready.
    await wait_pod(bed, "survivor", lambda p: not is_ready(p), "marked NotReady")
    await bed.runtime.start_node(node)

    async def ready() -> bool:
        return condition(await bed.kube.get(Node, node), "Ready") == "True"

    await wait_for("the node to be Ready again", ready, timeout=20)
    # A reboot: the pod runs again, its restart count continues.
    current = await wait_pod(
        bed,
        "survivor",
        lambda p: is_ready(p) and container_status(p, "main").restartCount == 1,
        "running again after the node's restart",
        timeout=30,
    )
    assert current.status is not None
    assert before.status is not None
    assert current.status.podIP == before.status.podIP
    # The slurmd pod on that node came back too, and Slurm has it again.
    if bed.runtime.container_pids(bed.namespace, "slurmd-3", "slurmd"):
        await wait_pod(bed, "slurmd-3", is_ready, "slurmd Ready again", timeout=30)


async def test_a_ready_condition_marked_unknown_is_posted_again_at_once(bed: LocalBed) -> None:
    """After late heartbeats the node lifecycle controller marks Ready Unknown; a live
    runtime posts its status again at once (as kubelet does), not a status interval later."""
    node = bed.nodes[1]
    # What kube-controller-manager writes (conditions merge by type).
    unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
    await bed.kube.patch(Node.Status, node, {"status": {"conditions": [unknown]}})
    assert condition(await bed.kube.get(Node, node), "Ready") == "Unknown"

    async def ready() -> bool:
        return condition(await bed.kube.get(Node, node), "Ready") == "True"

    # The runtime's full status interval is 60 s; its lease renewals come every 2 s.
    await wait_for("the runtime to post Ready again", ready, timeout=15)


# ------------------------------------------------------------------ cleanup


def abandon(runtime: LocalRuntime) -> None:
    """What a crash does to a runtime: its tasks stop, nothing is cleaned up, the lock goes."""
    tasks = [
        *runtime.env.hosts._tasks,
        *(runtime._provisioner._tasks if runtime._provisioner else []),
    ]
    for node in runtime.nodes.values():
        tasks += node._tasks
        tasks += [w.task for w in node.workers.values() if w.task is not None]
    for task in tasks:
        task.cancel()
    if runtime._relay is not None and runtime._relay._server is not None:
        runtime._relay._server.close()  # a dead process's sockets close
    assert runtime._lock is not None
    runtime._lock.close()


def leftovers(state: Path, tag: str) -> list[str]:
    found = [f"process {p}" for p in pids_rooted_at(state / "root")]
    found += [f"netns {n}" for n in netns_names(f"sk-{tag}-")]
    found += [f"link {n}" for n in link_names(f"sk{tag}")]
    mounts = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True
    ).stdout
    found += [f"mount {m}" for m in mounts.splitlines() if str(state) in m or f"sk-{tag}-" in m]
    return found


async def test_a_crashed_runtime_is_cleaned_up_by_the_next_start_and_stop_leaves_nothing(
    bed: LocalBed, kube_control_plane: KubeControlPlane, kube_access: KubeAccess
) -> None:
    state = bed.state / "crash"
    netns_was_mounted = is_mount_point("/run/netns")
    config = RuntimeConfig(
        state_dir=state, rootfs=bed.runtime.config.rootfs, nodes=[NodeConfig(f"{bed.nodes[0]}-c")]
    )
    identities = ControlPlaneIdentities(kube_control_plane, kube_access.admin_kubeconfig)
    first = LocalRuntime(config, identities)
    await first.start()
    tag = first.tag
    # Two beds side by side: their own names and their own /16.
    assert tag != bed.runtime.tag
    assert first.subnet.network != bed.runtime.subnet.network
    await bed.kube.create(
        pod("doomed", bed.namespace, f"{bed.nodes[0]}-c", [shell("main", "exec sleep 1000")])
    )
    await wait_pod(bed, "doomed", is_ready, "Ready")
    pids = first.container_pids(bed.namespace, "doomed", "main")
    assert pids
    assert leftovers(state, tag)  # a process, a namespace, a veth, the bridge
    abandon(first)
    removed = await asyncio.to_thread(cleanup, state)
    assert any(r.startswith("netns") for r in removed)
    assert any(r.startswith(("process", "cgroup")) for r in removed)
    assert not any(map(alive, pids))
    assert leftovers(state, tag) == []
    # And a normal start/stop cycle leaves nothing behind either.
    second = LocalRuntime(config, identities)
    await second.start()
    await wait_pod(bed, "doomed", is_ready, "Ready on the restarted runtime")
    await bed.kube.delete(Pod, "doomed", namespace=bed.namespace, grace_period=0)
    await second.stop(delete_nodes=True)
    assert leftovers(state, tag) == []
    if not netns_was_mounted and not netns_names(""):
        assert not is_mount_point("/run/netns")
