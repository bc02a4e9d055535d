"""The container jobs' cache is root's alone, and no path leads root out of it
(docs/containers.md, docs/security.md), on the README's cluster with the
charts' defaults.

Every container step makes root (slurmstepd, the SPANK plugin, container-fetch)
create, write and mount below `/var/lib/sunk-containers` of its slurmd pod,
where every job step and every ssh session of a user runs too. Each test here
is what a login user (the researcher, on the login pod) would try: renaming or
planting links in the cache so that root writes a file of the node's (a
container image whose /etc/passwd is a shell script, written over
container-fetch, would have the next container step run it as root), taking
another job's named container, and reaching the slurmd container's own files
from inside a container step through /proc/1/root or the directories the node
lends the container. Each must fail closed, and no file outside the cache may
change: root's files of every slurmd pod are hashed before and after.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

from plugins.local_cluster import kubectl, ssh, summary
from sunk_testbed.bed import NAMESPACE, USER_NAME

pytestmark = pytest.mark.e2e

CACHE = "/var/lib/sunk-containers"
HOME = f"/home/{USER_NAME}"
MARKER = "ID=sunk-container-test"
# Root's files of a slurmd pod that an escape would write (the fetcher first).
ROOT_FILES = (
    "/usr/lib/sunk/container-fetch",
    "/usr/lib/sunk/spank_containers.so",
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/usr/sbin/slurmd",
    "/usr/sbin/slurmstepd",
    "/usr/bin/skopeo",
)
# What the attacks below would leave, were any of them to work.
PLANTED = r"\( -name 'sunk-planted*' -o -name 'sunk-poisoned*' \)"


@pytest.fixture
def images(local_cluster: Path) -> tuple[str, str]:
    """(the container-test image, the poisoned one) as researchers name them."""
    refs = summary(local_cluster)["images"]
    return refs["sunk/container-test"], refs["sunk/container-poisoned"]


def _slurmd_pods(cluster: Path) -> list[str]:
    listed = kubectl(
        cluster, "get", "pods", "-n", NAMESPACE, "-o", "name",
        "-l", "app.kubernetes.io/component=slurmd",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    pods = listed.stdout.split()
    assert len(pods) == 3, pods
    return pods


def _as_root(cluster: Path, pod: str, command: str) -> str:
    """`command` as root in the pod's slurmd container (the test's own
    vantage point, never the attacker's)."""
    proc = kubectl(cluster, "exec", "-n", NAMESPACE, pod, "-c", "slurmd", "--", "sh", "-c", command)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


def _snapshot(cluster: Path) -> dict[str, str]:
    """Per slurmd pod: the hashes of root's files, the cache's owner and mode,
    and anything an attack below would have left anywhere in the slurmd
    container's own filesystem or Slurm's spool."""
    command = (
        f"sha256sum {' '.join(ROOT_FILES)}; ls -la /usr/lib/sunk;"
        f" stat -c 'cache %U %a %F' {CACHE};"
        f" find / /var/spool/slurmd -xdev {PLANTED} -print"
    )
    return {pod: _as_root(cluster, pod, command) for pod in _slurmd_pods(cluster)}


def _unchanged(cluster: Path, before: dict[str, str], since: int) -> None:
    """The snapshot as before, and no file of any slurmd container's own
    filesystem (but /tmp, which every user may write) changed since `since`."""
    after = _snapshot(cluster)
    assert after == before, (before, after)
    for pod, state in after.items():
        assert "cache root 700 directory" in state, (pod, state)
        # -xdev still lists the mount points (the cache, the spool: their
        # volumes' own times), which are not files of this filesystem; and
        # skopeo, as root, keeps what it learnt of blobs in its own root-only
        # cache, /var/lib/containers/cache, at a path of its own.
        changed = _as_root(
            cluster,
            pod,
            f"find / -xdev -newermt @{since} ! -path '/tmp/*' ! -path /tmp"
            " ! -path /var/lib/containers/cache ! -path '/var/lib/containers/cache/*' -print"
            ' | while read -r path; do mountpoint -q "$path" || echo "$path"; done',
        )
        assert changed == "", (pod, changed)


def _script(cluster: Path, name: str, text: str) -> str:
    """A batch script in the researcher's home, written without a shell's quoting."""
    encoded = base64.b64encode(text.encode()).decode()
    ssh(cluster, f"echo {encoded} | base64 -d >{HOME}/{name}")
    return f"{HOME}/{name}"


def test_a_login_user_can_neither_rename_nor_plant_in_the_cache(
    local_cluster: Path, images: tuple[str, str]
) -> None:
    """A job whose first step (on the node, as the user) tries the finding's
    attacks on the cache: rename `steps/` and `images/`, plant
    `steps/<job>.1/passwd -> container-fetch`, pre-create the next job's named
    container. Its second step runs the poisoned image (its /etc/passwd a
    script): the script is only the container's /etc/passwd, as data. The next
    job's container step (anyone's) fetches with the fetcher intact and gets
    its own named container."""
    image, poisoned = images
    # Every node's cache holds steps/, jobs/ and both images before the attack,
    # whatever ran before: a first fetch on a node makes skopeo's own cache
    # (/var/lib/containers/cache), which is no change the attack made.
    ssh(local_cluster, f"srun -N3 --container-image={image} --container-name=warm true")
    ssh(local_cluster, f"srun -N3 --container-image={poisoned} true")
    since = int(time.time()) - 1
    before = _snapshot(local_cluster)

    attack = (
        f"c={CACHE}; echo cache=$(stat -c %U:%a $c)\n"
        "ls $c >/dev/null 2>&1 && echo listed || echo no-list\n"
        "mv $c/steps $c/steps.user 2>/dev/null && echo renamed-steps || echo no-rename\n"
        "mv $c/images $c/images.user 2>/dev/null && echo renamed-images || echo no-rename\n"
        "mkdir -p $c/steps/$SLURM_JOB_ID.1 2>/dev/null &&"
        " ln -s /usr/lib/sunk/container-fetch $c/steps/$SLURM_JOB_ID.1/passwd 2>/dev/null"
        " && echo planted || echo no-plant\n"
        "next=$((SLURM_JOB_ID + 1))\n"
        "mkdir -p $c/jobs/$next/work 2>/dev/null && echo sha256-0 >$c/jobs/$next/work/image"
        " 2>/dev/null && echo planted-named || echo no-named\n"
    )
    attack_file = _script(local_cluster, "cache-attack-step.sh", attack)
    job = _script(
        local_cluster,
        "cache-attack.sh",
        f"#!/bin/sh\nsrun sh {attack_file}\n"
        f"srun --container-image={poisoned}"
        " sh -c 'cat /etc/passwd; echo env=$SUNK_CONTAINER_TEST'\n",
    )
    out = ssh(
        local_cluster,
        f"cd {HOME} && sbatch --wait -N1 -o {HOME}/cache-attack-%j.out {job} >/dev/null;"
        f" cat {HOME}/cache-attack-*.out; rm -f {HOME}/cache-attack*",
        timeout=180,
    )
    lines = out.split()
    assert lines[:6] == [
        "cache=root:700", "no-list", "no-rename", "no-rename", "no-plant", "no-named",
    ], out  # fmt: skip
    # The step ran in the poisoned image; its /etc/passwd is the image's
    # script, as data, plus the researcher's entry.
    assert "touch /sunk-poisoned-passwd-ran" in out, out
    assert f"\n{USER_NAME}:x:" in out, out
    assert "env=poisoned" in out, out

    victim = ssh(
        local_cluster,
        f"srun -N1 --container-image={image} --container-name=work cat /etc/os-release",
    )
    assert MARKER in victim, victim
    _unchanged(local_cluster, before, since)


def test_no_path_from_a_container_step_leads_into_the_slurmd_container(
    local_cluster: Path, images: tuple[str, str]
) -> None:
    """The container has a /proc of its own (hidepid=invisible): the slurmd
    container's PID 1, and so its /proc/1/root, is not there for the user. What
    root makes for a step (its working directory, --container-workdir, the
    targets of --container-mounts) is made in the container's own filesystem
    only: never through /proc/1/root, an image's link to it, or a directory the
    node lends the container (Slurm's spool)."""
    image, poisoned = images
    since = int(time.time()) - 1
    before = _snapshot(local_cluster)
    src = f"{HOME}/cache-test-src"
    ssh(local_cluster, f"mkdir -p {src} && echo from-the-node >{src}/file")
    try:
        seen = ssh(
            local_cluster,
            f"srun --container-image={image} sh -c 'test -e /proc/1 && echo pid1-visible"
            " || echo pid1-hidden; cat /proc/1/root/etc/os-release 2>/dev/null || echo no-root;"
            " test -e /proc/self/root && echo self-ok'",
        )
        assert seen.split() == ["pid1-hidden", "no-root", "self-ok"], seen

        tries = {
            "workdir": f"--container-image={image}"
            " --container-workdir=/proc/1/root/usr/lib/sunk/sunk-planted-workdir",
            "escape": f"--container-image={poisoned}"
            " --container-workdir=/escape/usr/lib/sunk/sunk-planted-escape",
            "mount": f"--container-image={image}"
            f" --container-mounts={src}/file:/proc/1/root/usr/lib/sunk/sunk-planted-mount",
            "spool": f"--container-image={image}"
            f" --container-mounts={src}/file:/var/spool/slurmd/sunk-planted-spool",
            "escape-mount": f"--container-image={poisoned}"
            f" --container-mounts={src}:/escape/usr/lib/sunk/sunk-planted-escape-mount",
        }
        for name, options in tries.items():
            out = ssh(local_cluster, f"srun {options} cat /etc/os-release 2>&1; echo exit=$?")
            assert "exit=0" not in out, (name, out)
            assert "containers: cannot" in out, (name, out)
        # srun's own --chdir: nothing is made; Slurm (as the user) cannot get
        # there and starts the step in /tmp.
        out = ssh(
            local_cluster,
            f"srun --container-image={image} --chdir=/proc/1/root/usr/lib/sunk/sunk-planted-cwd"
            " pwd 2>&1",
        )
        assert "/tmp" in out.split(), out
    finally:
        ssh(local_cluster, f"rm -rf {src}")
    _unchanged(local_cluster, before, since)


def test_the_plugin_refuses_a_cache_others_could_write_and_follows_no_link_in_it(
    local_cluster: Path, images: tuple[str, str]
) -> None:
    """Were the cache writable by users (a volume the chart could not make
    root's: here root makes it 0777 again, as the emptyDir was), the plugin
    refuses every container step with the reason; and what a user planted
    meanwhile (`steps` renamed, a link to /usr/lib/sunk in its place) is
    never followed once the cache is root's again: the step fails, nothing
    is written through the link."""
    image, _ = images
    pod = _slurmd_pods(local_cluster)[0]
    node = _as_root(local_cluster, pod, "echo $SLURMD_NODENAME").strip()
    since = int(time.time()) - 1
    before = _snapshot(local_cluster)
    try:
        _as_root(local_cluster, pod, f"chmod 0777 {CACHE}")
        out = ssh(
            local_cluster, f"srun -w {node} --container-image={image} true 2>&1; echo exit=$?"
        )
        assert "exit=0" not in out, out
        assert f"{CACHE} must be a directory of root's that only root can write" in out, out
        assert "mode 0777" in out, out

        planted = ssh(
            local_cluster,
            f"srun -w {node} sh -c 'c={CACHE}; mv $c/steps $c/steps.user 2>/dev/null;"
            " ln -s /usr/lib/sunk $c/steps && echo planted'",
        )
        assert "planted" in planted, planted
        _as_root(local_cluster, pod, f"chmod 0700 {CACHE}")
        out = ssh(
            local_cluster, f"srun -w {node} --container-image={image} true 2>&1; echo exit=$?"
        )
        assert "exit=0" not in out, out
        assert "steps in the container cache" in out, out
        assert "Too many levels of symbolic links" in out, out
    finally:
        _as_root(
            local_cluster,
            pod,
            f"c={CACHE}; if [ -L $c/steps ]; then rm $c/steps; fi;"
            f" if [ -d $c/steps.user ]; then mv $c/steps.user $c/steps; fi; chmod 0700 $c",
        )
    _unchanged(local_cluster, before, since)
    out = ssh(local_cluster, f"srun -w {node} --container-image={image} cat /etc/os-release")
    assert MARKER in out, out
