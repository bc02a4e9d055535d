"""The test bed's real Slurm: munged, slurmctld, N slurmd and slurmrestd.

Every daemon runs in its own sandbox (see sandbox.py) over the cached Debian
root filesystem, so the host needs no Slurm and nothing is installed on it.
What the daemons must share lives in the bed's state directory and is bound
into each sandbox:

    slurm/etc          -> /etc/slurm (ro)   slurm.conf, cgroup.conf, jwt_hs256.key
    slurm/munge        -> /etc/munge (ro)   munge.key
    slurm/run-munge    -> /run/munge        munged's socket, for every sandbox
    slurm/spool/ctld   -> /var/spool/slurmctld
    slurm/spool/slurmd -> /var/spool/slurmd (one subdirectory per node, %n)
    slurm/log          -> /var/log/slurm    slurmctld.log, slurmd-<node>.log
    slurm/tmp          -> /tmp              jobs' working directory, shared
    slurm/hosts, passwd, group -> /etc/...  the controller's name, a plain user
    slurm/root, slurm/root.layer            the sandboxes' (private) mount point

Users: munged runs as munge; slurmctld starts as root and drops to SlurmUser
slurm by itself; slurmd is root (it must switch to job users); slurmrestd
runs as slurmrest, since it refuses root and SlurmUser.

Every sandbox gets the same host name (CONTROLLER_HOST): slurmctld insists on
running on the host named by SlurmctldHost, and munged on a name that
resolves. All ports are picked free at start, so several beds can run at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx2

from sunk_testbed.paths import SCRIPTS, cache_dir
from sunk_testbed.procs import StartError, Supervisor, free_port, port_open, tail
from sunk_testbed.sandbox import Bind, Sandbox, ids

CONTROLLER_HOST = "sunk-ctl"
CLUSTER_NAME = "sunk-tb"
PARTITION = "debug"
# Dynamic nodes (`slurmd -Z --conf "Feature=dynamic"`) join the default
# partition through this node set.
DYNAMIC_FEATURE = "dynamic"
# A non-admin account for tests of what plain users may (not) do; added to the
# sandboxes' /etc/passwd, the root filesystem itself has no such user.
PLAIN_USER = "tbuser"
PLAIN_UID = 2000
REST_API = "v0.0.42"
# The sandboxes' /tmp: a bind of `slurm/tmp`, shared by CLIs and nodes, so a
# job's working directory and output files exist on both sides.
SHARED_TMP = "/tmp"  # noqa: S108 - not the host's /tmp

# What the bed's slurm.conf needs for its daemons to run in the sandboxes.
SANDBOX_SETTINGS: dict[str, str | int] = {
    "SlurmctldPidFile": "/run/slurmctld.pid",
    "SlurmdPidFile": "/run/slurmd-%n.pid",
    "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
    "SlurmdLogFile": "/var/log/slurm/slurmd-%n.log",
    # No cgroups in the sandboxes.
    "ProctrackType": "proctrack/linuxproc",
    "TaskPlugin": "task/none",
    "JobAcctGatherType": "jobacct_gather/none",
    "MpiDefault": "none",
    "MailProg": "/bin/true",  # the rootfs has no mailer; slurmctld logs an error otherwise
    # Nodes may report other hardware than configured (all share one host).
    "SlurmdParameters": "config_overrides",
}

_DAEMON_USER_SLURM = "slurm"
_DAEMON_USER_REST = "slurmrest"
_DAEMON_USER_MUNGE = "munge"


# Part of the root filesystem's cache name: bump it whenever testbed/slurm/*.sh
# change what is installed, so old clones keep their root filesystem and new
# ones build the new one (r2: slurmdbd, MariaDB, sshd for the charts; r3: tini).
ROOTFS_REVISION = 3


def rootfs_dir(suite: str) -> Path:
    """Where the root filesystem of `suite` at this revision is cached."""
    return cache_dir() / "rootfs" / f"{suite}-r{ROOTFS_REVISION}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_rootfs(
    suite: str = "trixie",
    log: Callable[[str], None] = _stderr,
    *,
    ignore_release_expiry: bool | None = None,
) -> Path:
    """The cached root filesystem with Slurm, built by testbed/slurm/rootfs.sh if missing.

    `ignore_release_expiry`: testing/unstable Release files carry a
    Valid-Until a week ahead; a mirror snapshot older than that makes apt
    refuse them ("Release file ... is expired"). This tells apt inside the
    chroot to accept them, through APT_CONFIG pointing at a memfd of this
    process (visible in the chroot's fresh /proc), so nothing is written to
    the host or the scripts. By default, for every suite but stable trixie.
    """
    if ignore_release_expiry is None:
        ignore_release_expiry = suite != "trixie"
    out = rootfs_dir(suite)
    if (out / ".complete").exists():
        return out
    log(f"building the Slurm root filesystem {out} (debootstrap {suite}, ~1 min)")
    env = dict(os.environ)
    keep: tuple[int, ...] = ()
    if ignore_release_expiry:
        fd = os.memfd_create("sunk-apt.conf", 0)
        os.write(fd, b'Acquire::Check-Valid-Until "false";\n')
        env["APT_CONFIG"] = f"/proc/{os.getpid()}/fd/{fd}"
        keep = (fd,)
    try:
        proc = subprocess.Popen(
            ["bash", str(SCRIPTS / "slurm" / "rootfs.sh"), str(out), suite],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            pass_fds=keep,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip("\n"))
        returncode = proc.wait()
    finally:
        for fd in keep:
            os.close(fd)
    if returncode != 0 or not (out / ".complete").exists():
        raise RuntimeError(f"rootfs.sh {out} {suite} failed (exit {returncode})")
    return out


# The Debian suite whose root filesystem runs each supported Slurm release on
# the host (the images build 26.05 from forky; sid carries the same 26.05.5).
ROOTFS_SUITES = {"26.05": "sid", "24.11": "trixie"}


def ensure_release_rootfs(release: str, log: Callable[[str], None] = _stderr) -> Path:
    """The root filesystem of Slurm `release`."""
    return ensure_rootfs(ROOTFS_SUITES[release], log)


@dataclass(frozen=True)
class SlurmAccess:
    """How to reach a running bed's Slurm; recorded in `slurm/access.json`."""

    restd_url: str
    rootfs: Path
    conf_dir: Path  # host path of /etc/slurm
    jwt_key: Path  # host path of the HS256 key slurmctld verifies tokens with
    nodes: list[str]
    cluster_name: str
    slurm_version: str
    # What a node runtime needs to add slurmd elsewhere (e.g. dynamic nodes).
    slurmctld_port: int = 0
    controller_address: str = "127.0.0.1"
    munge_socket_dir: Path = Path()  # host path of /run/munge
    munge_key: Path = Path()
    plain_user: str = PLAIN_USER

    def to_json(self) -> str:
        raw = asdict(self)
        for key, value in raw.items():
            if isinstance(value, Path):
                raw[key] = str(value)
        return json.dumps(raw, indent=1)

    @classmethod
    def from_json(cls, text: str) -> SlurmAccess:
        raw = json.loads(text)
        for key in ("rootfs", "conf_dir", "jwt_key", "munge_socket_dir", "munge_key"):
            raw[key] = Path(raw[key])
        return cls(**raw)


class SlurmCommandError(subprocess.CalledProcessError):
    """A Slurm CLI failed; unlike the base class, the message shows its output."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


class SlurmCluster:
    """One Slurm cluster of the test bed, its daemons recorded by `supervisor`.

    Its slurm.conf is the sandbox's fixture (`_slurm_conf`), not sunk's: a
    cluster's comes from the chart. Callers change it with `extra_conf`,
    lines appended last (a key set again there overrides the bed's: Slurm
    takes the last value), and `node_conf`, more `Key=Value` items on a
    static node's line (`{"tb1": "Gres=gpu:fake:2"}`), which a line appended
    after it could not add; `etc_files` adds files to /etc/slurm (gres.conf,
    topology.conf, ...).
    """

    def __init__(
        self,
        state_dir: Path,
        supervisor: Supervisor,
        rootfs: Path,
        nodes: int = 3,
        extra_conf: Sequence[str] = (),
        *,
        controller_address: str = "127.0.0.1",
        max_node_count: int = 1024,
        node_conf: Mapping[str, str] | None = None,
        etc_files: Mapping[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.supervisor = supervisor
        self.rootfs = rootfs
        self.node_names = [f"tb{i}" for i in range(1, nodes + 1)]
        self.extra_conf = list(extra_conf)
        self.controller_address = controller_address
        self.max_node_count = max_node_count
        self.node_conf = dict(node_conf or {})
        if unknown := set(self.node_conf) - set(self.node_names):
            raise ValueError(f"node_conf names nodes the bed does not have: {sorted(unknown)}")
        self.etc_files = dict(etc_files or {})
        self.dir = state_dir / "slurm"
        self.etc = self.dir / "etc"
        self.munge_etc = self.dir / "munge"
        self.munge_run = self.dir / "run-munge"
        self.spool_ctld = self.dir / "spool" / "ctld"
        self.spool_slurmd = self.dir / "spool" / "slurmd"
        self.log_dir = self.dir / "log"
        self.tmp = self.dir / "tmp"
        self.mountpoint = self.dir / "root"
        self._access_file = self.dir / "access.json"

    @classmethod
    def attach(cls, state_dir: Path, supervisor: Supervisor) -> SlurmCluster:
        """The cluster a bed in `state_dir` runs (started elsewhere, e.g. `sunk local up`)."""
        recorded = SlurmAccess.from_json((state_dir / "slurm" / "access.json").read_text())
        cluster = cls(
            state_dir,
            supervisor,
            recorded.rootfs,
            len(recorded.nodes),
            controller_address=recorded.controller_address,
        )
        cluster.node_names = list(recorded.nodes)
        return cluster

    # -- names and sandboxes -------------------------------------------------

    def _daemons(self) -> list[str]:
        """Supervisor names, in start order."""
        return ["munged", "slurmctld", *(f"slurmd-{n}" for n in self.node_names), "slurmrestd"]

    def _binds(self) -> list[Bind]:
        return [
            Bind(self.etc, "/etc/slurm", read_only=True),
            Bind(self.munge_etc, "/etc/munge", read_only=True),
            Bind(self.munge_run, "/run/munge"),
            Bind(self.spool_ctld, "/var/spool/slurmctld"),
            Bind(self.spool_slurmd, "/var/spool/slurmd"),
            Bind(self.log_dir, "/var/log/slurm"),
            Bind(self.tmp, SHARED_TMP),
            Bind(self.dir / "hosts", "/etc/hosts", read_only=True),
            Bind(self.dir / "passwd", "/etc/passwd", read_only=True),
            Bind(self.dir / "group", "/etc/group", read_only=True),
        ]

    def sandbox(
        self, user: tuple[int, int] | None = None, env: dict[str, str] | None = None
    ) -> Sandbox:
        """A sandbox seeing this cluster's config, munge socket and shared /tmp."""
        return Sandbox(
            self.rootfs,
            self.mountpoint,
            binds=self._binds(),
            hostname=CONTROLLER_HOST,
            user=user,
            env=env or {},
            workdir=SHARED_TMP,
        )

    def _user_ids(self, user: str) -> tuple[int, int]:
        # The generated passwd (with PLAIN_USER) once it exists, else the rootfs's.
        passwd_root = self.dir if (self.dir / "passwd").exists() else self.rootfs / "etc"
        for line in (passwd_root / "passwd").read_text().splitlines():
            parts = line.split(":")
            if parts[0] == user:
                return int(parts[2]), int(parts[3])
        raise KeyError(f"no user {user!r} in the bed's /etc/passwd")

    # -- CLI -----------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm CLI (sinfo, scontrol, sbatch, srun, ...) as `user` (default root).

        Its working directory is /tmp, shared with the nodes, so job output
        files land in `slurm/tmp` on the host.
        """
        ids_ = None if user is None or user == "root" else self._user_ids(user)
        proc = subprocess.run(
            self.sandbox(user=ids_).argv(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        if check and proc.returncode != 0:
            raise SlurmCommandError(proc.returncode, list(argv), proc.stdout, proc.stderr)
        return proc

    def token(self, user: str = "root", lifetime: int = 600) -> str:
        """A JWT for `user` minted by slurmctld itself (`scontrol token`)."""
        out = self.run(["scontrol", "token", f"username={user}", f"lifespan={lifetime}"]).stdout
        for line in out.splitlines():
            if line.startswith("SLURM_JWT="):
                return line.removeprefix("SLURM_JWT=").strip()
        raise RuntimeError(f"scontrol token printed no SLURM_JWT: {out!r}")

    # -- lifecycle -----------------------------------------------------------

    def access(self) -> SlurmAccess:
        """The recorded access of the running cluster (raises if it is not running)."""
        if not self._all_running():
            raise RuntimeError(f"the Slurm of {self.state_dir} is not running")
        return SlurmAccess.from_json(self._access_file.read_text())

    def _all_running(self) -> bool:
        return self._access_file.exists() and all(
            self.supervisor.running(name) is not None for name in self._daemons()
        )

    def start(self) -> SlurmAccess:
        """Start every daemon and wait until each is ready; a no-op if all run."""
        if self._all_running():
            return self.access()
        self.stop()  # whatever is left of a partial start or a crash
        try:
            return self._start()
        except BaseException:
            self.stop()  # a failed start leaves no daemon behind; the logs stay
            raise

    def _start(self) -> SlurmAccess:
        ports = self._prepare()
        sup = self.supervisor

        munge_ids = ids(self.rootfs, _DAEMON_USER_MUNGE)
        sup.spawn("munged", self.sandbox(user=munge_ids).argv(["munged", "-F"]))
        sup.wait_ready("munged", self._munge_works, 20, "(munge -n | unmunge)")

        sup.spawn("slurmctld", self.sandbox().argv(["slurmctld", "-D"]))
        sup.wait_ready(
            "slurmctld",
            lambda: port_open(ports["ctld"]) and self._scontrol_ping(),
            30,
            "(scontrol ping)",
        )

        for name in self.node_names:
            sup.spawn(f"slurmd-{name}", self.sandbox().argv(["slurmd", "-D", "-N", name]))
        self._wait_nodes_idle(30)

        url = f"http://127.0.0.1:{ports['restd']}"
        release = self._spawn_restd(ports["restd"])

        access = SlurmAccess(
            restd_url=url,
            rootfs=self.rootfs,
            conf_dir=self.etc,
            jwt_key=self.etc / "jwt_hs256.key",
            nodes=list(self.node_names),
            cluster_name=CLUSTER_NAME,
            slurm_version=release,
            slurmctld_port=ports["ctld"],
            controller_address=self.controller_address,
            munge_socket_dir=self.munge_run,
            munge_key=self.munge_etc / "munge.key",
        )
        self._access_file.write_text(access.to_json())
        return access

    def _spawn_restd(self, port: int) -> str:
        """Start slurmrestd on `port`, wait until it answers; the Slurm release."""
        rest_env = {"SLURM_JWT": "daemon"}  # accept tokens; never give this to CLIs
        self.supervisor.spawn(
            "slurmrestd",
            self.sandbox(user=ids(self.rootfs, _DAEMON_USER_REST), env=rest_env).argv(
                [
                    "slurmrestd",
                    "-a",
                    "rest_auth/jwt",
                    "-s",
                    "openapi/slurmctld",  # without slurmdbd the other plugins make it exit
                    f"127.0.0.1:{port}",
                ]
            ),
        )
        url = f"http://127.0.0.1:{port}"
        token = self.token("root", 300)
        release: list[str] = []

        def restd_ready() -> bool:
            reply = httpx2.get(
                f"{url}/slurm/{REST_API}/ping/",
                headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token},
                timeout=2,
            )
            if reply.status_code != 200:
                return False
            release.append(reply.json()["meta"]["slurm"]["release"])
            return True

        self.supervisor.wait_ready("slurmrestd", restd_ready, 20, f"(GET /slurm/{REST_API}/ping/)")
        return release[-1]

    def stop_restd(self) -> None:
        """Stop slurmrestd alone (e.g. to test clients riding out its restart)."""
        self.supervisor.stop("slurmrestd")

    def start_restd(self) -> None:
        """Start slurmrestd again on its recorded port; a no-op if it runs."""
        if self.supervisor.running("slurmrestd") is not None:
            return
        recorded = SlurmAccess.from_json(self._access_file.read_text())
        port = int(recorded.restd_url.rsplit(":", 1)[1])
        self._spawn_restd(port)

    def stop(self) -> None:
        """Stop what start() started, then kill whatever still runs in its sandboxes.

        Idempotent. slurmstepd and job tasks outlive slurmd by design (a slurmd
        restart must not kill jobs) and leave slurmd's process group, so after
        the daemons are gone every process whose root is this cluster's
        sandbox mount point is killed too: that catches stray steps and CLIs.
        """
        self._access_file.unlink(missing_ok=True)
        known = set(self.supervisor.names())
        ours = [name for name in self._daemons() if name in known]
        # slurmd can take ~2 s to exit: signal them all first so they exit in parallel.
        for name in ours:
            if name.startswith("slurmd-") and (proc := self.supervisor.running(name)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for name in reversed(ours):
            self.supervisor.stop(name, grace=10)
        self._kill_sandboxed()

    def sandboxed_pids(self) -> list[int]:
        """Processes whose root is the sandbox's mount point."""
        pids = []
        root = str(self.mountpoint)
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "root") == root:
                        pids.append(int(entry.name))
        return pids

    def _kill_sandboxed(self) -> None:
        deadline = time.monotonic() + 10
        while (pids := self.sandboxed_pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        if pids:
            raise RuntimeError(f"processes in {self.mountpoint} survive SIGKILL: {pids}")

    # -- preparation ---------------------------------------------------------

    def _prepare(self) -> dict[str, int]:
        """Create the state layout, keys (kept across restarts) and a fresh slurm.conf."""
        slurm_uid, slurm_gid = ids(self.rootfs, _DAEMON_USER_SLURM)
        munge_uid, munge_gid = ids(self.rootfs, _DAEMON_USER_MUNGE)
        for path in (self.etc, self.munge_etc, self.munge_run, self.log_dir, self.tmp):
            path.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        Path(f"{self.mountpoint}.layer").mkdir(exist_ok=True)
        self.etc.chmod(0o755)
        self.tmp.chmod(0o1777)
        self.log_dir.chmod(0o755)
        os.chown(self.log_dir, slurm_uid, slurm_gid)  # slurmctld writes its log as slurm

        # munged refuses keys or directories that others can read or write.
        self.munge_etc.chmod(0o700)
        os.chown(self.munge_etc, munge_uid, munge_gid)
        self.munge_run.chmod(0o755)
        os.chown(self.munge_run, munge_uid, munge_gid)
        for stale in self.munge_run.iterdir():
            stale.unlink()
        _write_key(self.munge_etc / "munge.key", 1024, munge_uid, munge_gid)
        _write_key(self.etc / "jwt_hs256.key", 32, slurm_uid, slurm_gid)

        # A fresh controller state on every start: no jobs or dynamic nodes
        # from an earlier run, whose slurmd are gone anyway.
        shutil.rmtree(self.spool_ctld, ignore_errors=True)
        self.spool_ctld.mkdir(parents=True)
        os.chown(self.spool_ctld, slurm_uid, slurm_gid)
        shutil.rmtree(self.spool_slurmd, ignore_errors=True)
        self.spool_slurmd.mkdir(parents=True)
        for name in self.node_names:
            (self.spool_slurmd / name).mkdir(parents=True)

        self._write_etc_files()
        ports = {"ctld": free_port(), "restd": free_port()}
        node_ports = {name: free_port() for name in self.node_names}
        (self.etc / "slurm.conf").write_text(self._slurm_conf(ports["ctld"], node_ports))
        (self.etc / "slurm.conf").chmod(0o644)
        for name, text in self.etc_files.items():
            (self.etc / name).write_text(text)
            (self.etc / name).chmod(0o644)
        # slurmd initialises the cgroup plugin even with proctrack/linuxproc and
        # task/none; the sandboxes have no cgroup filesystem, so turn it off.
        (self.etc / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        (self.etc / "cgroup.conf").chmod(0o644)
        return ports

    def _write_etc_files(self) -> None:
        names = " ".join([CONTROLLER_HOST, *self.node_names])
        (self.dir / "hosts").write_text(f"127.0.0.1 localhost {names}\n::1 localhost\n")
        passwd = (self.rootfs / "etc/passwd").read_text().rstrip("\n").splitlines()
        group = (self.rootfs / "etc/group").read_text().rstrip("\n").splitlines()
        passwd.append(f"{PLAIN_USER}:x:{PLAIN_UID}:{PLAIN_UID}::/tmp:/bin/sh")
        group.append(f"{PLAIN_USER}:x:{PLAIN_UID}:")
        (self.dir / "passwd").write_text("\n".join(passwd) + "\n")
        (self.dir / "group").write_text("\n".join(group) + "\n")
        for name in ("hosts", "passwd", "group"):
            (self.dir / name).chmod(0o644)

    def _slurm_conf(self, ctld_port: int, node_ports: dict[str, int]) -> str:
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            # The name every sandbox has; the address is what nodes elsewhere
            # (network namespaces) use to reach the controller.
            f"SlurmctldHost={CONTROLLER_HOST}({self.controller_address})",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=slurm",  # slurmctld starts as root and drops to it
            "AuthType=auth/munge",
            "AuthAltTypes=auth/jwt",
            "AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key",
            "StateSaveLocation=/var/spool/slurmctld",
            "SlurmdSpoolDir=/var/spool/slurmd/%n",
            *(f"{key}={value}" for key, value in SANDBOX_SETTINGS.items()),
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            # Room for dynamic nodes (slurmd -Z) that a node runtime adds later.
            f"MaxNodeCount={self.max_node_count}",
            # Short timeouts: tests should see failures in seconds, not minutes.
            "SlurmctldTimeout=10",
            "SlurmdTimeout=30",
            "MessageTimeout=5",
            "KillWait=2",
            "MinJobAge=30",
            "InactiveLimit=0",
            # Batch jobs start on the next 1 s scheduling tick, not after 3 s.
            "SchedulerParameters=sched_min_interval=0,batch_sched_delay=0",
        ]
        for name in self.node_names:
            more = f" {self.node_conf[name]}" if name in self.node_conf else ""
            lines.append(
                f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={CONTROLLER_HOST} "
                f"Port={node_ports[name]} CPUs=2{more} State=UNKNOWN"
            )
        lines.append(f"NodeSet=dynamic Feature={DYNAMIC_FEATURE}")
        members = ",".join([*self.node_names, "dynamic"])
        lines.append(
            f"PartitionName={PARTITION} Nodes={members} Default=YES MaxTime=INFINITE State=UP"
        )
        lines += self.extra_conf
        return "\n".join(lines) + "\n"

    # -- readiness -----------------------------------------------------------

    def _munge_works(self) -> bool:
        if not (self.munge_run / "munge.socket.2").exists():
            return False
        proc = self.run(["sh", "-c", "munge -n | unmunge"], check=False, timeout=10)
        return proc.returncode == 0

    def _scontrol_ping(self) -> bool:
        proc = self.run(["scontrol", "ping"], check=False, timeout=10)
        return proc.returncode == 0 and "UP" in proc.stdout

    def _wait_nodes_idle(self, timeout: float) -> None:
        # Like Supervisor.wait_ready, but over all slurmd at once: they
        # register in parallel, and any one of them dying fails the start.
        deadline = time.monotonic() + timeout
        while not self._nodes_idle():
            for name in self.node_names:
                if self.supervisor.running(f"slurmd-{name}") is None:
                    log = self.supervisor.log_dir / f"slurmd-{name}.log"
                    raise StartError(f"slurmd-{name} exited before it was ready:\n{tail(log)}")
            if time.monotonic() > deadline:
                out = self.run(["sinfo", "-N"], check=False).stdout
                raise StartError(f"nodes not idle after {timeout:.0f}s:\n{out}")
            time.sleep(0.05)

    def _nodes_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(name) == "idle" for name in self.node_names)


def _write_key(path: Path, size: int, uid: int, gid: int) -> None:
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(size))
    path.chmod(0o600)
    os.chown(path, uid, gid)
