"""Unit tests of the local runtime's pure pieces (no cluster, no root needed)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod, Service
from lightkube.resources.discovery_v1 import EndpointSlice

from sunk.local import plan
from sunk.local.hosts import hosts_file, service_entries
from sunk.local.ledger import NETNS, Ledger
from sunk.local.logs import LogNotFound, find_log, write_containers
from sunk.local.net import Subnet, pick_subnet
from sunk.local.node import kubelet_may_set
from sunk.local.port import build
from sunk.local.probes import ProbeState
from sunk.local.status import BackOff, ContainerView, Terminated, pod_conditions, pod_phase
from sunk.local.volumes import write_atomic
from sunk.testbed.sandbox import resolve_in_root


def make_pod(spec: dict[str, Any], **meta: Any) -> Pod:
    metadata = {"name": "p", "namespace": "ns", "uid": "u-1", **meta}
    return build(Pod, {"metadata": metadata, "spec": spec})


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "image": "x", **fields}


# ------------------------------------------------------------------ expand


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-2"),
        ("$$(A)", "$(A)"),
        ("$(MISSING)", "$(MISSING)"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("$$$(A)", "$1"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert plan.expand(text, {"A": "1", "B": "2"}) == expected


# --------------------------------------------------------------------- env


def test_container_env_orders_sources_and_resolves_references() -> None:
    pod = make_pod(
        {
            "nodeName": "n1",
            "containers": [
                container(
                    envFrom=[{"configMapRef": {"name": "cm"}, "prefix": "P_"}],
                    env=[
                        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "P_a", "value": "overridden-$(NAME)"},
                        {
                            "name": "S",
                            "valueFrom": {"secretKeyRef": {"name": "sec", "key": "k"}},
                        },
                        {
                            "name": "OPT",
                            "valueFrom": {
                                "configMapKeyRef": {"name": "cm", "key": "nope", "optional": True}
                            },
                        },
                        {
                            "name": "CPU",
                            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}},
                        },
                    ],
                )
            ],
        },
        labels={"app": "x"},
    )
    fetched = plan.Fetched(config_maps={"cm": {"a": b"1", "b": b"2"}}, secrets={"sec": {"k": b"v"}})
    ctx = plan.PodContext("10.0.0.5", "10.0.0.1", {"cpu": Decimal("3.5")})
    assert pod.spec is not None
    env = plan.container_env(pod, pod.spec.containers[0], fetched, ctx)
    assert env == {
        "P_a": "overridden-p",
        "P_b": "2",
        "NAME": "p",
        "IP": "10.0.0.5",
        "S": "v",
        "CPU": "4",
    }


def test_missing_references_are_config_errors_unless_optional() -> None:
    pod = make_pod({"containers": [container(envFrom=[{"secretRef": {"name": "gone"}}])]})
    assert pod.spec is not None
    with pytest.raises(plan.ConfigError, match="secret 'gone' not found") as err:
        plan.container_env(
            pod,
            pod.spec.containers[0],
            plan.Fetched(secrets={"gone": None}),
            plan.PodContext("", ""),
        )
    assert err.value.reason == "CreateContainerConfigError"


def test_argv_needs_a_command_since_images_are_ignored() -> None:
    pod = make_pod({"containers": [container(args=["slurmd", "-N", "$(X)"])]})
    assert pod.spec is not None
    assert plan.container_argv(pod.spec.containers[0], {"X": "n"}) == ["slurmd", "-N", "n"]
    with pytest.raises(plan.ConfigError, match="no command"):
        plan.container_argv(
            build(Pod, {"spec": {"containers": [container()]}}).spec.containers[0], {}
        )  # type: ignore[union-attr]


# ------------------------------------------------------ resources, admission


def test_pod_requests_count_sidecars_and_the_largest_init_container() -> None:
    pod = make_pod(
        {
            "initContainers": [
                container(
                    name="side", restartPolicy="Always", resources={"requests": {"cpu": "100m"}}
                ),
                container(name="big", resources={"requests": {"cpu": "2", "memory": "1Gi"}}),
            ],
            "containers": [container(resources={"requests": {"cpu": "500m", "memory": "64Mi"}})],
        }
    )
    requests = plan.pod_requests(pod)
    assert requests["cpu"] == Decimal("2.1")  # init "big" + the sidecar started before it
    assert requests["memory"] == Decimal(1024**3)


def test_admission_refuses_over_allocatable_like_kubelet() -> None:
    allocatable = {"cpu": Decimal(2), "memory": Decimal(2**30), "pods": Decimal(2)}
    running = make_pod({"containers": [container(resources={"requests": {"cpu": "1500m"}})]})
    newcomer = make_pod(
        {"containers": [container(resources={"requests": {"cpu": "1"}})]}, uid="u-2"
    )
    rejection = plan.admit(newcomer, [running], allocatable, {}, "n")
    assert rejection is not None
    assert rejection.reason == "OutOfcpu"
    assert rejection.message == (
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000, used: 1500, "
        "capacity: 2000"
    )
    gpu = make_pod(
        {
            "containers": [
                container(
                    resources={
                        "limits": {"nvidia.com/gpu": "1"},
                        "requests": {"nvidia.com/gpu": "1"},
                    }
                )
            ]
        }
    )
    refused = plan.admit(gpu, [], allocatable, {}, "n")
    assert refused is not None
    assert refused.reason == "OutOfnvidia.com/gpu"
    assert plan.admit(newcomer, [], allocatable, {}, "n") is None
    assert plan.admit(newcomer, [running, running], allocatable, {}, "n") == plan.Rejection(
        "OutOfpods",
        "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, "
        "capacity: 2",
    )


def test_node_affinity_is_checked_at_admission() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
                ]
            }
        }
    }
    pod = make_pod(
        {"containers": [container()], "affinity": affinity, "nodeSelector": {"gpu": "yes"}}
    )
    assert plan.node_matches(pod, {"gpu": "yes", "zone": "a"}, "n1")
    assert plan.node_matches(pod, {"gpu": "yes"}, "n9")
    assert not plan.node_matches(pod, {"gpu": "yes", "zone": "b"}, "n1")
    assert not plan.node_matches(pod, {"zone": "a"}, "n1")


def test_kubelet_label_restrictions() -> None:
    assert kubelet_may_set("topology.kubernetes.io/zone")
    assert kubelet_may_set("node.kubernetes.io/instance-type")
    assert kubelet_may_set("sunk.dev/rack")
    assert not kubelet_may_set("node-role.kubernetes.io/gpu")
    assert not kubelet_may_set("example.k8s.io/x")


# ------------------------------------------------------------------ volumes


def test_projected_volume_files_with_items_modes_and_token() -> None:
    volume = {
        "name": "v",
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}},
                {
                    "configMap": {
                        "name": "cm",
                        "items": [{"key": "a", "path": "dir/a", "mode": 0o600}],
                    }
                },
                {"secret": {"name": "sec", "optional": True}},
                {
                    "downwardAPI": {
                        "items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                    }
                },
            ],
        },
    }
    pod = make_pod({"containers": [container()], "volumes": [volume]})
    assert plan.token_requests(pod) == {plan.TokenSpec("", 600)}
    assert plan.references(pod) == {plan.Ref("ConfigMap", "cm"), plan.Ref("Secret", "sec")}
    fetched = plan.Fetched(
        config_maps={"cm": {"a": b"A"}},
        secrets={"sec": None},
        tokens={plan.TokenSpec("", 600): "tok"},
    )
    assert pod.spec is not None
    files = plan.volume_files(pod.spec.volumes[0], pod, fetched, plan.PodContext("", ""))
    assert files == {"token": (b"tok", 0o440), "dir/a": (b"A", 0o600), "ns": (b"ns", 0o440)}


def test_volume_item_paths_cannot_escape() -> None:
    volume = {"name": "v", "configMap": {"name": "cm", "items": [{"key": "a", "path": "../etc/x"}]}}
    pod = make_pod({"containers": [container()], "volumes": [volume]})
    assert pod.spec is not None
    with pytest.raises(plan.ConfigError, match="invalid volume item path"):
        plan.volume_files(
            pod.spec.volumes[0],
            pod,
            plan.Fetched(config_maps={"cm": {"a": b""}}),
            plan.PodContext("", ""),
        )


def test_binds_follow_volume_mounts_parents_first(tmp_path: Path) -> None:
    c = build(
        Pod,
        {
            "spec": {
                "containers": [
                    container(
                        volumeMounts=[
                            {
                                "name": "key",
                                "mountPath": "/etc/munge/munge.key",
                                "subPath": "munge.key",
                            },
                            {"name": "etc", "mountPath": "/etc/munge", "readOnly": True},
                        ]
                    )
                ]
            }
        },
    ).spec.containers[0]  # type: ignore[union-attr]
    binds = plan.container_binds(c, {"key": tmp_path / "k", "etc": tmp_path / "e"}, ["key"])
    assert [(b.target, b.read_only) for b in binds] == [
        ("/etc/munge", True),
        ("/etc/munge/munge.key", True),
    ]
    assert binds[1].source == tmp_path / "k" / "munge.key"


def test_atomic_writer_swaps_whole_sets(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    write_atomic(target, {"a": (b"1", 0o644), "d/b": (b"2", 0o600)})
    assert (target / "a").read_text() == "1"
    assert (target / "d" / "b").read_text() == "2"
    assert os.readlink(target / "a") == "..data/a"
    first = os.readlink(target / "..data")
    write_atomic(target, {"a": (b"3", 0o644)})
    assert (target / "a").read_text() == "3"
    assert not (target / "d").exists()  # removed keys disappear
    assert not (target / first).exists()  # the old version is gone
    assert (target / "a").stat().st_mode & 0o777 == 0o644


# ----------------------------------------------------------------- lifecycle


def test_backoff_is_immediate_then_doubles_up_to_the_maximum() -> None:
    now = [100.0]
    backoff = BackOff(10, 40, lambda: now[0])
    assert not backoff.in_backoff_since("c", now[0])  # first restart: at once
    backoff.next("c")
    assert backoff.in_backoff_since("c", now[0])
    now[0] += 10
    assert not backoff.in_backoff_since("c", 100.0)
    for expected in (20, 40, 40):
        backoff.next("c")
        assert backoff.delay("c") == expected
    now[0] += 81  # untouched for 2 x maximum: starts over
    backoff.next("c")
    assert backoff.delay("c") == 10


def _term(code: int) -> Terminated:
    return Terminated(
        code, "Error" if code else "Completed", None, datetime.datetime.now(datetime.UTC)
    )


def test_pod_phase() -> None:
    running = ContainerView("a", "i", state="running")
    done = ContainerView("b", "i", state="terminated", terminated=_term(0))
    failed = ContainerView("c", "i", state="terminated", terminated=_term(1))
    looping = ContainerView(
        "d", "i", state="waiting", waiting_reason="CrashLoopBackOff", last=_term(1)
    )
    assert pod_phase("Always", True, [], [running, done]) == "Running"
    assert pod_phase("Never", True, [], [done]) == "Succeeded"
    assert pod_phase("Never", True, [], [done, failed]) == "Failed"
    assert pod_phase("OnFailure", True, [], [failed]) == "Running"  # will restart
    assert pod_phase("Always", True, [], [looping]) == "Running"
    init_failed = ContainerView("i", "i", init=True, state="terminated", terminated=_term(2))
    assert pod_phase("Never", False, [init_failed], [ContainerView("m", "i")]) == "Failed"
    assert pod_phase("Always", False, [init_failed], [ContainerView("m", "i")]) == "Pending"


def test_conditions_keep_transition_times_and_clear_stale_messages() -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    ready = ContainerView("a", "i", state="running", ready=True)
    previous = [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"},
        {"type": "Initialized", "status": "False", "message": "old"},
    ]
    out = {
        c["type"]: c
        for c in pod_conditions(
            previous,
            sandbox_ready=True,
            init_done=True,
            init=[],
            main=[ready],
            phase="Running",
            readiness_gates=[],
            now=now,
        )
    }
    assert out["Ready"]["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    assert out["Initialized"]["status"] == "True"
    assert out["Initialized"]["message"] is None  # deletes the stale message in the patch
    assert out["Initialized"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_probe_thresholds() -> None:
    state = ProbeState(success_threshold=2, failure_threshold=3, initial=False)
    assert not state.observe(True)
    assert state.observe(True)
    assert state.result
    assert not state.observe(False)
    assert not state.observe(False)
    assert state.observe(False)
    assert state.failing
    assert not state.result


# ------------------------------------------------------------------- hosts


def test_hosts_entries_for_headless_and_cluster_ip_services() -> None:
    services = [
        build(
            Service, {"metadata": {"name": "ctl", "namespace": "a"}, "spec": {"clusterIP": "None"}}
        ),
        build(
            Service,
            {"metadata": {"name": "web", "namespace": "b"}, "spec": {"clusterIP": "10.96.0.9"}},
        ),
        build(
            Service,
            {"metadata": {"name": "ext", "namespace": "a"}, "spec": {"type": "ExternalName"}},
        ),
    ]
    slices = {
        ("a", "ctl"): [
            build(
                EndpointSlice,
                {
                    "addressType": "IPv4",
                    "endpoints": [
                        {"addresses": ["10.1.0.3"], "hostname": "ctl-0"},
                        {"addresses": ["10.1.0.4"], "conditions": {"ready": False}},
                    ],
                },
            )
        ],
        ("b", "web"): [
            build(
                EndpointSlice,
                {
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": ["10.1.0.8"]}, {"addresses": ["10.1.0.7"]}],
                },
            )
        ],
    }
    entries = service_entries("a", services, slices)
    assert entries == [
        ("10.1.0.3", ["ctl", "ctl.a", "ctl.a.svc", "ctl.a.svc.cluster.local"]),
        (
            "10.1.0.3",
            ["ctl-0.ctl", "ctl-0.ctl.a", "ctl-0.ctl.a.svc", "ctl-0.ctl.a.svc.cluster.local"],
        ),
        # Another namespace: qualified names only; ClusterIP -> the lowest ready endpoint.
        ("10.1.0.7", ["web.b", "web.b.svc", "web.b.svc.cluster.local"]),
    ]
    text = hosts_file(
        "10.1.0.5", "p", "p.sub.a.svc.cluster.local", [("1.2.3.4", ["alias"])], entries
    )
    assert "10.1.0.5\tp.sub.a.svc.cluster.local p\n" in text
    assert "1.2.3.4\talias\n" in text


# -------------------------------------------------------- network, ledger, fs


def test_subnet_layout_and_choice() -> None:
    subnet = Subnet(ipaddress.IPv4Network("10.200.0.0/16"))
    assert subnet.gateway == "10.200.0.1"
    assert subnet.node_address(3) == "10.200.3.1"
    assert subnet.pod_address(3, 2) == "10.200.3.2"
    used = [ipaddress.IPv4Network("10.200.0.0/16"), ipaddress.IPv4Network("10.0.0.0/24")]
    assert pick_subnet(used, None) == ipaddress.IPv4Network("10.201.0.0/16")
    assert pick_subnet(used, ipaddress.IPv4Network("10.230.0.0/16")) == ipaddress.IPv4Network(
        "10.230.0.0/16"
    )


def test_ledger_replays_adds_and_removes_and_survives_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.add(NETNS, "a")
    ledger.add(NETNS, "b", pod="x")
    ledger.remove(NETNS, "a")
    ledger.close()
    with path.open("a") as out:
        out.write('{"op": "add", "kind"')  # a crash mid-write
    again = Ledger(path)
    assert list(again.entries(NETNS)) == [("b", {"pod": "x"})]
    again.compact()
    again.close()
    assert len(path.read_text().splitlines()) == 1


def test_bind_targets_resolve_symlinks_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("/run")
    (tmp_path / "var" / "lock").symlink_to("../run/lock")
    assert resolve_in_root(tmp_path, "/var/run/secrets/x") == "/run/secrets/x"
    assert resolve_in_root(tmp_path, "/var/lock/y") == "/run/lock/y"
    assert resolve_in_root(tmp_path, "/etc/munge") == "/etc/munge"


def test_find_log_picks_the_newest_pod_and_the_first_app_container(tmp_path: Path) -> None:
    pod_dir = tmp_path / "ns_web_uid1"
    for name, files in (("app", {"0": "first\n", "1": "second\n"}), ("init", {"0": "i"})):
        (pod_dir / "logs" / name).mkdir(parents=True)
        for stem, text in files.items():
            (pod_dir / "logs" / name / f"{stem}.log").write_text(text)
    write_containers(pod_dir, ["init"], ["app"])
    found = find_log(tmp_path, "ns", "web")
    assert found.container == "app"
    assert found.path.read_text() == "second\n"
    assert found.defaulted_from == ["init", "app"]
    assert find_log(tmp_path, "ns", "web", previous=True).path.read_text() == "first\n"
    assert find_log(tmp_path, "ns", "web", "init").path.read_text() == "i"
    with pytest.raises(LogNotFound):
        find_log(tmp_path, "ns", "other")
