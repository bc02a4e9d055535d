"""NodeSet's pure pieces: node feasibility, ownership, Slurm identity and the pod builder."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.models.core_v1 import (
    Container,
    Node,
    NodeAddress,
    NodeSpec,
    NodeStatus,
    PodSpec,
    ResourceRequirements,
    Taint,
)
from lightkube.models.meta_v1 import ObjectMeta

from sunk.api import (
    ANNOTATION_SLURMD_CONF,
    LABEL_NODE,
    LABEL_NODESET,
    LABEL_TEMPLATE_HASH,
    RESOURCE_NODE_GPUS,
)
from sunk.api import nodeset as api
from sunk.nodeset.feasibility import feasible
from sunk.nodeset.ownership import Claimant, assign
from sunk.nodeset.pods import (
    DAEMON_TOLERATIONS,
    NodeSetRef,
    SpecError,
    build_pod,
    gpu_plugin_not_serving,
    gpu_type,
    pod_requests,
    slurm_node_name,
    slurmd_conf,
    template_hash,
)


def node(
    name: str = "n1",
    labels: dict[str, str] | None = None,
    taints: list[Taint] | None = None,
    allocatable: dict[str, str] | None = None,
    ip: str | None = None,
) -> Node:
    return Node(
        metadata=ObjectMeta(name=name, labels=labels or {}),
        spec=NodeSpec(taints=taints),
        status=NodeStatus(
            allocatable=allocatable,
            addresses=[NodeAddress(type="InternalIP", address=ip)] if ip else None,
        ),
    )


def pod_spec(**fields: Any) -> PodSpec:
    spec = PodSpec.from_dict({"containers": [{"name": "slurmd"}], **fields})
    assert isinstance(spec, PodSpec)
    return spec


def term(
    *expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"matchExpressions": list(expressions), "matchFields": fields or []}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


class TestFeasibility:
    def test_node_selector(self) -> None:
        spec = pod_spec(nodeSelector={"gpu": "h100"})
        assert feasible(spec, node(labels={"gpu": "h100"})).ok
        verdict = feasible(spec, node(labels={"gpu": "a100"}))
        assert not verdict.ok
        assert "gpu=h100" in verdict.reason

    @pytest.mark.parametrize(
        ("expression", "labels", "ok"),
        [
            ({"key": "pool", "operator": "In", "values": ["a", "b"]}, {"pool": "b"}, True),
            ({"key": "pool", "operator": "In", "values": ["a"]}, {}, False),
            ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {}, True),
            ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {"pool": "a"}, False),
            ({"key": "pool", "operator": "Exists"}, {"pool": ""}, True),
            ({"key": "pool", "operator": "DoesNotExist"}, {"pool": "x"}, False),
            ({"key": "gpus", "operator": "Gt", "values": ["4"]}, {"gpus": "8"}, True),
            ({"key": "gpus", "operator": "Lt", "values": ["4"]}, {"gpus": "8"}, False),
            ({"key": "gpus", "operator": "Gt", "values": ["4"]}, {"gpus": "many"}, False),
        ],
    )
    def test_required_affinity_operators(
        self, expression: dict[str, Any], labels: dict[str, str], ok: bool
    ) -> None:
        assert feasible(pod_spec(affinity=required(term(expression))), node(labels=labels)).ok is ok

    def test_terms_are_ored_and_an_empty_term_matches_nothing(self) -> None:
        spec = pod_spec(
            affinity=required(term(), term({"key": "pool", "operator": "In", "values": ["b"]}))
        )
        assert feasible(spec, node(labels={"pool": "b"})).ok
        assert not feasible(pod_spec(affinity=required(term())), node()).ok

    def test_match_fields_on_the_node_name(self) -> None:
        pin = {"key": "metadata.name", "operator": "In", "values": ["n2"]}
        spec = pod_spec(affinity=required(term(fields=[pin])))
        assert feasible(spec, node("n2")).ok
        assert not feasible(spec, node("n1")).ok

    def test_taints_need_tolerations_but_prefer_no_schedule_does_not(self) -> None:
        gpu_taint = Taint(key="nvidia.com/gpu", effect="NoSchedule", value="present")
        soft = Taint(key="soft", effect="PreferNoSchedule")
        assert not feasible(pod_spec(), node(taints=[gpu_taint])).ok
        tolerant = pod_spec(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
        assert feasible(tolerant, node(taints=[gpu_taint, soft])).ok
        exact = pod_spec(
            tolerations=[{"key": "nvidia.com/gpu", "value": "absent", "effect": "NoSchedule"}]
        )
        assert not feasible(exact, node(taints=[gpu_taint])).ok

    def test_a_cordoned_or_locked_node_stays_feasible_for_slurmd(self) -> None:
        """Cordon and the node lock are Slurm's business: slurmd must stay under running jobs."""
        cordoned = node(
            taints=[
                Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"),
                Taint(key="sunk.dev/slurm-job", effect="NoExecute"),
            ]
        )
        assert not feasible(pod_spec(), cordoned).ok
        assert feasible(pod_spec(), cordoned, DAEMON_TOLERATIONS).ok

    def test_a_running_pod_stays_through_no_schedule_taints_but_not_no_execute(self) -> None:
        """DaemonSet rule: NoSchedule keeps new pods off, only NoExecute removes a running one."""
        lagging = node(taints=[Taint(key="node.kubernetes.io/unreachable", effect="NoSchedule")])
        assert not feasible(pod_spec(), lagging, DAEMON_TOLERATIONS).ok
        assert feasible(pod_spec(), lagging, DAEMON_TOLERATIONS, running=True).ok
        evicting = node(taints=[Taint(key="maintenance", effect="NoExecute")])
        assert not feasible(pod_spec(), evicting, DAEMON_TOLERATIONS, running=True).ok
        elsewhere = pod_spec(nodeSelector={"pool": "a"})
        assert not feasible(elsewhere, node(labels={"pool": "b"}), running=True).ok


class TestOwnership:
    old = Claimant("2026-01-01T00:00:00Z", "ns", "old")
    young = Claimant("2026-06-01T00:00:00Z", "ns", "young")

    def test_oldest_wins_and_the_other_reports_the_conflict(self) -> None:
        result = assign({self.young: ["n1", "n2"], self.old: ["n1"]})
        assert result.owner == {"n1": self.old, "n2": self.young}
        assert result.conflicts == {self.young: [("n1", self.old)]}
        assert result.nodes_of(self.young) == ["n2"]

    def test_the_incumbent_keeps_its_node(self) -> None:
        """Moving a node to another NodeSet would kill slurmd under running jobs."""
        result = assign({self.young: ["n1"], self.old: ["n1"]}, current={"n1": self.young})
        assert result.owner == {"n1": self.young}
        assert result.conflicts == {self.old: [("n1", self.young)]}

    def test_an_incumbent_that_no_longer_accepts_the_node_loses_it(self) -> None:
        result = assign({self.young: ["n1"]}, current={"n1": self.old})
        assert result.owner == {"n1": self.young}


class TestSlurmIdentity:
    def test_names_from_the_pattern(self) -> None:
        worker = node("Worker.1", ip="10.12.2.7")
        assert slurm_node_name("{nodeset}-{node}", "gpu", worker) == "gpu-worker-1"
        assert slurm_node_name("{nodeset}-{ip}", "gpu", worker) == "gpu-10-12-2-7"

    def test_a_name_too_long_is_a_spec_error_naming_the_field(self) -> None:
        with pytest.raises(SpecError, match=r"spec\.slurm\.nodeName"):
            slurm_node_name("{nodeset}-{node}", "x" * 60, node("abcdef"))
        with pytest.raises(SpecError, match=r"\{ip\}"):
            slurm_node_name("{ip}", "gpu", node())

    def test_conf_from_allocatable_and_labels(self) -> None:
        spec = api.SlurmNodeSpec(features=["ib"], features_from_labels=["zone"])
        worker = node(
            labels={"zone": "eu west", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            allocatable={"cpu": "7500m", "memory": "64Gi", "nvidia.com/gpu": "4"},
        )
        assert slurmd_conf("gpu", spec, worker) == (
            "Feature=gpu,ib,eu_west CPUs=7 RealMemory=65536 Gres=gpu:a100:4"
        )

    def test_conf_leaves_out_what_the_slurmd_pod_itself_requests(self) -> None:
        template = PodSpec(
            containers=[
                Container(
                    name="slurmd",
                    resources=ResourceRequirements(requests={"memory": "256Mi", "cpu": "500m"}),
                )
            ],
            initContainers=[
                Container(
                    name="munged",
                    restartPolicy="Always",
                    resources=ResourceRequirements(requests={"memory": "16Mi"}),
                ),
                # A one-off init container counts only while it runs, alone.
                Container(name="prepare", resources=ResourceRequirements(requests={"cpu": "1"})),
            ],
        )
        reserved = pod_requests(template)
        assert reserved == {"cpu": 1, "memory": 272 * 1024 * 1024}
        worker = node(allocatable={"cpu": "8", "memory": "64Gi"})
        spec = api.SlurmNodeSpec()
        assert slurmd_conf("cpu", spec, worker, reserved) == (
            f"Feature=cpu CPUs=7 RealMemory={64 * 1024 - 272}"
        )
        assert slurmd_conf("cpu", spec, worker, pod_requests(None)) == (
            f"Feature=cpu CPUs=8 RealMemory={64 * 1024}"
        )

    def test_conf_overrides(self) -> None:
        spec = api.SlurmNodeSpec.model_validate(
            {"resources": {"cpus": 2, "realMemoryMiB": 1000, "gres": ["gpu:2"]}}
        )
        worker = node(allocatable={"cpu": "64", "memory": "1Ti", "nvidia.com/gpu": "8"})
        assert slurmd_conf("cpu", spec, worker) == "Feature=cpu CPUs=2 RealMemory=1000 Gres=gpu:2"

    @pytest.mark.parametrize(
        ("product", "kind"),
        [
            ("NVIDIA-H100-80GB-HBM3", "h100"),
            ("Tesla-V100-SXM2-16GB", "v100"),
            ("NVIDIA-GB200", "gb200"),
        ],
    )
    def test_gpu_type(self, product: str, kind: str) -> None:
        assert gpu_type(product) == kind


class TestBuildPod:
    def spec(self, **template_spec: Any) -> api.NodeSetSpec:
        template = {
            "metadata": {"labels": {"app": "slurmd"}},
            "spec": {
                "containers": [
                    {"name": "munge", "image": "m"},
                    {
                        "name": "slurmd",
                        "image": "s",
                        "env": [{"name": "SLURMD_CONF", "value": "old"}],
                    },
                ],
                **template_spec,
            },
        }
        return api.NodeSetSpec.model_validate({"template": template})

    def test_the_pod_is_pinned_owned_labelled_and_named(self) -> None:
        zone = {"key": "zone", "operator": "In", "values": ["a"]}
        spec = self.spec(affinity=required(term(zone)))
        pod = build_pod(NodeSetRef("slurm", "gpu", "uid-1"), spec, node("n7"), "abc")
        assert pod.metadata is not None
        assert pod.spec is not None
        assert pod.metadata.name == "gpu-n7"
        assert pod.spec.hostname == "gpu-n7"
        assert pod.metadata.labels == {
            "app": "slurmd",
            LABEL_NODESET: "gpu",
            LABEL_NODE: "n7",
            LABEL_TEMPLATE_HASH: "abc",
        }
        owner = (pod.metadata.ownerReferences or [])[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "NodeSet",
            "gpu",
            "uid-1",
            True,
        )
        # What the scheduler and the syncer take for a slurmd pod: this one, and
        # not a pod that only carries the label, or an owner of another name.
        assert api.owning_nodeset(pod) == "gpu"
        labelled_only = build_pod(NodeSetRef("slurm", "gpu", "uid-1"), spec, node("n7"), "abc")
        assert labelled_only.metadata is not None
        labelled_only.metadata.ownerReferences = []
        assert api.owning_nodeset(labelled_only) is None
        assert labelled_only.metadata.labels is not None
        labelled_only.metadata.ownerReferences = pod.metadata.ownerReferences
        labelled_only.metadata.labels[LABEL_NODESET] = "cpu"
        assert api.owning_nodeset(labelled_only) is None
        assert pod.spec.affinity is not None
        assert pod.spec.affinity.nodeAffinity is not None
        terms = pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
        assert terms is not None
        # The template's own constraint is kept and the node pinned in every term.
        assert terms.to_dict()["nodeSelectorTerms"] == [
            {
                "matchExpressions": [zone],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}],
            }
        ]
        env = {e.name: e.value for e in pod.spec.containers[1].env or []}
        assert env == {"SLURMD_NODENAME": "gpu-n7", "SLURMD_CONF": "Feature=gpu"}
        # The same line where the pod reads it again (downward API) when it changes.
        assert pod.metadata.annotations is not None
        assert pod.metadata.annotations[ANNOTATION_SLURMD_CONF] == "Feature=gpu"
        assert all(t in (pod.spec.tolerations or []) for t in DAEMON_TOLERATIONS)

    def test_slurmd_takes_every_gpu_where_sunks_device_plugin_serves_them(self) -> None:
        spec = self.spec()
        served = node("n7", allocatable={"nvidia.com/gpu": "4", RESOURCE_NODE_GPUS: "1"})
        pod = build_pod(NodeSetRef("slurm", "gpu", "uid-1"), spec, served, "abc")
        assert pod.spec is not None
        slurmd = pod.spec.containers[1].resources
        assert slurmd is not None
        assert slurmd.limits == {RESOURCE_NODE_GPUS: "1"}
        env = {e.name: e.value for e in pod.spec.containers[1].env or []}
        assert env["SLURMD_CONF"] == "Feature=gpu Gres=gpu:4"
        # No plugin on the node (or GPUs counted another way): nothing asked of it.
        plain = build_pod(
            NodeSetRef("slurm", "gpu", "uid-1"),
            spec,
            node("n7", allocatable={"nvidia.com/gpu": "4"}),
            "abc",
        )
        assert plain.spec is not None
        assert plain.spec.containers[1].resources is None

    def test_a_node_whose_gpu_plugin_is_not_back_yet_waits(self) -> None:
        # The kubelet keeps a plugin's resource at 0 until the plugin is back.
        assert gpu_plugin_not_serving(node(allocatable={RESOURCE_NODE_GPUS: "0"}))
        assert not gpu_plugin_not_serving(node(allocatable={RESOURCE_NODE_GPUS: "1"}))
        assert not gpu_plugin_not_serving(node(allocatable={"cpu": "4"}))  # no plugin there

    def test_a_missing_slurmd_container_names_the_field(self) -> None:
        spec = api.NodeSetSpec.model_validate(
            {"template": {"spec": {"containers": [{"name": "other"}]}}}
        )
        with pytest.raises(SpecError, match=r"spec\.slurm\.slurmdContainer.*other"):
            build_pod(NodeSetRef("ns", "gpu", "u"), spec, node(), "h")

    def test_the_hash_follows_template_and_slurm_settings_only(self) -> None:
        base = self.spec()
        assert template_hash(base) == template_hash(self.spec())
        assert template_hash(base) != template_hash(self.spec(priorityClassName="high"))
        features = base.model_copy(update={"slurm": api.SlurmNodeSpec(features=["x"])})
        assert template_hash(base) != template_hash(features)
        update = base.model_copy(update={"update_strategy": api.UpdateStrategy(type="OnDelete")})
        assert template_hash(base) == template_hash(update)
