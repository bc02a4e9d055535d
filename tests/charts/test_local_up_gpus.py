"""GPUs end to end on the README's cluster (`sunk local up`: real kubelets,
the charts' pods from images/, Debian's Slurm 26.05), docs/gpus.md.

No GPU exists on this machine: every node's four GPUs are stand-in character
devices (`/dev/nvidia0`..`3`, NVIDIA's major number, no driver behind them,
beside stand-in `nvidiactl`, `nvidia-uvm` and the rest), with a stand-in
`libcuda.so.1` and `nvidia-smi` and the CDI spec NVIDIA's toolkit would write
for them in each node's containerd, made by `sunk local up`
(sunk_testbed.gpus) and served by sunk's GPU plugin (its DaemonSet, from
sunk's image) as CDI devices to the slurmd pods and to the pods sunk's
scheduler places.
Opening one tells what a process may use: the device cgroup lets it through
and the missing driver answers ENXIO ("usable"), or the cgroup refuses it
with EPERM ("denied").

The last test asks for GPUs by DRA claims: there Kubernetes' DRA example
driver (sigs.k8s.io/dra-example-driver, built here from its Go module,
sunk_testbed.dra) stands in for NVIDIA's DRA driver, with simulated GPUs
that reach a container as environment variables.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.gpu_probe import PROBE as CONTAINER_PROBE
from plugins.gpu_probe import gpu_nodes, read_probe
from plugins.local_cluster import (
    cluster_helm,
    kubectl,
    poll_ssh,
    running_slurm_pods,
    ssh,
    summary,
)
from sunk.api import ANNOTATION_NODE_GPUS as GPUS_ANNOTATION
from sunk.api import ANNOTATION_SLURMD_REGISTRATION
from sunk_testbed import dra
from sunk_testbed.control_plane import async_client
from sunk_testbed.nodeconf import NodePaths

pytestmark = pytest.mark.e2e

NODES = ["compute-local-1", "compute-local-2", "compute-local-3"]
GPUS = 4

# Each /dev/nvidiaN a process sees: usable (ENXIO from the absent driver: the
# device cgroup let the open through) or denied (EPERM from the cgroup).
PROBE = """
import errno, glob, os
for path in sorted(glob.glob("/dev/nvidia[0-9]*")):
    try:
        os.close(os.open(path, os.O_RDWR))
        seen = "usable"
    except OSError as error:
        seen = {errno.ENXIO: "usable", errno.EPERM: "denied"}.get(error.errno, error.strerror)
    print(path.removeprefix("/dev/nvidia"), seen)
"""


@pytest.fixture
def cluster(local_cluster: Path) -> Path:
    return local_cluster


def probe(cluster: Path, srun_args: str) -> dict[int, str]:
    out = ssh(cluster, f"srun {srun_args} python3 -c {shlex.quote(PROBE)}")
    return {int(index): seen for index, seen in (line.split() for line in out.splitlines())}


def indices(expr: str) -> set[int]:
    """Slurm's "0-1,3" as {0, 1, 3}."""
    found: set[int] = set()
    for part in filter(None, expr.split(",")):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


# A job's GPUs on a node in `scontrol -d show job`: "GRES=gpu:2(IDX:0-1)".
GPU_INDICES = re.compile(r"GRES=gpu[^ ]*\(IDX:([0-9,-]+)\)")


def job_gpus(cluster: Path, job: str) -> set[int]:
    """The GPU indices `scontrol show job -d` lists for a one-node job."""
    out = ssh(cluster, f"scontrol -d -o show job {job}")
    found = GPU_INDICES.findall(out)
    assert len(found) == 1, out
    return indices(found[0])


def wait_running(cluster: Path, job: str) -> None:
    poll_ssh(cluster, f"squeue -h -j {job} -o %T", lambda out: out.strip() == "RUNNING", 60, 0.5)


def wait_probed(cluster: Path, name: str, within: float = 150) -> tuple[dict[str, Any], str]:
    """The pod of `default` once Running and its log says "probed" (what it
    saw is written before): the pod, and its log."""
    deadline = time.monotonic() + within
    while True:
        got = json.loads(kubectl(cluster, "get", "pod", "-n", "default", name, "-o", "json").stdout)
        logs = kubectl(cluster, "logs", "-n", "default", name).stdout
        if got["status"].get("phase") == "Running" and "probed" in logs:
            return got, logs
        assert got["status"].get("phase") != "Failed", got["status"]
        assert time.monotonic() < deadline, (got["status"], logs)
        time.sleep(1)


def test_every_node_offers_its_gpus_and_slurm_counts_them(cluster: Path) -> None:
    """The plugin found the node's devices: the Kubernetes node offers them
    (one `nvidia.com/gpu` each, and the slurmd pod's `sunk.dev/node-gpus`),
    and the Slurm node's GRES says the same count (the NodeSet took it from
    the node's allocatable, not from a value typed for it)."""
    nodes = json.loads(kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]
    offered = {
        n["metadata"]["name"]: (
            n["status"]["allocatable"].get("nvidia.com/gpu"),
            n["status"]["allocatable"].get("sunk.dev/node-gpus"),
        )
        for n in nodes
    }
    assert offered == {f"local-{i}": (str(GPUS), "1") for i in (1, 2, 3)}
    # What the plugin found, on the Node itself (sunk.gpus.publish).
    published = {
        n["metadata"]["name"]: n["metadata"]["annotations"].get(GPUS_ANNOTATION) for n in nodes
    }
    assert published == {f"local-{i}": "0,1,2,3" for i in (1, 2, 3)}
    out = ssh(cluster, "sinfo -h -N -o '%N %G'")
    assert dict(line.split() for line in out.splitlines()) == {n: f"gpu:{GPUS}" for n in NODES}


def test_a_slurmd_pod_holds_every_device_and_file_of_the_nodes_cdi_spec(cluster: Path) -> None:
    """The slurmd pod's CDI device is the spec's `all`: every GPU, the control
    nodes, the stand-in driver library and tool."""
    pods = json.loads(
        kubectl(
            cluster,
            "get",
            "pods",
            "-n",
            "slurm",
            "-l",
            "sunk.dev/nodeset",  # the NodeSets' slurmd pods
            "-o",
            "json",
        ).stdout
    )["items"]
    assert pods
    for pod in pods:
        out = kubectl(
            cluster,
            "exec",
            "-n",
            "slurm",
            pod["metadata"]["name"],
            "-c",
            "slurmd",
            "--",
            "sh",
            "-c",
            CONTAINER_PROBE,
        ).stdout
        seen = read_probe(out.splitlines())
        assert seen.devices == gpu_nodes(range(GPUS)), out
        assert "/usr/bin/nvidia-smi" in seen.files, out
        assert any(f.endswith("/libcuda.so.1") for f in seen.files), out
        assert (seen.cuda_gpus, len(seen.smi)) == (GPUS, GPUS), out


def test_a_job_uses_the_gpus_slurm_allocated_it_and_no_other(cluster: Path) -> None:
    seen = probe(cluster, "-w compute-local-2 --gres=gpu:2 -t 1")
    assert sorted(seen) == list(range(GPUS)), seen  # every device file is there...
    usable = {i for i, s in seen.items() if s == "usable"}
    assert len(usable) == 2, seen  # ...and only its two GPUs open
    assert {s for i, s in seen.items() if i not in usable} == {"denied"}, seen


def test_a_pod_placed_by_the_scheduler_gets_exactly_its_jobs_gpus(cluster: Path) -> None:
    """Half of every node's GPUs held by batch jobs: the pod's Slurm job gets
    the other half of one node, and the pod sees exactly those devices
    (`scontrol show job -d`'s indices), while the batch job beside it uses
    the others and not the pod's."""
    info = summary(cluster)
    batch = {
        node: ssh(
            cluster, f"sbatch --parsable -w {node} --gres=gpu:2 -t 5 --wrap 'sleep 300'"
        ).strip()
        for node in NODES
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod", "namespace": "default"},
        "spec": {
            "schedulerName": "sunk-scheduler",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": info["images"]["sunk/slurm"],
                    "command": ["sh", "-c", CONTAINER_PROBE + "echo probed; sleep 3600"],
                    # CUDA images set it so; it widens nothing.
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
    }
    try:
        for job in batch.values():
            wait_running(cluster, job)
        created = kubectl(cluster, "create", "-f", "-", input=json.dumps(pod))
        assert created.returncode == 0, created.stderr
        got, logs = wait_probed(cluster, "gpu-pod")
        node = "compute-" + got["spec"]["nodeName"]
        job = got["metadata"]["annotations"]["sunk.dev/slurm-job-id"]
        held = job_gpus(cluster, job)
        assert len(held) == 2
        # Its two GPUs' device nodes and the control nodes, nothing more;
        # CUDA and nvidia-smi count two.
        seen = read_probe(logs.splitlines())
        assert seen.devices == gpu_nodes(held), logs
        assert (seen.cuda_gpus, len(seen.smi), seen.env) == (2, 2, "all"), logs
        # The batch job on that node: its own two GPUs, and not the pod's.
        beside = batch[node]
        assert job_gpus(cluster, beside) == set(range(GPUS)) - held
        seen = probe(cluster, f"--jobid={beside} --overlap")
        assert {i for i, s in seen.items() if s == "usable"} == set(range(GPUS)) - held, seen
        assert {i for i, s in seen.items() if s == "denied"} == held, seen
    finally:
        kubectl(cluster, "delete", "pod", "-n", "default", "gpu-pod", "--wait=false")
        ssh(cluster, f"scancel {' '.join(batch.values())}")
        poll_ssh(
            cluster,
            "squeue -h -o %i",
            lambda out: not set(out.split()) & set(batch.values()),
            60,
            0.5,
        )


def test_a_container_step_holds_exactly_its_gpus_and_the_driver_or_none(cluster: Path) -> None:
    """Container steps (docs/containers.md) in the bed's test image (BusyBox:
    no NVIDIA file of its own). A batch job holds two of a node's GPUs; a
    step of it sees exactly those two device nodes, the control nodes and the
    stand-in driver library and nvidia-smi; a new job's `--gres=gpu:1` step
    sees one GPU, not the batch job's; a job without GPUs sees no NVIDIA
    device and no driver file, even with NVIDIA_VISIBLE_DEVICES=all and
    CUDA_VISIBLE_DEVICES in its environment."""
    image = summary(cluster)["images"]["sunk/container-test"]
    node = "compute-local-1"
    probe_in = f"--container-image={image} sh -c {shlex.quote(CONTAINER_PROBE)}"
    batch = ssh(
        cluster, f"sbatch --parsable -w {node} --gres=gpu:2 -t 5 --wrap 'sleep 300'"
    ).strip()
    try:
        wait_running(cluster, batch)
        held = job_gpus(cluster, batch)
        out = ssh(cluster, f"srun --jobid={batch} --overlap {probe_in}")
        seen = read_probe(out.splitlines())
        assert seen.devices == gpu_nodes(held), out
        assert "/usr/bin/nvidia-smi" in seen.files, out
        assert any(f.endswith("/libcuda.so.1") for f in seen.files), out
        assert len(seen.smi) == 2, out

        out = ssh(cluster, f"srun -w {node} --gres=gpu:1 -t 1 {probe_in}")
        seen = read_probe(out.splitlines())
        assert len(seen.gpus) == 1, out
        assert not seen.gpus & held, out
        assert seen.devices == gpu_nodes(seen.gpus), out
        assert any(f.endswith("/libcuda.so.1") for f in seen.files), out

        out = ssh(
            cluster,
            "NVIDIA_VISIBLE_DEVICES=all CUDA_VISIBLE_DEVICES=0,1,2,3 "
            f"srun -w {node} -t 1 {probe_in}",
        )
        seen = read_probe(out.splitlines())
        assert (seen.devices, seen.files, seen.env) == (frozenset(), frozenset(), "all"), out
    finally:
        ssh(cluster, f"scancel {batch}")


# Pairs of GPU pods the pairs test makes; 50 when asked (SUNK_GPU_PAIRS=50),
# a few rounds by default to keep the suite's time.
PAIRS = int(os.environ.get("SUNK_GPU_PAIRS", "6"))


def all_job_gpus(cluster: Path) -> dict[str, set[int]]:
    """Each running job's GPU indices, as `scontrol show job -d` lists them."""
    found = {}
    for line in ssh(cluster, "scontrol -d -o show job").splitlines():
        job = re.search(r"\bJobId=(\d+)", line)
        gres = GPU_INDICES.findall(line)
        if job and len(gres) == 1:
            found[job.group(1)] = indices(gres[0])
    return found


def test_pairs_of_gpu_pods_bound_to_one_node_at_once_hold_their_own_jobs_gpus(
    cluster: Path,
) -> None:
    """Rounds of six 2-GPU pods created at one instant, which fill the three
    4-GPU nodes: Slurm starts two jobs on each node together, and the two
    pods of each node would race through the kubelet's admission. Every pod
    holds exactly the GPUs `scontrol show job -d` lists for its job (the
    scheduler binds a node's GPU pods one at a time, each once the kubelet
    admitted the one before)."""
    image = summary(cluster)["images"]["sunk/slurm"]
    per_round = len(NODES) * 2
    rounds = -(-PAIRS * 2 // per_round)
    took = []
    for round_ in range(rounds):
        names = [f"pair-{round_}-{i}" for i in range(per_round)]
        pods = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {
                        "schedulerName": "sunk-scheduler",
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "main",
                                "image": image,
                                "command": ["sh", "-c", CONTAINER_PROBE + "exec sleep 600"],
                                "resources": {
                                    "requests": {"cpu": "100m"},
                                    "limits": {"nvidia.com/gpu": "2"},
                                },
                            }
                        ],
                    },
                }
                for name in names
            ],
        }
        started = time.monotonic()
        created = kubectl(cluster, "create", "-f", "-", input=json.dumps(pods))
        assert created.returncode == 0, created.stderr
        try:
            deadline = time.monotonic() + 180
            while True:
                got = json.loads(
                    kubectl(cluster, "get", "pods", "-n", "default", *names, "-o", "json").stdout
                )["items"]
                phases = [p["status"].get("phase") for p in got]
                assert "Failed" not in phases, [p["status"] for p in got]
                if phases == ["Running"] * per_round:
                    logs = {
                        name: kubectl(cluster, "logs", "-n", "default", name).stdout
                        for name in names
                    }
                    if all("env " in out for out in logs.values()):
                        break
                assert time.monotonic() < deadline, [p["status"] for p in got]
                time.sleep(1)
            took.append(time.monotonic() - started)
            held = all_job_gpus(cluster)
            by_node: dict[str, list[str]] = {}
            for pod in got:
                name = pod["metadata"]["name"]
                by_node.setdefault(pod["spec"]["nodeName"], []).append(name)
                job = pod["metadata"]["annotations"]["sunk.dev/slurm-job-id"]
                seen = read_probe(logs[name].splitlines())
                assert len(held[job]) == 2, (job, held)
                assert seen.devices == gpu_nodes(held[job]), (name, job, held[job], logs[name])
                assert seen.cuda_gpus == 2, logs[name]
            # Two pods on each node, bound together.
            assert sorted(len(v) for v in by_node.values()) == [2] * len(NODES), by_node
        finally:
            kubectl(cluster, "delete", "pod", "-n", "default", *names, "--wait=true")
    print(
        f"{rounds} rounds of {per_round} GPU pods: all running in "
        + ", ".join(f"{t:.1f}" for t in took)
        + " s"
    )


def test_a_tenant_pod_naming_a_gpu_node_or_asking_for_every_gpu_is_refused(
    cluster: Path,
) -> None:
    """The chart's defaults (gpuPlugin.admissionPolicy): a pod of the tenant
    namespace that names a Slurm GPU node, or asks for `sunk.dev/node-gpus`,
    is refused when created, naming the rule."""
    image = summary(cluster)["images"]["sunk/slurm"]

    def refusal(spec: dict[str, object]) -> str:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "skips-slurm", "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": image, **spec.pop("c", {})}], **spec},
        }
        made = kubectl(cluster, "create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
        return made.stderr if made.returncode else ""

    said = refusal({"nodeName": "local-2"})
    assert "spec.nodeName: node local-2 is a Slurm GPU node" in said, said
    said = refusal({"c": {"resources": {"limits": {"sunk.dev/node-gpus": "1"}}}})
    assert "sunk.dev/node-gpus (every GPU of a node) goes only to a NodeSet's slurmd pod" in said
    assert refusal({}) == ""  # placed by Kubernetes' scheduler, asking for no GPU


async def install_dra_driver(cluster: Path, info: dict[str, Any]) -> None:
    """The DRA example driver on every node of the bed, publishing as many
    simulated GPUs as the stand-in ones."""
    kube = async_client(Path(info["kubernetes"]["kubeconfig"]), field_manager="test")
    names = [node.removeprefix("compute-") for node in NODES]
    try:
        image = await asyncio.to_thread(dra.ensure_dra_image, print)
        nodes = {name: NodePaths(cluster / "nodes" / name) for name in names}
        await dra.install_dra_driver(
            cluster_helm(cluster), kube, image, nodes, cluster / "cluster", print, gpus=GPUS
        )
    finally:
        await kube.close()


# A claim's devices in its container, as the DRA example driver's CDI spec sets them.
DRA_DEVICE = re.compile(r"^GPU_DEVICE_(\d+)=gpu-(\d+)$", re.MULTILINE)


# A machine's first run builds the DRA example driver from its Go module (minutes).
@pytest.mark.timeout(900)
def test_a_pod_with_a_dra_claim_holds_the_gpus_slurm_allocated_its_job(
    cluster: Path,
) -> None:
    """GPUs asked for by a DRA claim. Kubernetes' DRA example driver stands in
    for NVIDIA's: it publishes four simulated GPUs per node (`gpu-0`..`gpu-3`,
    attribute `index`, as many as the stand-in GPUs Slurm counts) and hands a
    prepared claim's devices to its container as `GPU_DEVICE_<n>` variables
    (its CDI spec). sunk-cluster is upgraded to allocate claims of the
    driver's DeviceClass (`scheduler.dra.gpuClasses`: what a user running a
    DRA driver other than NVIDIA's sets). With two GPUs of every node held by
    batch jobs, a pod whose claim template asks for two GPUs gets a Slurm job
    of gres/gpu:2 and runs with exactly the two devices that job holds
    (`scontrol show job -d`), named in the claim's allocation and reserved
    for the pod, not the driver's first free ones. A pod with the same claim
    template for Kubernetes' own scheduler has its claim's allocation on a
    Slurm GPU node refused (the chart's `<release>-slurm-gpu-claims`
    policy), and stays unbound."""
    info = summary(cluster)
    helm = cluster_helm(cluster)
    asyncio.run(install_dra_driver(cluster, info))
    values = yaml.safe_load((cluster / "cluster" / "sunk-values.yaml").read_text())
    values.setdefault("scheduler", {})["dra"] = {
        "gpuClasses": {dra.DEVICE_CLASS: {"driver": dra.DRIVER, "indexAttribute": "index"}}
    }
    helm.upgrade_install(
        "sunk",
        "sunk-cluster",
        "slurm",
        values,
        values_file=cluster / "cluster" / "sunk-values-dra.yaml",
    )
    rolled = kubectl(
        cluster, "rollout", "status", "-n", "slurm", "deployment/sunk-scheduler", timeout=180
    )
    assert rolled.returncode == 0, rolled.stderr
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-gpus", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {"deviceClassName": dra.DEVICE_CLASS, "count": 2},
                        }
                    ]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dra-pod", "namespace": "default"},
        "spec": {
            "schedulerName": "sunk-scheduler",
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
            "containers": [
                {
                    "name": "main",
                    "image": info["images"]["sunk/slurm"],
                    "command": ["sh", "-c", "env; echo probed; sleep 3600"],
                    "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpus"}]},
                }
            ],
        },
    }
    batch = {
        node: ssh(
            cluster, f"sbatch --parsable -w {node} --gres=gpu:2 -t 5 --wrap 'sleep 300'"
        ).strip()
        for node in NODES
    }
    try:
        for job in batch.values():
            wait_running(cluster, job)
        for obj in (template, pod):
            created = kubectl(cluster, "create", "-f", "-", input=json.dumps(obj))
            assert created.returncode == 0, created.stderr
        got, logs = wait_probed(cluster, "dra-pod")
        job = got["metadata"]["annotations"]["sunk.dev/slurm-job-id"]
        held = job_gpus(cluster, job)
        assert len(held) == 2
        assert "gres/gpu:2" in ssh(cluster, f"scontrol -o show job {job}")
        # The batch job beside it holds the node's other two.
        node = got["spec"]["nodeName"]
        assert job_gpus(cluster, batch[f"compute-{node}"]) == set(range(GPUS)) - held
        seen = {(int(a), int(b)) for a, b in DRA_DEVICE.findall(logs)}
        assert seen == {(i, i) for i in held}, logs
        (claim_name,) = [s["resourceClaimName"] for s in got["status"]["resourceClaimStatuses"]]
        claim = json.loads(
            kubectl(
                cluster, "get", "resourceclaim", "-n", "default", claim_name, "-o", "json"
            ).stdout
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == [f"gpu-{i}" for i in sorted(held)]
        assert {(r["driver"], r["pool"], r["request"]) for r in results} == {
            (dra.DRIVER, node, "gpus")
        }
        assert [c["uid"] for c in claim["status"]["reservedFor"]] == [got["metadata"]["uid"]]
        # The same claim template for Kubernetes' own scheduler, in a pod that
        # tolerates sunk's node lock: its claim's allocation on a Slurm GPU
        # node is refused (the chart's policy), and the pod stays unbound.
        elsewhere = json.loads(json.dumps(pod))
        elsewhere["metadata"]["name"] = "dra-elsewhere"
        del elsewhere["spec"]["schedulerName"]
        elsewhere["spec"]["tolerations"] = [{"key": "sunk.dev/slurm-job", "operator": "Exists"}]
        created = kubectl(cluster, "create", "-f", "-", input=json.dumps(elsewhere))
        assert created.returncode == 0, created.stderr
        refused = "is a Slurm GPU node (sunk's GPU plugin runs there); its devices are allocated"
        deadline = time.monotonic() + 60
        while True:
            events = kubectl(
                cluster, "get", "events", "-n", "default", "-o", "json",
                "--field-selector", "involvedObject.name=dra-elsewhere",
            )  # fmt: skip
            said = [e["message"] for e in json.loads(events.stdout)["items"]]
            if any(refused in message for message in said):
                break
            assert time.monotonic() < deadline, said
            time.sleep(1)
        unbound = kubectl(cluster, "get", "pod", "-n", "default", "dra-elsewhere", "-o", "json")
        assert not json.loads(unbound.stdout)["spec"].get("nodeName"), unbound.stdout
    finally:
        kubectl(cluster, "delete", "pod", "-n", "default", "dra-elsewhere", "--wait=false")
        kubectl(cluster, "delete", "pod", "-n", "default", "dra-pod", "--wait=false")
        kubectl(cluster, "delete", "resourceclaimtemplate", "-n", "default", "two-gpus")
        ssh(cluster, f"scancel {' '.join(batch.values())}")


def node_gpus(cluster: Path) -> dict[str, tuple[str | None, str | None]]:
    """Each node's GPU list as its plugin wrote it, and its allocatable GPUs."""
    nodes = json.loads(kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]
    return {
        n["metadata"]["name"]: (
            n["metadata"].get("annotations", {}).get(GPUS_ANNOTATION),
            n["status"]["allocatable"].get("nvidia.com/gpu"),
        )
        for n in nodes
    }


def slurm_admin(cluster: Path, *command: str) -> str:
    """A command as Slurm's admin, in the slurmctld pod."""
    proc = kubectl(
        cluster, "exec", "-n", "slurm", "slurm-slurmctld-0", "-c", "slurmctld", "--", *command
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def gres_lines(cluster: Path) -> list[str]:
    """The NodeName= lines of the gres.conf slurmctld reads."""
    text = slurm_admin(cluster, "cat", "/etc/slurm/gres.conf")
    return sorted(line for line in text.splitlines() if line.startswith("NodeName="))


def test_gres_conf_names_each_nodes_own_gpus(cluster: Path) -> None:
    """The chart's default gres.conf: sunk's operator writes a line per Slurm
    GPU node from the GPUs its plugin found there (nobody typed a device
    file)."""
    assert gres_lines(cluster) == [f"NodeName={n} Name=gpu File=/dev/nvidia[0-3]" for n in NODES]


def test_a_slurmd_pod_asked_to_register_anew_starts_slurmd_again_in_the_same_container(
    cluster: Path,
) -> None:
    """The slurmd container starts slurmd again when its pod's
    `sunk.dev/slurmd-registration` (or `--conf`) changes, as the NodeSet
    controller has a node whose GPUs changed register anew: a job running
    there ends as it would have, no pod of the Slurm namespace restarted or
    replaced. An admin writes the annotation here, to show it with a job on
    the node (the controller does it on an idle node)."""
    before = running_slurm_pods(cluster)
    pod = node = "compute-local-2"

    def restarts() -> int:
        logs = kubectl(cluster, "logs", "-n", "slurm", pod, "-c", "slurmd").stdout
        return logs.count("starting slurmd again")

    seen = restarts()
    job = ssh(cluster, f"sbatch --parsable -w {node} --gres=gpu:1 --wrap 'sleep 20'").strip()
    wait_running(cluster, job)
    annotation = f"{ANNOTATION_SLURMD_REGISTRATION}=test-{time.monotonic_ns()}"
    proc = kubectl(cluster, "annotate", "pod", "-n", "slurm", pod, "--overwrite", annotation)
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 60
    while restarts() == seen:
        assert time.monotonic() < deadline, "slurmd was not started again"
        time.sleep(1)
    poll_ssh(cluster, f"sacct -n -X -j {job} -o State", lambda out: "COMPLETED" in out, 90, 2)
    assert running_slurm_pods(cluster) == before


def three_gpu_pod(image: str) -> dict[str, Any]:
    """A pod asking sunk's scheduler for three GPUs: on a node with three,
    all of them, whatever their numbers."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod-3", "namespace": "default"},
        "spec": {
            "schedulerName": "sunk-scheduler",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sh", "-c", CONTAINER_PROBE + "echo probed; sleep 3600"],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "3"}},
                }
            ],
        },
    }


def test_a_gpu_that_goes_and_comes_back_changes_slurms_gres_with_no_pod_restarted(
    cluster: Path,
) -> None:
    """Stand-in GPU 1 taken away (its device file moved out of the nodes'
    shared device directory), then put back. Each node's plugin writes the
    GPUs it finds on its Node (`sunk.dev/gpus`) and the kubelet offers as
    many; the operator's gres.conf names those device files; the NodeSet
    controller drains each node, lets a running job end, and has its slurmd
    register anew in the same pod: `sinfo` says gpu:3, a one-GPU step is
    denied two of 0, 2 and 3 (Slurm's devices now), never 1, and a pod
    placed by sunk's scheduler with three GPUs holds 0, 2 and 3 (Slurm's
    `IDX:0-2`: Slurm counts a node's GPUs in its gres.conf line's order);
    then gpu:4 again. No pod of the Slurm namespace is restarted or
    replaced."""
    before = running_slurm_pods(cluster)
    pod = three_gpu_pod(summary(cluster)["images"]["sunk/slurm"])
    devices = cluster / "gpus"
    away = devices / ".nvidia1.away"
    job = ssh(cluster, "sbatch --parsable -w compute-local-1 --gres=gpu:1 --wrap 'sleep 30'")
    job = job.strip()
    wait_running(cluster, job)

    def wait_for(listed: str, offered: str, files: str, gres: str) -> None:
        deadline = time.monotonic() + 420
        while (seen := node_gpus(cluster)) != {f"local-{i}": (listed, offered) for i in (1, 2, 3)}:
            assert time.monotonic() < deadline, f"wanted {listed}, {offered} on every node: {seen}"
            time.sleep(2)
        wanted = [f"NodeName={n} Name=gpu File=/dev/nvidia[{files}]" for n in NODES]
        while (lines := gres_lines(cluster)) != wanted:
            assert time.monotonic() < deadline, lines
            time.sleep(2)
        poll_ssh(
            cluster,
            "sinfo -h -N -o '%N %G %T'",
            lambda out: sorted(out.splitlines()) == [f"{n} {gres} idle" for n in NODES],
            max(deadline - time.monotonic(), 1),
            2,
        )

    (devices / "nvidia1").rename(away)
    try:
        wait_for("0,2,3", "3", "0,2-3", "gpu:3")
        assert "COMPLETED" in ssh(cluster, f"sacct -n -X -j {job} -o State")
        # A one-GPU step: Slurm's device cgroup denies the other two GPUs of
        # the node's line (0, 2, 3), and knows nothing of the one gone.
        seen = probe(cluster, "-w compute-local-1 --gres=gpu:1")
        denied = {i for i, s in seen.items() if s == "denied"}
        assert len(denied) == 2, seen
        assert denied <= {0, 2, 3}, seen
        # Slurm's IDX:0-2 on the node is its line's 0, 2 and 3, and so are
        # the devices the pod holds.
        created = kubectl(cluster, "create", "-f", "-", input=json.dumps(pod))
        assert created.returncode == 0, created.stderr
        got, logs = wait_probed(cluster, pod["metadata"]["name"])
        assert job_gpus(cluster, got["metadata"]["annotations"]["sunk.dev/slurm-job-id"]) == {
            0,
            1,
            2,
        }
        assert read_probe(logs.splitlines()).devices == gpu_nodes({0, 2, 3}), logs
    finally:
        kubectl(cluster, "delete", "pod", "-n", "default", pod["metadata"]["name"])
        away.rename(devices / "nvidia1")
    wait_for("0,1,2,3", str(GPUS), f"0-{GPUS - 1}", f"gpu:{GPUS}")
    assert running_slurm_pods(cluster) == before
