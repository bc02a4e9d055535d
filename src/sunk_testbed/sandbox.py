"""Run a command inside a root filesystem, the way a container runtime would.

Each sandboxed process gets private mount and UTS namespaces (optionally a
network namespace), a throwaway writable overlay over the cached root
filesystem, fresh /proc, read-only /sys, the host's /dev, and the bind mounts
it asks for. All of its mounts live in its own namespace, so they vanish with
the process: nothing is left on the host's mount table, and the cached root
filesystem is never written to.

The command line is built so that the pid that `unshare` gets is, after a
chain of `exec`s, the sandboxed command itself: signals reach it directly.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Bind:
    """A host path mounted at `target` inside the root filesystem."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Sandbox:
    rootfs: Path
    # An empty host directory used as the mount point of the merged root; each
    # namespace mounts its own root there, so one directory serves every sandbox.
    mountpoint: Path
    binds: Sequence[Bind] = ()
    hostname: str | None = None
    netns: str | None = None  # a name under /run/netns
    user: tuple[int, int] | None = None  # uid, gid inside the root filesystem
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    # Directories created inside the root filesystem before the command runs
    # (e.g. a container's workingDir that the image does not have).
    mkdirs: Sequence[str] = ()

    def argv(self, command: Sequence[str]) -> list[str]:
        root = shlex.quote(str(self.mountpoint))
        layer = shlex.quote(str(self.mountpoint) + ".layer")
        steps = [
            "set -e",
            f"mount -t tmpfs -o mode=0755 sunk-layer {layer}",
            f"mkdir {layer}/upper {layer}/work",
            "mount -t overlay sunk-root -o "
            + shlex.quote(
                f"lowerdir={self.rootfs},upperdir={self.mountpoint}.layer/upper,"
                f"workdir={self.mountpoint}.layer/work"
            )
            + f" {root}",
            f"mount -t proc proc {root}/proc",
            f"mount -t sysfs -o ro sysfs {root}/sys",
            f"mount --rbind /dev {root}/dev",
        ]
        for bind in self.binds:
            target = root + shlex.quote(resolve_in_root(self.rootfs, bind.target))
            if bind.source.is_dir():
                steps.append(f"mkdir -p {target}")
            else:
                steps.append(f"mkdir -p $(dirname {target}) && touch {target}")
            steps.append(f"mount --bind {shlex.quote(str(bind.source))} {target}")
            if bind.read_only:
                steps.append(f"mount -o remount,bind,ro {target}")
        for directory in self.mkdirs:
            steps.append(f"mkdir -p {root}{shlex.quote(resolve_in_root(self.rootfs, directory))}")
        if self.hostname:
            steps.append(f"hostname {shlex.quote(self.hostname)}")
        chroot = ["exec", "chroot"]
        if self.user is not None:
            uid, gid = self.user
            chroot.append(f"--userspec={uid}:{gid}")
        chroot += [str(self.mountpoint), "/usr/bin/env", "-i", f"--chdir={self.workdir}"]
        home = "/root" if self.user is None else "/tmp"  # noqa: S108 (inside the sandbox)
        env = {"PATH": DEFAULT_PATH, "HOME": home}
        env.update(self.env)
        chroot += [f"{k}={v}" for k, v in env.items()]
        steps.append(" ".join(shlex.quote(a) if a != "exec" else a for a in chroot) + ' "$@"')
        unshare = ["unshare", "--mount", "--uts", "--propagation", "private"]
        if self.netns:
            # Join the existing namespace first: `unshare --net=FILE` would make a
            # new one and bind-mount it over FILE. nsenter execs (no fork), so the
            # pid stays the command's.
            unshare = ["nsenter", f"--net=/run/netns/{self.netns}", "--", *unshare]
        return [*unshare, "--", "/bin/sh", "-c", "\n".join(steps), "sandbox", *command]


def resolve_in_root(rootfs: Path, path: str) -> str:
    """`path` as seen inside the root filesystem, its symlinks followed there.

    Bind targets are created from the host (`mkdir -p $root/...`); a symlink
    in the image such as /var/run -> /run would otherwise be followed on the
    host and the mount would land outside the sandbox.
    """
    pending = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = rootfs.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise ValueError(f"too many symlinks resolving {path} in {rootfs}")
            link = os.readlink(candidate)
            if link.startswith("/"):
                resolved = []
            pending = [p for p in link.split("/") if p] + pending
            continue
        resolved.append(part)
    return "/" + "/".join(resolved)


def ids(rootfs: Path, user: str) -> tuple[int, int]:
    """uid and gid of `user` as the root filesystem's /etc/passwd has them."""
    for line in (rootfs / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise KeyError(f"no user {user!r} in {rootfs}/etc/passwd")
