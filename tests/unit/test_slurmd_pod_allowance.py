"""What the test bed lets the operator put in slurmd pods (the sunk-cluster
chart's componentPolicies.slurmdPods), read from the slurm chart's NodeSets."""

from __future__ import annotations

from typing import Any

import pytest

from sunk_testbed.charts import image_repository, slurmd_pod_allowance


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("registry.sunk.test/sunk/slurm:abc123", "registry.sunk.test/sunk/slurm"),
        ("127.0.0.1:5000/sunk/slurm:26.05", "127.0.0.1:5000/sunk/slurm"),
        ("127.0.0.1:5000/sunk/slurm", "127.0.0.1:5000/sunk/slurm"),
        ("ghcr.io/sunk-dev/slurm@sha256:0123", "ghcr.io/sunk-dev/slurm"),
        ("ghcr.io/sunk-dev/slurm:26.05@sha256:0123", "ghcr.io/sunk-dev/slurm"),
    ],
)
def test_an_images_repository_drops_its_tag_and_digest_not_its_port(
    image: str, repository: str
) -> None:
    assert image_repository(image) == repository


def _nodeset(spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "NodeSet", "spec": {"template": {"spec": spec}}}


def test_the_allowance_is_what_the_nodesets_pods_use_and_nothing_of_other_kinds() -> None:
    compute = _nodeset({
        "initContainers": [{"name": "prepare", "image": "r/slurm:1"}],
        "containers": [{
            "name": "slurmd", "image": "r/slurm:1",
            "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "SYS_NICE"]}},
            "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret"}}},
                    {"name": "B", "value": "plain"}],
            "envFrom": [{"secretRef": {"name": "env-from"}}, {"configMapRef": {"name": "cm"}}],
        }],
        "volumes": [
            {"name": "munge", "secret": {"secretName": "slurm-munge"}},
            {"name": "p", "projected": {"sources": [{"secret": {"name": "projected"}},
                                                    {"configMap": {"name": "cm"}}]}},
            {"name": "home", "hostPath": {"path": "/home", "type": "Directory"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "e", "emptyDir": {}},
        ],
    })  # fmt: skip
    gpu = _nodeset({"containers": [{"name": "slurmd", "image": "r/slurm:2"}]})
    other = {"kind": "StatefulSet", "spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "r/other:1"}],
        "volumes": [{"name": "jwt", "secret": {"secretName": "slurm-jwt"}}],
    }}}}  # fmt: skip
    assert slurmd_pod_allowance([compute, other, gpu]) == {
        "images": ["r/slurm"],
        "secrets": ["env-from", "env-secret", "projected", "slurm-munge"],
        "hostPaths": ["/home"],
        "persistentVolumeClaims": ["data"],
        "capabilities": ["SYS_ADMIN", "SYS_NICE"],
    }
