"""sunk's images, built here with buildah and served by Debian's docker-registry.

The first run builds every image (minutes); later runs find them pushed and
only start a registry and read from it. A static binary stands in for CoreDNS
(the node build makes the real one), so its packaging is tested here too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sunk_testbed.images import (
    REGISTRY_HOST,
    Image,
    ImageSet,
    Registry,
    build_pause,
    ensure_images,
)
from sunk_testbed.procs import Supervisor

# A cold build debootstraps and installs Slurm and sunk's dependencies.
pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def pause_binary() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sunk-pause-") as out:
        yield build_pause(Path(out))


@pytest.fixture(scope="module")
def images(pause_binary: Path) -> ImageSet:
    return ensure_images(lambda message: print(f"[images] {message}"), coredns=pause_binary)


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    state = Path(tempfile.mkdtemp(prefix="sunk-reg-", dir="/tmp"))
    served = Registry(state, Supervisor(state))
    try:
        yield served.start()
    finally:
        served.stop()
        shutil.rmtree(state, ignore_errors=True)


def skopeo(*args: str) -> str:
    result = subprocess.run(
        ["skopeo", *args], capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def config_of(registry: str, image: Image) -> dict[str, Any]:
    reference = f"docker://{image.ref_at(registry)}"
    config: dict[str, Any] = json.loads(
        skopeo("inspect", "--tls-verify=false", "--config", reference)
    )
    return config["config"]


def pulled(
    registry: str, image: Image, tmp_path: Path, read: tuple[str, ...] = ()
) -> tuple[dict[str, tarfile.TarInfo], dict[str, bytes]]:
    """Every path in the image's layers as a node pulls them from the registry
    (later layers win), and the content of the paths in `read`. Listing the
    layers takes seconds where unpacking the Slurm image would take ten."""
    layout = tmp_path / "oci"
    skopeo(
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        f"docker://{image.ref_at(registry)}",
        f"oci:{layout}:image",
    )

    def blob(digest: str) -> Path:
        return layout / "blobs" / digest.replace(":", "/")

    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    members: dict[str, tarfile.TarInfo] = {}
    contents: dict[str, bytes] = {}
    for layer in manifest["layers"]:
        with tarfile.open(blob(layer["digest"]), "r|*") as tar:
            for member in tar:
                path = member.name.removeprefix("./")
                members[path] = member
                if path in read and (data := tar.extractfile(member)) is not None:
                    contents[path] = data.read()
    return members, contents


def test_every_image_is_served_by_its_digest(images: ImageSet, registry: str) -> None:
    names = {image.repository for image in images.all()}
    assert names == {
        "sunk/slurm",
        "sunk/slurm-login",
        "sunk/sunk",
        "sunk/pause",
        "sunk/coredns",
        "sunk/prometheus",
        "sunk/container-test",
        "sunk/container-poisoned",
        "sunk/ldap",
    }
    for image in images.all():
        assert image.ref == f"{REGISTRY_HOST}/{image.repository}:{image.tag}"
        reference = f"docker://{image.ref_at(registry)}"
        served = json.loads(skopeo("inspect", "--tls-verify=false", reference))
        assert served["Digest"] == image.digest, image.repository
        assert served["Architecture"] == "amd64"


def test_unchanged_inputs_are_a_cache_hit(images: ImageSet, pause_binary: Path) -> None:
    started = time.monotonic()
    again = ensure_images(lambda message: None, coredns=pause_binary)
    assert again == images
    assert time.monotonic() - started < 5


def test_the_bed_registry_is_read_only(images: ImageSet, registry: str, tmp_path: Path) -> None:
    layout = tmp_path / "oci"
    skopeo(
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        f"docker://{images.pause.ref_at(registry)}",
        f"oci:{layout}:pause",
    )
    refused = subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            f"oci:{layout}:pause",
            f"docker://{registry}/sunk/not-pushed:x",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert refused.returncode != 0


# What the Slurm images must and must not hold, as paths in their layers. A
# symlink counts: Debian links usr/bin/gcc to gcc-<version>, and usr/bin/mpicc
# and usr/bin/mpirun through /etc/alternatives.
SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "slurmrestd")
DATABASE_SERVERS = ("usr/sbin/mariadbd", "usr/sbin/mysqld")
DAEMONS_IMAGE_HOLDS = (
    *(f"usr/sbin/{daemon}" for daemon in (*SLURM_DAEMONS, "munged", "sshd", "nslcd")),
    "usr/sbin/mariadbd",
    "usr/bin/mpirun",  # Open MPI, for training jobs
    "usr/bin/skopeo",  # container jobs fetch images with these two
    "usr/bin/umoci",
)
MPI_HEADER = "usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h"
# Compute nodes run programs; they build none (the login pod does). Their
# openmpi-bin carries mpicc's wrapper, which without these builds nothing.
DAEMONS_IMAGE_LACKS = ("usr/bin/gcc", "usr/bin/cc", MPI_HEADER)
LOGIN_IMAGE_HOLDS = (
    *(f"usr/bin/{client}" for client in ("sbatch", "srun", "salloc", "squeue", "sinfo")),
    *(f"usr/bin/{client}" for client in ("sacct", "sacctmgr", "scontrol", "scancel")),
    "usr/bin/gcc",
    "usr/bin/g++",
    "usr/bin/make",
    "usr/bin/mpicc",
    MPI_HEADER,
    "usr/bin/mpirun",
    "usr/bin/python3",
    "usr/bin/vi",
    "usr/bin/vim.tiny",
    "usr/bin/nano",
    "usr/bin/less",
    "usr/bin/git",
    "usr/bin/curl",
    "usr/bin/ssh",
    "usr/sbin/sshd",
    "usr/lib/openssh/sftp-server",  # the chart's sshd_config names it
    "usr/lib/openssh/ssh-keysign",  # hostbased ssh to the nodes of one's jobs
    "usr/bin/ldapsearch",  # sshd's AuthorizedKeysCommand with identity.provider ldap
    # homes.createOnLogin: pam_mkhomedir runs the helper, which copies /etc/skel.
    "usr/lib/x86_64-linux-gnu/security/pam_mkhomedir.so",
    "usr/sbin/mkhomedir_helper",
    "etc/skel/.bashrc",
    "usr/lib/sunk/spank_containers.so",
)
# The one host users reach: no Slurm daemon, no database server.
LOGIN_IMAGE_LACKS = (*(f"usr/sbin/{daemon}" for daemon in SLURM_DAEMONS), *DATABASE_SERVERS)


def test_slurm_images_hold_the_daemons(images: ImageSet, registry: str, tmp_path: Path) -> None:
    files, read = pulled(registry, images.slurm, tmp_path, read=("etc/passwd", "etc/nsswitch.conf"))
    assert [path for path in DAEMONS_IMAGE_HOLDS if path not in files] == []
    assert [path for path in DAEMONS_IMAGE_LACKS if path in files] == []
    assert b"slurm:x:64030:64030:" in read["etc/passwd"]
    # Host keys and the munge key are the deployment's Secrets, never the image's.
    assert not [path for path in files if path.startswith("etc/ssh/ssh_host_")]
    assert "etc/munge/munge.key" not in files
    # nslcd's NSS module is there for identity.provider ldap, unused until the chart asks.
    assert [path for path in files if path.endswith("/libnss_ldap.so.2")]
    assert b"ldap" not in read["etc/nsswitch.conf"]
    assert not [path for path in files if path.startswith("var/lib/apt/lists/deb.")]
    assert not [path for path in files if path.startswith("usr/share/man/")], "not slim"
    assert config_of(registry, images.slurm)["Cmd"] == ["slurmctld", "-D"]


@pytest.mark.parametrize("field", ["login", "login_24_11"])
def test_login_images_hold_clients_and_compilers_but_no_daemon(
    images: ImageSet, registry: str, tmp_path: Path, field: str
) -> None:
    image: Image = getattr(images, field)
    files, read = pulled(registry, image, tmp_path, read=("etc/passwd", "etc/nsswitch.conf"))
    assert [path for path in LOGIN_IMAGE_HOLDS if path not in files] == []
    assert [path for path in LOGIN_IMAGE_LACKS if path in files] == []
    # Slurm's clients authenticate with munge and, for `scontrol token`, know auth/jwt.
    for plugin in ("auth_munge.so", "auth_jwt.so"):
        assert [path for path in files if path.endswith(f"/slurm-wlm/{plugin}")], plugin
    assert [path for path in files if path.endswith("/libnss_ldap.so.2")]
    assert b"ldap" not in read["etc/nsswitch.conf"]
    # The daemons' image's ids, whose /etc/passwd the login pod reads.
    assert b"slurm:x:64030:64030:" in read["etc/passwd"]
    assert b"munge:x:64033:64033:" in read["etc/passwd"]
    # Host keys and the munge key are the deployment's Secrets, never the image's.
    assert not [path for path in files if path.startswith("etc/ssh/ssh_host_")]
    assert "etc/munge/munge.key" not in files
    assert not [path for path in files if path.startswith("var/lib/apt/lists/deb.")]
    assert not [path for path in files if path.startswith("usr/share/man/")], "not slim"
    config = config_of(registry, image)
    assert config["Cmd"] == ["/usr/sbin/sshd", "-D", "-e"]
    assert "22/tcp" in config["ExposedPorts"]


def test_ldap_image_holds_slapd_and_no_directory(
    images: ImageSet, registry: str, tmp_path: Path
) -> None:
    files, read = pulled(registry, images.ldap, tmp_path, read=("etc/passwd",))
    for tool in ("usr/sbin/slapd", "usr/sbin/slapadd", "usr/bin/ldapadd", "usr/sbin/slappasswd"):
        assert tool in files, tool
    # The chart grants this fixed uid the directory's management over ldapi://.
    assert b"openldap:x:64035:64035:" in read["etc/passwd"]
    # No baked configuration or database: the chart makes both at start.
    baked = [p for p in files if p.startswith(("etc/ldap/slapd.d/", "var/lib/ldap/"))]
    assert not [p for p in baked if files[p].isfile()]
    assert config_of(registry, images.ldap)["User"] == "64035:64035"


def test_sunk_image_runs_sunk_as_non_root(images: ImageSet, registry: str, tmp_path: Path) -> None:
    files, _ = pulled(registry, images.sunk, tmp_path)
    assert files["opt/sunk/bin/sunk"].isfile()
    # The product alone: no test bed, no node agent, no test dependency.
    installed = [path for path in files if "/site-packages/" in path]
    assert [path for path in installed if path.endswith("/site-packages/sunk/cli.py")]
    workshop = (
        "/sunk_testbed/",
        "/sunk/local/",
        "/site-packages/_pytest/",
        "/site-packages/hypothesis/",
    )
    assert not [path for path in installed if any(part in path for part in workshop)]
    config = config_of(registry, images.sunk)
    assert config["User"] == "65532:65532"
    assert config["Cmd"] == ["sunk", "--help"]


def test_binary_images_are_one_file(images: ImageSet, registry: str, tmp_path: Path) -> None:
    assert images.coredns is not None
    for image, entrypoint in ((images.pause, "/pause"), (images.coredns, "/coredns")):
        (tmp_path / image.repository).mkdir(parents=True)
        files, _ = pulled(registry, image, tmp_path / image.repository)
        assert list(files) == [entrypoint[1:]]
        assert files[entrypoint[1:]].mode & 0o111
        assert config_of(registry, image)["Entrypoint"] == [entrypoint]
    assert config_of(registry, images.pause)["User"] == "65535:65535"


def test_pause_reaps_orphans_and_exits_on_sigterm(pause_binary: Path) -> None:
    # pause as PID 1 of a new PID namespace, as in a pod that shares one.
    pod = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", str(pause_binary)])
    try:
        pause = wait_for_child(pod.pid)
        # The shell exits at once; its background sleep is re-parented to pause.
        subprocess.run(
            ["nsenter", "--target", str(pause), "--pid", "--", "sh", "-c", "sleep 0.2 &"],
            check=True,
        )
        time.sleep(1)
        children = [pid for pid in all_pids() if parent_of(pid) == pause]
        assert not children, "an orphan was left to pause unreaped"
        os.kill(pause, signal.SIGTERM)
        assert pod.wait(timeout=5) == 0
    finally:
        pod.kill()
        pod.wait()


def all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def parent_of(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def wait_for_child(parent: int) -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        children = [pid for pid in all_pids() if parent_of(pid) == parent]
        if children:
            return children[0]
        time.sleep(0.02)
    raise AssertionError("pause did not start")
