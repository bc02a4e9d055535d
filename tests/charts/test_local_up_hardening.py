"""What a job, an ssh user or a component can reach, on the README's cluster
(`sunk local up`: real kubelets, the charts' pods from images/, installed
with the charts' defaults but for the bed's images, volumes and Slurm
timings), docs/security.md: the slurmd pods hold only the login pods'
public host keys, and each side trusts the other's keys for its names only;
pam_slurm_adopt refuses a session it cannot adopt into the user's job; the
keys hook refuses a Secret it did not make; sunk's GPU plugin sees only the
kubelet directories it writes its sockets in.

Egress NetworkPolicies are not here: the bed's network plugin enforces no
NetworkPolicy, so they are checked flow by flow against the rendered
policies (tests/charts/test_charts_render.py).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.local_cluster import kubectl, poll_ssh, ssh, summary, sunk
from sunk_testbed.helm import CHARTS, Helm, HelmError, ensure_helm

pytestmark = pytest.mark.e2e

NAMESPACE = "slurm"
NODE = "compute-local-1"
IN_SLURMD = ("-n", NAMESPACE, "exec", NODE, "-c", "slurmd", "--")


@pytest.fixture
def cluster(local_cluster: Path) -> Path:
    return local_cluster


def _json(cluster: Path, *args: str) -> Any:
    proc = kubectl(cluster, *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _secret(cluster: Path, name: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """A Secret's labels and decoded data."""
    secret = _json(cluster, "-n", NAMESPACE, "get", "secret", name)
    data = {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}
    return secret["metadata"].get("labels", {}), data


def _public(private: bytes, tmp_path: Path) -> str:
    key = tmp_path / "key"
    key.touch(mode=0o600)
    key.write_bytes(private)
    out = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True
    )
    key.unlink()
    return " ".join(out.stdout.split()[:2])


def test_slurmd_pods_hold_only_the_login_pods_public_keys_trusted_for_their_names(
    cluster: Path, tmp_path: Path
) -> None:
    """The keys hook published the login pods' public host keys (each the
    public half of the private key the login pods hold, in a Secret it
    labels); the slurmd pods mount those, not the private keys (no file in
    the slurmd container holds the login pod's private key), and trust them
    for the login pods' names only. The login pods trust the compute pods'
    keys for their node names only: ssh to a node by name checks its key,
    ssh to the same node by address is refused for an unknown host key."""
    labels, private = _secret(cluster, "slurm-ssh-host-keys")
    public_labels, public = _secret(cluster, "slurm-login-ssh-public-keys")
    assert public_labels["sunk.dev/keys-of"] == "slurm"
    assert labels["sunk.dev/keys-of"] == "slurm"
    assert {k.removesuffix(".pub") for k in public} == set(private)
    for name, key in private.items():
        assert " ".join(public[f"{name}.pub"].decode().split()[:2]) == _public(key, tmp_path)

    pod = _json(cluster, "-n", NAMESPACE, "get", "pod", NODE)
    secrets = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert "slurm-ssh-host-keys" not in secrets
    assert "slurm-login-ssh-public-keys" in secrets
    # Every private key file the container has (outside /proc, /sys and the
    # container jobs' images), by its public half: none is a login pod's.
    find_keys = (
        "grep -rlsF --exclude-dir=sunk-containers -- 'PRIVATE KEY-----'"
        " /etc /run /var /tmp /root /home | while read -r f; do"
        ' t=$(mktemp); cat "$f" > "$t"; ssh-keygen -y -f "$t" </dev/null; rm -f "$t"; done'
    )
    found = kubectl(cluster, *IN_SLURMD, "sh", "-c", find_keys)
    assert found.returncode == 0, found.stderr
    held = {" ".join(line.split()[:2]) for line in found.stdout.splitlines() if line.strip()}
    assert held, found.stderr  # its own host keys at least
    logins = {_public(key, tmp_path) for key in private.values()}
    assert held.isdisjoint(logins), held & logins

    known = kubectl(cluster, *IN_SLURMD, "cat", "/etc/ssh/ssh_known_hosts")
    assert known.returncode == 0, known.stderr
    hosts = {line.split()[0] for line in known.stdout.splitlines() if line.strip()}
    assert hosts == {"slurm-login-0.slurm-login-hosts.slurm.svc.cluster.local"}

    login = ssh(cluster, "cat /etc/ssh/ssh_known_hosts")
    patterns = {p for line in login.splitlines() for p in line.split()[0].split(",")}
    assert "*" not in patterns, patterns
    assert "compute-*" in patterns, patterns
    # By name: the host key checks out (pam_slurm_adopt then refuses, no job).
    named = sunk(cluster, "ssh", f"ssh -o BatchMode=yes {NODE} true")
    assert "Access denied by pam_slurm_adopt" in named.stderr, named.stderr
    # By address: no entry names it, so no key is trusted.
    address = pod["status"]["podIP"]
    by_address = sunk(cluster, "ssh", f"ssh -o BatchMode=yes {address} true")
    assert by_address.returncode != 0
    assert "Host key verification failed" in by_address.stderr, by_address.stderr


def _wait_running(cluster: Path, job: str) -> None:
    poll_ssh(cluster, f"squeue -h -j {job} -o %T", lambda out: out.strip() == "RUNNING", 60, 0.5)


def test_an_ssh_session_that_cannot_join_the_users_job_is_refused(cluster: Path) -> None:
    """pam_slurm_adopt with action_adopt_failure=deny: the researcher has a
    job on the node, but its extern step cannot take the session (its
    freezer cgroup made read-only in the slurmd container, as an adoption
    that fails for any reason): the login is refused, where pam_slurm_adopt's
    default would let the session in outside the job. Once the step can take
    it again, the same ssh is adopted into the job."""
    login = f"ssh -o BatchMode=yes {NODE}"
    poll_ssh(cluster, f"squeue -h -w {NODE}", lambda out: out.strip() == "", 60, 0.5)
    job = ssh(cluster, f"sbatch --parsable -w {NODE} -t 2 --wrap 'sleep 90'").strip()
    mounted = ""
    try:
        _wait_running(cluster, job)
        found = kubectl(
            cluster, *IN_SLURMD, "sh", "-c",
            f"find /sys/fs/cgroup -type d -path '*/job_{job}/step_extern' 2>/dev/null",
        )  # fmt: skip
        steps = found.stdout.split()
        freezer = [d for d in steps if "/freezer/" in d] or [d for d in steps if "/cpuset/" in d]
        assert freezer, f"no extern step cgroup of job {job}: {found.stdout} {found.stderr}"
        mounted = freezer[0]
        ro = kubectl(
            cluster, *IN_SLURMD, "sh", "-c",
            f"mount --bind {mounted} {mounted} && mount -o remount,bind,ro {mounted}",
        )  # fmt: skip
        assert ro.returncode == 0, ro.stderr
        refused = sunk(cluster, "ssh", f"{login} cat /proc/self/cgroup")
        print(f"refused: rc={refused.returncode}\n{refused.stdout}\n{refused.stderr}")
        assert refused.returncode != 0, refused.stdout
        assert "step_extern" not in refused.stdout
        undone = kubectl(cluster, *IN_SLURMD, "umount", mounted)
        assert undone.returncode == 0, undone.stderr
        mounted = ""
        adopted = ssh(cluster, f"{login} cat /proc/self/cgroup")
        assert f"/job_{job}/step_extern" in adopted, adopted
    finally:
        if mounted:
            kubectl(cluster, *IN_SLURMD, "umount", mounted)
        ssh(cluster, f"scancel {job}")
    poll_ssh(cluster, f"squeue -h -j {job} -o %T 2>/dev/null || true", lambda o: not o.strip(), 60)


def test_the_keys_hook_refuses_a_secret_it_did_not_make(cluster: Path, tmp_path: Path) -> None:
    """A second release of the slurm chart, in a namespace of its own, where a
    Secret with its munge key's name already exists without the keys hook's
    label: `helm install` fails at the keys hook, whose log (and its pod's
    termination message) names the Secret and why, at once (no retry), and
    the hook made none of the other keys. Labelled as the hook's, the same
    Secret is kept: the hook then goes on to make the others."""
    namespace, release = "keys-refusal", "kr"
    kubeconfig = Path(summary(cluster)["kubernetes"]["kubeconfig"])
    helm = Helm(ensure_helm(print), kubeconfig, tmp_path / "helm")
    bed_values = yaml.safe_load((cluster / "cluster" / "slurm-values.yaml").read_text())
    values = tmp_path / "values.yaml"
    # Only the keys hook gets to run: the smallest release, the bed's image.
    values.write_text(
        yaml.safe_dump(
            {
                "image": bed_values["image"],
                "nodesets": [],
                "partitions": [],
                "login": {"enabled": False},
                "accounting": {"enabled": False},
                # Without slurmdbd the chart refuses its defaults that need it.
                "slurmConfig": {
                    "PreemptType": None,
                    "PreemptMode": None,
                    "AccountingStorageEnforce": None,
                    "AccountingStorageTRES": None,
                },
                "admins": [],
                "restapi": {"enabled": False},
                "metrics": {"enabled": False},
            }
        )
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{release}-munge", "namespace": namespace},
        "data": {"munge.key": base64.b64encode(b"someone else's key").decode()},
    }
    assert kubectl(cluster, "create", "namespace", namespace).returncode == 0
    try:
        made = kubectl(cluster, "apply", "-f", "-", input=json.dumps(secret))
        assert made.returncode == 0, made.stderr
        started = time.monotonic()
        with pytest.raises(HelmError) as failed:
            helm.run(
                ["install", release, str(CHARTS / "slurm"), "-n", namespace, "-f", str(values),
                 "--timeout", "3m"],
                timeout=240,
            )  # fmt: skip
        print(f"helm install refused in {time.monotonic() - started:.1f}s: {failed.value.stderr}")
        assert f"{release}-keys" in failed.value.stderr
        log = kubectl(cluster, "-n", namespace, "logs", f"job/{release}-keys")
        assert f"refused: Secret {release}-munge exists" in log.stderr + log.stdout, log
        assert "sunk.dev/keys-of" in log.stderr + log.stdout
        pods = _json(
            cluster, "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=keys"
        )
        assert len(pods["items"]) == 1  # failed at once: no retry
        [status] = pods["items"][0]["status"]["containerStatuses"]
        assert status["state"]["terminated"]["exitCode"] == 3
        assert f"Secret {release}-munge" in status["state"]["terminated"]["message"]
        names = {
            s["metadata"]["name"]
            for s in _json(cluster, "-n", namespace, "get", "secrets")["items"]
        }
        assert f"{release}-jwt" not in names
        # The same Secret with the hook's label counts as the hook's: kept.
        # The hook's objects as helm renders them, run again by themselves
        # (a whole install would go on to start this release's slurmctld).
        label = kubectl(
            cluster, "-n", namespace, "label", "secret", f"{release}-munge",
            f"sunk.dev/keys-of={release}",
        )  # fmt: skip
        assert label.returncode == 0, label.stderr
        gone = kubectl(cluster, "-n", namespace, "delete", "job", f"{release}-keys")
        assert gone.returncode == 0, gone.stderr
        hook = helm.run(
            ["template", release, str(CHARTS / "slurm"), "-n", namespace, "-f", str(values),
             "--show-only", "templates/keys-hook.yaml"]
        )  # fmt: skip
        applied = kubectl(cluster, "-n", namespace, "apply", "-f", "-", input=hook)
        assert applied.returncode == 0, applied.stderr
        done = kubectl(
            cluster, "-n", namespace, "wait", "--for=condition=Complete", f"job/{release}-keys",
            "--timeout=120s", timeout=150,
        )  # fmt: skip
        log = kubectl(cluster, "-n", namespace, "logs", f"job/{release}-keys")
        assert done.returncode == 0, f"{done.stderr}\n{log.stdout}{log.stderr}"
        assert f"Secret {release}-munge exists (made by this hook): kept" in log.stdout, log
        _, munge = _secret_in(cluster, namespace, f"{release}-munge")
        assert munge["munge.key"] == b"someone else's key"
        jwt_labels, _ = _secret_in(cluster, namespace, f"{release}-jwt")
        assert jwt_labels["sunk.dev/keys-of"] == release
    finally:
        subprocess.run(
            [str(helm.binary), "uninstall", release, "-n", namespace, "--no-hooks",
             "--kubeconfig", str(kubeconfig)],
            capture_output=True, env=helm.env, check=False, timeout=120,
        )  # fmt: skip
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false")


def _secret_in(cluster: Path, namespace: str, name: str) -> tuple[dict[str, str], dict[str, bytes]]:
    secret = _json(cluster, "-n", namespace, "get", "secret", name)
    data = {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}
    return secret["metadata"].get("labels", {}), data


def test_the_gpu_plugin_sees_only_the_kubelet_directories_it_writes_sockets_in(
    cluster: Path,
) -> None:
    """The running plugin's /kubelet holds plugins_registry (where its
    registration socket is, beside the kubelet's other plugins') and
    plugins/sunk.dev (its own sockets): no pods/, no device-plugins/ (the
    kubelet's socket and checkpoint), nothing of other plugins below
    plugins/."""
    pods = _json(cluster, "get", "pods", "-A", "-l", "app.kubernetes.io/component=gpu-plugin")[
        "items"
    ]
    assert pods
    pod = pods[0]
    listing = (
        "import json, os; print(json.dumps([sorted(os.listdir(d)) for d in"
        " ('/kubelet', '/kubelet/plugins', '/kubelet/plugins/sunk.dev')]))"
    )
    seen = kubectl(
        cluster, "-n", pod["metadata"]["namespace"], "exec", pod["metadata"]["name"], "--",
        "python3", "-c", listing,
    )  # fmt: skip
    assert seen.returncode == 0, seen.stderr
    top, plugins, own = json.loads(seen.stdout)
    assert top == ["plugins", "plugins_registry"]
    assert plugins == ["sunk.dev"]
    assert "nvidia.com-gpu.sock" in own
