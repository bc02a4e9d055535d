"""Registry credentials for container jobs, as `helm template` renders them:
`containers.registryAuthSecret` mounts a dockerconfigjson Secret root-only
where container-fetch looks, and nothing without it. A real registry that asks
for them runs in tests/charts/test_local_up_containers_private.py;
docs/containers.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sunk_testbed.helm import CHARTS, Helm, HelmError, ensure_helm

pytestmark = pytest.mark.contract

# container-fetch's fixed path (images/slurm/containers/container-fetch).
AUTH_DIR = "/etc/sunk/registry-auth"
AUTH_FILE = f"{AUTH_DIR}/config.json"


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def render(helm: Helm, tmp_path: Path, containers: dict[str, Any]) -> list[dict[str, Any]]:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump({"containers": containers}))
    out = helm.run(["template", "rel", str(CHARTS / "slurm"), "-n", "hpc", "-f", str(file)])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def slurmd_pod(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The compute NodeSet's pod spec and its slurmd container."""
    [nodeset] = [d for d in docs if d["kind"] == "NodeSet"]
    spec: dict[str, Any] = nodeset["spec"]["template"]["spec"]
    [slurmd] = [c for c in spec["containers"] if c["name"] == "slurmd"]
    return spec, slurmd


def test_the_secret_is_mounted_root_only_where_the_fetcher_looks(
    helm: Helm, tmp_path: Path
) -> None:
    spec, slurmd = slurmd_pod(render(helm, tmp_path, {"registryAuthSecret": "team-pull"}))
    [volume] = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "team-pull"]
    # 0400 and no fsGroup: root's file alone, though jobs run in this filesystem.
    assert volume["secret"]["defaultMode"] == 0o400
    assert volume["secret"]["items"] == [{"key": ".dockerconfigjson", "path": "config.json"}]
    assert "fsGroup" not in spec.get("securityContext", {})
    mounts = [m for m in slurmd["volumeMounts"] if m["name"] == volume["name"]]
    # A directory, not a subPath: a rotated Secret reaches the pods without a restart.
    assert mounts == [{"name": volume["name"], "mountPath": AUTH_DIR, "readOnly": True}]
    fetcher = (CHARTS.parent / "images/slurm/containers/container-fetch").read_text()
    assert f"AUTH={AUTH_FILE}\n" in fetcher


@pytest.mark.parametrize(
    "containers",
    [{}, {"registryAuthSecret": "team-pull", "enabled": False}],
    ids=["unset", "containers-off"],
)
def test_no_credentials_are_mounted_unless_asked_for(
    helm: Helm, tmp_path: Path, containers: dict[str, Any]
) -> None:
    spec, slurmd = slurmd_pod(render(helm, tmp_path, containers))
    assert not [v for v in spec["volumes"] if "secret" in v and "registry" in v["name"]]
    assert not [m for m in slurmd["volumeMounts"] if m["mountPath"] == AUTH_DIR]


@pytest.mark.parametrize("value", [True, 1, ["team-pull"], {"name": "team-pull"}])
def test_the_schema_takes_only_a_secret_name(helm: Helm, tmp_path: Path, value: Any) -> None:
    with pytest.raises(HelmError) as error:
        render(helm, tmp_path, {"registryAuthSecret": value})
    assert "registryAuthSecret" in str(error.value.stderr)


CACHE = "/var/lib/sunk-containers"


def test_slurmd_makes_the_cache_root_only_before_anyone_reaches_the_pod(
    helm: Helm, tmp_path: Path
) -> None:
    """The cache volume (an emptyDir is 0777) holds what root writes and mounts
    for every container step: slurmd's container makes it root's alone before
    sshd or slurmd start, i.e. before any user can reach the pod; the plugin
    and the fetcher refuse to use it otherwise."""
    spec, slurmd = slurmd_pod(render(helm, tmp_path, {}))
    assert {"name": "containers", "mountPath": CACHE} in slurmd["volumeMounts"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "containers"]
    assert volume == {"name": "containers", "emptyDir": {}}
    script = slurmd["command"][-1]
    fix = script.index(f"chown 0:0 {CACHE} && chmod 0700 {CACHE}")
    assert fix < script.index("exec tini --")
    assert fix < script.index("sshd")
    plugstack = next(
        d
        for d in render(helm, tmp_path, {})
        if d["kind"] == "ConfigMap" and "plugstack.conf" in d.get("data", {})
    )
    assert f"cache={CACHE}" in plugstack["data"]["plugstack.conf"]

    _, off = slurmd_pod(render(helm, tmp_path, {"enabled": False}))
    assert CACHE not in off["command"][-1]
