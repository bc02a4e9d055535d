"""What a pod holds and may touch, as `helm template` renders it: the ssh host
keys each Slurm pod mounts and the hosts it trusts them for, the compute
pods' PAM stack, the keys hook's refusal of Secrets it did not make, and the
kubelet directories sunk's GPU plugin mounts (docs/security.md). The same
charts run on the local cluster in tests/charts/test_local_up_training.py,
test_local_up_hardening.py and test_local_up_gpus.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sunk_testbed.helm import CHARTS, Helm, ensure_helm

pytestmark = pytest.mark.contract

DOMAIN = "hpc.svc.cluster.local"


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def render(helm: Helm, chart: str, *flags: str) -> list[dict[str, Any]]:
    out = helm.run(["template", "rel", str(CHARTS / chart), "-n", "hpc", *flags])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def pod_spec(docs: list[dict[str, Any]], owner: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["metadata"]["name"] == owner and "template" in d.get("spec", {})]
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def mounted_secrets(spec: dict[str, Any]) -> set[str]:
    """The Secrets a pod's volumes hold (secret and projected volumes)."""
    names = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    for volume in spec["volumes"]:
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                names.add(source["secret"]["name"])
    return names


def init(spec: dict[str, Any], name: str) -> dict[str, Any]:
    [container] = [c for c in spec["initContainers"] if c["name"] == name]
    found: dict[str, Any] = container
    return found


def test_each_ssh_pod_holds_its_own_private_host_key_and_only_its_peers_public_ones(
    helm: Helm,
) -> None:
    """The slurmd pods mount the compute host keys (theirs) and the login pods'
    *public* keys only; the login pods their own keys and the compute pods'
    public ones. Each trusts a peer's keys for the peer's names only: the
    login pods' DNS names (as they sign in hostbased ssh) on the compute pods,
    the NodeSets' node names (alone and in the nodes' domain) on the login
    pods, never `*`."""
    docs = render(
        helm, "slurm",
        '--set-json=nodesets=[{"name": "compute"}, {"name": "gpu", "nodeName": "g-{ip}"}]',
        "--set=login.replicas=2",
    )  # fmt: skip
    slurmd, login = pod_spec(docs, "compute"), pod_spec(docs, "rel-login")
    assert "rel-ssh-host-keys" not in mounted_secrets(slurmd)
    assert {"rel-compute-ssh-host-keys", "rel-login-ssh-public-keys"} <= mounted_secrets(slurmd)
    assert "rel-compute-ssh-host-keys" not in mounted_secrets(login)
    assert {"rel-ssh-host-keys", "rel-compute-ssh-public-keys"} <= mounted_secrets(login)

    def hosts(spec: dict[str, Any]) -> list[str]:
        env = {e["name"]: str(e["value"]) for e in init(spec, "ssh-trust")["env"]}
        return env["HOSTS"].split(",")

    logins = [f"rel-login-{i}.rel-login-hosts.{DOMAIN}" for i in (0, 1)]
    assert hosts(slurmd) == logins
    nodes = f"rel-nodes.{DOMAIN}"
    assert sorted(hosts(login)) == sorted(
        [f"*.{nodes}", "compute-*", f"compute-*.{nodes}", "g-*", f"g-*.{nodes}"]
    )
    for spec in (slurmd, login):
        assert "*" not in hosts(spec)
        trust = init(spec, "ssh-trust")
        assert trust["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in slurmd["volumes"]}
    mounts = {m["name"] for m in init(slurmd, "ssh-trust")["volumeMounts"]}
    assert {volumes[m] for m in mounts} == {None, "rel-login-ssh-public-keys"}  # None: its emptyDir
    # The compute pods' sshd file and the login pods' ssh client read the
    # known_hosts the init container wrote.
    [config] = [d for d in docs if d["metadata"]["name"] == "rel-compute-ssh"]
    assert "HostbasedAuthentication yes" in config["data"]["sshd_config"]


def test_pam_slurm_adopt_refuses_what_it_cannot_adopt(helm: Helm) -> None:
    """The compute pods' PAM account stack is pam_slurm_adopt alone, with
    adoption failures (default: allow, outside any job) and errors denied."""
    [config] = [d for d in render(helm, "slurm") if d["metadata"]["name"] == "rel-compute-ssh"]
    account = [
        line.split()
        for line in config["data"]["pam-sshd"].splitlines()
        if line.startswith("account")
    ]
    assert account == [
        [
            "account", "required", "pam_slurm_adopt.so",
            "action_adopt_failure=deny", "action_generic_failure=deny",
        ]
    ]  # fmt: skip


def test_the_keys_hook_may_read_and_update_only_its_own_secrets_and_fails_at_once(
    helm: Helm,
) -> None:
    """The keys hook's Role: get of the names it makes and the host-key and
    signing-key Secrets it derives public keys from (a brought one too),
    update of the public-key Secrets and the JWKS only; a refusal (exit 3)
    fails its Job with no retry.
    The refusal itself runs on the local cluster
    (test_local_up_hardening.py)."""
    docs = render(helm, "slurm", "--set=login.existingHostKeysSecret=mine")
    [role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "rel-keys"]
    by_verb = {tuple(r["verbs"]): set(r.get("resourceNames", [])) for r in role["rules"]}
    public = {"rel-login-ssh-public-keys", "rel-compute-ssh-public-keys", "rel-jwks"}
    assert by_verb[("update",)] == public
    assert by_verb[("get",)] == {
        "rel-munge", "rel-jwt", "rel-jwt-signing", "rel-db", "rel-compute-ssh-host-keys",
        "mine", *public,
    }  # fmt: skip
    assert by_verb[("create",)] == set()
    [job] = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "rel-keys"]
    [rule] = job["spec"]["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "keys", "operator": "In", "values": [3]},
    }
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "sunk.dev/keys-of" in script
    assert "exit 3" in script
    # The uninstall hook deletes only what carries that label, as read.
    [uninstall] = [
        d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "rel-uninstall"
    ]
    assert (
        "not made by the keys hook"
        in uninstall["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    )


@pytest.mark.parametrize(
    "root", ["/var/lib/kubelet", "/srv/bed/{node}/kubelet"], ids=["node", "bed"]
)
def test_the_gpu_plugin_mounts_only_the_kubelet_directories_it_writes_sockets_in(
    helm: Helm, root: str
) -> None:
    """The plugin registers through the kubelet's plugin watcher and serves
    its sockets below plugins/: those two directories are all it mounts of
    the kubelet's (not the root, with every pod's volumes, nor device-plugins/,
    the kubelet's own socket and its checkpoint), and, read-only, the device
    directory, NVIDIA's toolkit config directory (checked, never written) and
    the node's CDI spec directories (read for container steps).
    `{node}` (a bed whose kubelets share a host) mounts the same
    two below each node's root, and its CDI directory below it too."""
    docs = render(
        helm, "sunk-cluster", "--set=gpuPlugin.enabled=true",
        f"--set=gpuPlugin.kubeletRootDir={root}",
    )  # fmt: skip
    spec = pod_spec(docs, "rel-gpu-plugin")
    [container] = spec["containers"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    seen = {}
    for mount in container["volumeMounts"]:
        host = volumes[mount["name"]]["path"]
        sub = mount.get("subPathExpr")
        seen[mount["mountPath"]] = (f"{host}/{sub}" if sub else host, mount.get("readOnly", False))
    prefix = root.replace("{node}", "$(NODE_NAME)")
    assert seen == {
        "/kubelet/plugins_registry": (f"{prefix}/plugins_registry", False),
        "/kubelet/plugins/sunk.dev": (f"{prefix}/plugins/sunk.dev", False),
        "/node-dev": ("/dev", True),
        "/toolkit": ("/etc/nvidia-container-runtime", True),
        "/cdi/0": ("/etc/cdi", True),
        "/cdi/1": ("/var/run/cdi", True),
    }
    flags = container["command"]
    assert [f for f in flags if f.startswith("--cdi-spec-dir=")] == [
        "--cdi-spec-dir=/cdi/0",
        "--cdi-spec-dir=/cdi/1",
    ]
    per_node = render(
        helm, "sunk-cluster", "--set=gpuPlugin.enabled=true",
        "--set=gpuPlugin.cdiSpecDirs[0]=/nodes/{node}/cdi",
    )  # fmt: skip
    spec = pod_spec(per_node, "rel-gpu-plugin")
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    [cdi] = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/cdi/0"]
    assert (volumes[cdi["name"]], cdi["subPathExpr"]) == (
        {"path": "/nodes", "type": "Directory"},
        "$(NODE_NAME)/cdi",
    )
    assert "--registry-dir=/kubelet/plugins_registry" in flags
    assert "--socket-dir=/kubelet/plugins/sunk.dev" in flags
    assert f"--host-socket-dir={prefix}/plugins/sunk.dev" in flags
