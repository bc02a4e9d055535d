"""Container jobs with pyxis' options, on the README's cluster (docs/containers.md).

A researcher on the login pod types `srun --container-image=...` or `sbatch
--container-image=...`; the step runs in that image, pulled by the slurmd pods
from the registry the nodes pull from (the bed's, under the name
`registry.sunk.test`), as the researcher, in the job's cgroup. The image is the
bed's `sunk/container-test` (BusyBox and an os-release no slurmd image has), so
every output below says whose userland the step ran in.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plugins.local_cluster import kubectl, ssh, summary
from sunk_testbed.bed import NAMESPACE, USER_NAME, USER_UID

pytestmark = pytest.mark.e2e

MARKER = "ID=sunk-container-test"
HOME = f"/home/{USER_NAME}"


@pytest.fixture
def image(local_cluster: Path) -> str:
    """The test image as researchers would name it: the cluster registry's name."""
    ref: str = summary(local_cluster)["images"]["sunk/container-test"]
    return ref


def test_srun_runs_the_step_in_the_image_as_the_user_in_the_jobs_cgroup(
    local_cluster: Path, image: str
) -> None:
    """On every compute node at once: the image's userland and ENV, the
    researcher's uid and name, and the job's own cgroup; without the option the
    same command shows the slurmd image's Debian."""
    out = ssh(
        local_cluster,
        f"srun -N3 --container-image={image} sh -c "
        "'cat /etc/os-release; echo uid=$(id -u) user=$(id -un) env=$SUNK_CONTAINER_TEST;"
        " grep -c job_$SLURM_JOB_ID /proc/self/cgroup; hostname'",
    )
    assert out.count(MARKER) == 3, out
    assert out.count(f"uid={USER_UID} user={USER_NAME} env=1") == 3, out
    lines = out.splitlines()
    # Every cgroup hierarchy line of the task names the job (task/cgroup's layout).
    cgroup_counts = [int(line) for line in lines if line.isdigit()]
    assert len(cgroup_counts) == 3, out
    assert all(count > 0 for count in cgroup_counts), out
    assert len({line for line in lines if line.startswith("compute-")}) == 3, out

    plain = ssh(local_cluster, "srun cat /etc/os-release")
    assert "ID=debian" in plain, plain
    assert MARKER not in plain, plain


def test_sbatch_runs_the_batch_script_in_the_image(local_cluster: Path, image: str) -> None:
    out = ssh(
        local_cluster,
        f"cd {HOME} && sbatch --wait --parsable -o {HOME}/containers-%j.out"
        f" --container-image={image} --wrap 'cat /etc/os-release; id -un'"
        f" && cat {HOME}/containers-*.out && rm -f {HOME}/containers-*.out",
    )
    assert MARKER in out, out
    assert USER_NAME in out.split(), out


def test_container_mounts_and_home(local_cluster: Path, image: str) -> None:
    """--container-mounts shows a directory of the node (the shared homes) at
    the path asked for, read-only with `:ro`, writable by the user without; the
    home itself is not mounted unless --container-mount-home asks (pyxis'
    default)."""
    data = f"{HOME}/container-data"
    out = ssh(
        local_cluster,
        f"mkdir -p {data} && echo from-the-node >{data}/marker && srun"
        f" --container-image={image} --container-mounts={data}:/data:ro,{data}:/data-rw"
        " sh -c 'cat /data/marker; touch /data/x 2>/dev/null || echo read-only;"
        " touch /data-rw/written && echo written; pwd; ls -A $HOME | wc -l'",
    )
    # The step starts in the directory srun was run from, made empty in the
    # container's own layer when the image lacks it: the home is not mounted.
    assert out.split() == ["from-the-node", "read-only", "written", HOME, "0"], out
    out = ssh(
        local_cluster,
        f"cd {HOME} && srun --container-image={image} --container-mount-home"
        f" sh -c 'pwd; cat {data}/marker; cat /etc/os-release'"
        f" && ls {data} && rm -rf {data}",
    )
    assert out.splitlines()[:2] == [HOME, "from-the-node"], out
    assert MARKER in out, out
    assert "written" in out.split(), out


def test_a_named_container_lasts_for_its_jobs_steps_and_nothing_outlives_the_job(
    local_cluster: Path, image: str
) -> None:
    """--container-name keeps the container's filesystem for the job's later
    steps (which may omit the image, as with pyxis); an unnamed step starts from
    the image again. When the job is gone, no step's or job's container is left
    in any slurmd pod's cache (the images stay: they are the cache)."""
    script = (
        f"srun --container-image={image} --container-name=work --container-workdir=/work"
        " sh -c 'echo kept >state; pwd';"
        " srun --container-name=work cat /work/state;"
        f" srun --container-image={image} sh -c 'test -e /work && echo leaked || echo fresh'"
    )
    out = ssh(
        local_cluster,
        f'cd {HOME} && sbatch --wait -N1 -o {HOME}/named-%j.out --wrap "{script}"'
        f" >/dev/null; cat {HOME}/named-*.out && rm -f {HOME}/named-*.out",
    )
    assert out.split() == ["/work", "kept", "fresh"], out
    cache = "/var/lib/sunk-containers"
    listing = f"find {cache}/steps {cache}/jobs -mindepth 1 -maxdepth 1 2>/dev/null"
    deadline = time.monotonic() + 20
    while any(
        left := [_in_pod(local_cluster, pod, listing) for pod in _slurmd_pods(local_cluster)]
    ):
        assert time.monotonic() < deadline, left
        time.sleep(1)


def test_an_image_that_cannot_be_fetched_fails_the_step_with_the_reason(
    local_cluster: Path,
) -> None:
    missing = "registry.sunk.test/sunk/no-such-image:1"
    out = ssh(local_cluster, f"srun --container-image={missing} true 2>&1; echo exit=$?")
    assert "exit=0" not in out, out
    assert f"cannot fetch {missing}" in out, out


def _slurmd_pods(cluster: Path) -> list[str]:
    listed = kubectl(
        cluster, "get", "pods", "-n", NAMESPACE, "-o", "name",
        "-l", "app.kubernetes.io/component=slurmd",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def _in_pod(cluster: Path, pod: str, command: str) -> str:
    proc = kubectl(cluster, "exec", "-n", NAMESPACE, pod, "-c", "slurmd", "--", "sh", "-c", command)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return proc.stdout.strip()
