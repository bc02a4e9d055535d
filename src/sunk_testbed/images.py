"""sunk's container images, built on this machine and served by a local registry.

The images under `images/` are ordinary Dockerfiles (`FROM debian:<suite>-slim`).
Here they are built without Docker: `testbed/images/base.sh` debootstraps a
minbase of the suite and slims it like Debian's official -slim image; that
tarball is imported into buildah's storage as `docker.io/library/debian:<suite>-slim`,
so `buildah bud --pull=never` resolves the unchanged `FROM` line to it. Slurm's
images are built once per supported release, each from the Debian suite that
ships it (`SLURM_SUITES`); sunk's own image is trixie's. Two
more images are single static binaries: the pod sandbox's `pause` (Go, from
`testbed/images/pause`) and `coredns` (a binary the node build makes).

Every tag is a hash of what went into the image, so an unchanged input is a
cache hit that costs a few file reads, and a change is a new tag. Images are
pushed into a registry storage directory in the cache by a temporary
`docker-registry`; a bed serves that directory with `Registry`, read-only,
and its nodes pull `registry.sunk.test/sunk/NAME:TAG` from it.

Everything lives under `cache_dir()/"images"` (buildah's storage, the base
tarball, temporary files) and `cache_dir()/"registry"` (what nodes pull).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sunk_testbed.control_plane import ensure_built, file_lock
from sunk_testbed.paths import REPO_ROOT, SCRIPTS, cache_dir
from sunk_testbed.procs import Supervisor, free_port, tail

# The name under which nodes reach the registry (each node's containerd maps
# it to the bed's 127.0.0.1:PORT), so image refs do not carry a port.
REGISTRY_HOST = "registry.sunk.test"

# The base of sunk's own image.
SUITE = "trixie"
# Each supported Slurm release, and the Debian suite whose packages it is.
SLURM_SUITES = {"26.05": "forky", "24.11": "trixie"}
DEFAULT_SLURM = "26.05"
# buildah keeps images built here under this prefix; the registry drops it.
LOCAL_PREFIX = "localhost/"
GO = Path("/usr/local/go/bin/go")

# Bumped whenever how images are built changes (flags, base slimming), so every
# machine gets new tags instead of reusing images built the old way.
BUILD_REVISION = 1

# Process isolation for RUN steps: "oci" (runc, own namespaces, as Docker does)
# works here as root; "chroot" would too but shares the host's /dev.
ISOLATION = "oci"

Log = Callable[[str], None]
_log = logging.getLogger(__name__)


def images_dir() -> Path:
    return cache_dir() / "images"


def registry_storage() -> Path:
    """The registry's storage: what every bed's registry serves."""
    return cache_dir() / "registry"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Image:
    """One image as pushed to the registry storage."""

    repository: str  # "sunk/slurm"
    tag: str  # hash of the inputs
    digest: str  # "sha256:…" of the manifest

    @property
    def ref(self) -> str:
        """How nodes name it: `registry.sunk.test/sunk/slurm:TAG`."""
        return self.ref_at(REGISTRY_HOST)

    def ref_at(self, address: str) -> str:
        """The same image at another registry address, e.g. `127.0.0.1:PORT`."""
        return f"{address}/{self.repository}:{self.tag}"


def slurm_image_field(kind: str, release: str) -> str:
    """The ImageSet field of a Slurm image (`kind` slurm or login): the bare
    kind for the default release, `<kind>_24_11` for another."""
    return kind if release == DEFAULT_SLURM else f"{kind}_{release.replace('.', '_')}"


@dataclass(frozen=True)
class ImageSet:
    """What a bed's nodes pull. `slurm` and `login` are of the default Slurm
    release (`DEFAULT_SLURM`); `slurm_24_11`/`login_24_11` of the older one."""

    slurm: Image
    login: Image
    sunk: Image
    pause: Image
    slurm_24_11: Image
    login_24_11: Image
    # Debian's Prometheus, which the monitoring tests run in the cluster.
    prometheus: Image
    # BusyBox with a marker os-release: what the container-job tests run in.
    container_test: Image
    # BusyBox whose /etc/passwd is a script, and a link to /proc/1/root: the
    # container cache's attack tests.
    container_poisoned: Image
    # Debian's OpenLDAP slapd: the slurm chart's in-chart directory (docs/identity.md).
    ldap: Image
    coredns: Image | None = None
    # The JobSet and LeaderWorkerSet controllers' managers (sunk_testbed.workloads):
    # only in a set asked for with `workloads=`.
    jobset: Image | None = None
    lws: Image | None = None

    def slurm_pair(self, release: str = DEFAULT_SLURM) -> tuple[Image, Image]:
        """(daemons, login) images of one Slurm release."""
        if release not in SLURM_SUITES:
            raise ValueError(f"no images of Slurm {release}; there are {sorted(SLURM_SUITES)}")
        daemons: Image = getattr(self, slurm_image_field("slurm", release))
        login: Image = getattr(self, slurm_image_field("login", release))
        return daemons, login

    def all(self) -> list[Image]:
        images = [getattr(self, f.name) for f in fields(self)]
        return [image for image in images if image is not None]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class _Spec:
    """What one image is made of: its inputs (hashed into the tag) and how to build it."""

    key: str  # field of ImageSet
    repository: str
    kind: str  # "dockerfile" (buildah bud), "pause" (built from Go), "binary" (inputs[0])
    inputs: tuple[Path, ...]  # repo-relative paths, or the absolute path of a binary
    dockerfile: Path | None = None
    entrypoint: str = ""
    user: str = ""
    suite: str = SUITE  # the Debian base of a Dockerfile's image

    def tag(self, base_shas: dict[str, str]) -> str:
        digest = hashlib.sha256(f"r{BUILD_REVISION} {ISOLATION} {self.kind}\n".encode())
        digest.update(f"entrypoint {self.entrypoint} user {self.user}\n".encode())
        if self.dockerfile is not None:
            digest.update(f"suite {self.suite} base {base_shas[self.suite]}\n".encode())
            _hash_file(digest, REPO_ROOT, REPO_ROOT / self.dockerfile)
        for path in self.inputs:
            root = path.parent if path.is_absolute() else REPO_ROOT
            for file in _tree_files(root / path):
                _hash_file(digest, root, file)
        return digest.hexdigest()[:16]


def _hash_file(digest: hashlib._Hash, root: Path, path: Path) -> None:
    # Name and executable bit count too: both change what the image contains.
    executable = os.access(path, os.X_OK)
    digest.update(f"{path.relative_to(root)} {int(executable)} {path.stat().st_size}\n".encode())
    digest.update(path.read_bytes())


def _tree_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"image input {path} is missing")
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def _specs(coredns: Path | None, workloads: Path | None) -> list[_Spec]:
    # images/slurm/containers: the container-jobs SPANK plugin both images load.
    plugin = Path("images/slurm/containers")
    slurm_kinds = (
        ("slurm", "sunk/slurm", (Path("testbed/slurm/install-slurm.sh"), plugin)),
        ("login", "sunk/slurm-login", (Path("testbed/slurm/install-login.sh"), plugin)),
    )
    specs = []
    for release, suite in SLURM_SUITES.items():
        for kind, repository, inputs in slurm_kinds:
            specs.append(
                _Spec(
                    slurm_image_field(kind, release),
                    repository,
                    "dockerfile",
                    inputs,
                    Path(f"images/{kind}/Dockerfile"),
                    suite=suite,
                )
            )
    specs += [
        _Spec(
            "sunk",
            "sunk/sunk",
            "dockerfile",
            (Path("pyproject.toml"), Path("README.md"), Path("src/sunk")),
            Path("images/sunk/Dockerfile"),
        ),
        _Spec(
            "prometheus",
            "sunk/prometheus",
            "dockerfile",
            (),
            Path("images/prometheus/Dockerfile"),
        ),
        _Spec("ldap", "sunk/ldap", "dockerfile", (), Path("images/ldap/Dockerfile")),
        _Spec(
            "container_test",
            "sunk/container-test",
            "dockerfile",
            (Path("testbed/images/container-test"),),
            Path("testbed/images/container-test/Dockerfile"),
        ),
        _Spec(
            "container_poisoned",
            "sunk/container-poisoned",
            "dockerfile",
            (Path("testbed/images/container-poisoned"),),
            Path("testbed/images/container-poisoned/Dockerfile"),
        ),
        # Kubernetes' own pause image runs as this user too.
        _Spec(
            "pause",
            "sunk/pause",
            "pause",
            (Path("testbed/images/pause"),),
            entrypoint="/pause",
            user="65535:65535",
        ),
    ]
    if coredns is not None:
        # Root, so it can bind port 53 without file capabilities.
        binary = coredns.resolve()
        specs.append(_Spec("coredns", "sunk/coredns", "binary", (binary,), entrypoint="/coredns"))
    if workloads is not None:
        # As the projects' own images (distroless static:nonroot): `/manager`,
        # user 65532, which their charts' runAsNonRoot requires to be numeric.
        for name in ("jobset", "lws"):
            binary = (workloads / name).resolve()
            specs.append(
                _Spec(
                    name,
                    f"sunk/{name}",
                    "binary",
                    (binary,),
                    entrypoint="/manager",
                    user="65532:65532",
                )
            )
    return specs


# --------------------------------------------------------------------------- buildah


class _Buildah:
    """buildah with its storage in the cache, never the machine's default."""

    def __init__(self, log_file: Path) -> None:
        self.dir = images_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_file = log_file
        self.root = self.dir / "storage"
        driver_file = self.dir / "storage-driver"
        self.driver = driver_file.read_text().strip() if driver_file.exists() else ""
        # Transient state (mounts, locks) belongs in /run, which a reboot clears.
        key = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        self.runroot = Path("/run/sunk/buildah") / key
        # Large temporary files (layers being committed or pushed) stay in the cache too.
        self.tmp = self.dir / "tmp"
        if not self.driver:
            self.driver = self._probe_driver()
            driver_file.write_text(self.driver + "\n")

    def argv(self, *args: str, driver: str = "") -> list[str]:
        return [
            "buildah",
            "--root",
            str(self.root),
            "--runroot",
            str(self.runroot),
            "--storage-driver",
            driver or self.driver,
            *args,
        ]

    def run(self, *args: str, driver: str = "") -> str:
        """Run buildah; its stdout is returned for short commands (from, inspect)
        and goes to the log for long ones (bud, push), which print progress."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        long_running = args[0] in ("bud", "push", "add")
        with self.log_file.open("ab") as sink:
            sink.write(f"$ buildah {' '.join(args)}\n".encode())
            sink.flush()
            result = subprocess.run(
                self.argv(*args, driver=driver),
                stdin=subprocess.DEVNULL,
                stdout=sink if long_running else subprocess.PIPE,
                stderr=sink,
                env=env,
                check=False,
            )
        if result.returncode != 0:
            raise RuntimeError(
                f"buildah {args[0]} failed (see {self.log_file}):\n{tail(self.log_file)}"
            )
        return result.stdout.decode().strip() if result.stdout else ""

    def _probe_driver(self) -> str:
        """overlay if this kernel mounts it for buildah, else vfs (slower, more disk)."""
        try:
            container = self.run("from", "scratch", driver="overlay")
            try:
                self.run("mount", container, driver="overlay")
            finally:
                self.run("rm", container, driver="overlay")
            return "overlay"
        except RuntimeError:
            _log.warning("overlay storage failed here; using vfs (see %s)", self.log_file)
            shutil.rmtree(self.root, ignore_errors=True)
            return "vfs"

    def image_config(self, name: str) -> dict[str, Any] | None:
        """A stored image's OCI config (Cmd, Labels, …), or None when it is not there."""
        try:
            out = self.run("inspect", "--type", "image", name)
        except RuntimeError:
            return None
        config: dict[str, Any] = json.loads(out)["OCIv1"].get("config") or {}
        return config


_BASE_LABEL = "test.sunk.rootfs-sha256"


def base_name(suite: str) -> str:
    return f"docker.io/library/debian:{suite}-slim"


def _base_dir(suite: str) -> Path:
    """Keyed by what makes the base: the script and the mirror."""
    mirror = os.environ.get("SUNK_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    script = (SCRIPTS / "images" / "base.sh").read_bytes()
    key = hashlib.sha256(script + mirror.encode()).hexdigest()[:12]
    return images_dir() / f"base-{suite}-{key}"


def _ensure_base_rootfs(suite: str, log: Log) -> tuple[Path, str]:
    """The suite's slim root filesystem tarball and its sha256 (built once per key)."""
    out = _base_dir(suite)
    script = [str(SCRIPTS / "images" / "base.sh"), str(out), suite]
    ensure_built(out, script, f"the {suite} base image (debootstrap)", log)
    return out / "rootfs.tar", (out / "rootfs.sha256").read_text().strip()


def _import_base(buildah: _Buildah, suite: str, tarball: Path, sha: str, log: Log) -> None:
    """Store the tarball as debian:<suite>-slim unless that exact one is stored."""
    name = base_name(suite)
    config = buildah.image_config(name) or {}
    if (config.get("Labels") or {}).get(_BASE_LABEL) == sha:
        return
    log(f"importing the base as {name}")
    container = buildah.run("from", "scratch")
    try:
        buildah.run("add", container, str(tarball), "/")
        buildah.run("config", "--cmd", "bash", "--label", f"{_BASE_LABEL}={sha}", container)
        buildah.run("commit", "--quiet", container, name)
    finally:
        buildah.run("rm", container)


def _build_dockerfile(buildah: _Buildah, spec: _Spec, name: str) -> None:
    assert spec.dockerfile is not None
    # The context holds exactly the hashed inputs, so the tag says what is in it.
    with tempfile.TemporaryDirectory(dir=buildah.tmp, prefix="context-") as context:
        for path in spec.inputs:
            # A binary from the cache (an absolute path) lies at the context's top.
            root = path.parent if path.is_absolute() else REPO_ROOT
            for file in _tree_files(root / path):
                target = Path(context) / file.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
        buildah.run(
            "bud",
            *_host_trust_for_pip(),
            *_apt_accepts_an_old_mirror(),
            "--pull=never",
            "--layers",  # slurm and login share the SPANK stage; sunk's deps survive src changes
            "--network",
            "host",
            "--isolation",
            ISOLATION,
            "--build-arg",
            f"DEBIAN_SUITE={spec.suite}",
            "--file",
            str(REPO_ROOT / spec.dockerfile),
            "--tag",
            name,
            context,
        )


def _apt_accepts_an_old_mirror() -> list[str]:
    """apt inside RUN steps takes Release files past their Valid-Until.

    testing's and unstable's (forky's, for Slurm 26.05) are valid a week; a
    mirror snapshot older than that is refused ("Release file ... is
    expired"). Mounted for the build only, like pip's trust: the image keeps
    an empty file at the mount point and no such setting.
    """
    config = images_dir() / "apt-no-valid-until.conf"
    config.write_text('Acquire::Check-Valid-Until "false";\n')
    return ["--volume", f"{config}:/etc/apt/apt.conf.d/99sunk-build-no-valid-until:ro"]


def _host_trust_for_pip() -> list[str]:
    """pip inside RUN steps trusts what this machine trusts (its network may
    reach PyPI only through a TLS proxy whose CA is in the host's bundle).
    A bind mount of pip's system-wide config: the image keeps only the empty
    mount point /etc/xdg/pip, and Dockerfiles need no build argument for it."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.exists():
        return []
    config = images_dir() / "pip"
    config.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundle, config / "host-ca.crt")
    (config / "pip.conf").write_text("[global]\ncert = /etc/xdg/pip/host-ca.crt\n")
    return ["--volume", f"{config}:/etc/xdg/pip:ro"]


def _build_binary_image(buildah: _Buildah, spec: _Spec, binary: Path, name: str) -> None:
    """A scratch image of one static binary, its entrypoint."""
    container = buildah.run("from", "scratch")
    try:
        buildah.run("copy", "--chmod", "0755", container, str(binary), spec.entrypoint)
        config = ["config", "--entrypoint", json.dumps([spec.entrypoint]), "--cmd", ""]
        if spec.user:
            config += ["--user", spec.user]
        buildah.run(*config, container)
        buildah.run("commit", "--quiet", container, name)
    finally:
        buildah.run("rm", container)


def build_pause(out_dir: Path) -> Path:
    """The pause binary, statically linked (CGO off), built from testbed/images/pause."""
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "pause"
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    result = subprocess.run(
        [str(GO), "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), "."],
        cwd=SCRIPTS / "images" / "pause",
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"building pause failed:\n{result.stdout}{result.stderr}")
    return binary


# --------------------------------------------------------------------------- registry


def _registry_config(
    storage: Path, host: str, port: int, *, writable: bool, htpasswd: Path | None = None
) -> str:
    # A registry has no other state than its storage; several (a bed's and a
    # build's) may share one directory. Read-only ones can never change it.
    # With `htpasswd`, every request needs one of its logins (HTTP Basic).
    auth = (
        f"auth:\n  htpasswd:\n    realm: sunk\n    path: {json.dumps(str(htpasswd))}\n"
        if htpasswd is not None
        else ""
    )
    return f"""version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {json.dumps(str(storage))}
  delete:
    enabled: false
  maintenance:
    uploadpurging:
      enabled: false
    readonly:
      enabled: {json.dumps(not writable)}
{auth}http:
  addr: {host}:{port}
  secret: {secrets.token_hex(16)}
"""


def bcrypt_hash(password: str) -> str:
    """`password` as htpasswd's bcrypt (the one scheme docker-registry takes),
    from the system's libcrypt (libxcrypt): no bcrypt module is installed and
    Python's `crypt` module is gone in 3.13."""
    libcrypt = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    libcrypt.crypt_gensalt.restype = ctypes.c_char_p
    libcrypt.crypt_gensalt.argtypes = [
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
        ctypes.c_int,
    ]
    libcrypt.crypt.restype = ctypes.c_char_p
    libcrypt.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    # Cost 5 (the minimum is 4): each request is checked, and these are test logins.
    salt = libcrypt.crypt_gensalt(b"$2y$", 5, None, 0)  # NULL: libcrypt's own random bytes
    hashed = libcrypt.crypt(password.encode(), salt) if salt else None
    if not hashed or not hashed.startswith(b"$2y$"):
        raise RuntimeError("the system's libcrypt makes no bcrypt hashes")
    return str(hashed.decode())


class Registry:
    """Debian's `docker-registry` on <host>:<free port>, serving the image cache.

    The host is 127.0.0.1 for the build; a bed's nodes reach it at the host's
    end of their room's link (`sunk_testbed.nodes`).

    Its config lives in `<state_dir>/<name>/`; the process is one of the bed's
    daemons (`Supervisor`), so `stop_all` and a later session stop it too.

    With `login`, it answers only requests with its one login (`login()`: a
    user and a password made on the first start and kept in that directory),
    as a private registry does.
    """

    def __init__(
        self,
        state_dir: Path,
        supervisor: Supervisor,
        *,
        storage: Path | None = None,
        writable: bool = False,
        name: str = "registry",
        login: bool = False,
    ) -> None:
        self.name = name
        self.dir = state_dir / name
        self.supervisor = supervisor
        self.storage = storage if storage is not None else registry_storage()
        self.writable = writable
        self.needs_login = login
        self._record = self.dir / "registry.json"
        self._login = self.dir / "login.json"

    def login(self) -> tuple[str, str]:
        """The user and password it takes (made once: a restart keeps them)."""
        if not self._login.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            partial = self._login.with_suffix(f".{os.getpid()}.tmp")
            partial.touch(mode=0o600)
            partial.write_text(json.dumps({"user": "puller", "password": secrets.token_hex(16)}))
            partial.replace(self._login)
        record = json.loads(self._login.read_text())
        return str(record["user"]), str(record["password"])

    def _recorded(self) -> tuple[str, int]:
        if self.supervisor.running(self.name) is None:
            raise RuntimeError(f"{self.name} is not running")
        record = json.loads(self._record.read_text())
        return record.get("host", "127.0.0.1"), int(record["port"])

    @property
    def address(self) -> str:
        """`HOST:PORT` of the running registry."""
        host, port = self._recorded()
        return f"{host}:{port}"

    def start(self, timeout: float = 30.0, host: str = "127.0.0.1") -> str:
        """Start it (or find it running) and return its address once it answers."""
        if self.supervisor.running(self.name) is not None and self._record.exists():
            if self._recorded()[0] == host:
                return self.address
            self.stop()
        self.storage.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        htpasswd = None
        if self.needs_login:
            user, password = self.login()
            htpasswd = self.dir / "htpasswd"
            htpasswd.write_text(f"{user}:{bcrypt_hash(password)}\n")
        config = self.dir / "config.yml"
        config.touch(mode=0o600)  # it holds the HTTP secret
        config.write_text(
            _registry_config(self.storage, host, port, writable=self.writable, htpasswd=htpasswd)
        )
        self._record.write_text(json.dumps({"host": host, "port": port}))
        self.supervisor.spawn(self.name, ["docker-registry", "serve", str(config)])
        self.supervisor.wait_ready(
            self.name, lambda: _answers(host, port), timeout=timeout, what=f"on {host}:{port}"
        )
        return f"{host}:{port}"

    def stop(self) -> None:
        self.supervisor.stop(self.name)


def _answers(host: str, port: int) -> bool:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with direct.open(f"http://{host}:{port}/v2/", timeout=1) as reply:
            return bool(reply.status == 200)
    except urllib.error.HTTPError as error:
        return error.code == 401  # answering, and asking for its login


# --------------------------------------------------------------------------- build + push


def _pushed_digest(repository: str, tag: str) -> str | None:
    """The manifest digest the registry storage holds for repository:tag, if any."""
    link = (
        registry_storage()
        / "docker/registry/v2/repositories"
        / repository
        / "_manifests/tags"
        / tag
        / "current/link"
    )
    try:
        return link.read_text().strip() or None
    except OSError:
        return None


def ensure_images(
    log: Log, *, coredns: Path | None = None, workloads: Path | None = None
) -> ImageSet:
    """Build and push every image whose inputs changed; seconds when none did.

    `coredns` is a static CoreDNS binary to package as `sunk/coredns` (the
    node build makes it); without it the set has no coredns image.
    `workloads` is the directory of the JobSet and LWS managers
    (`sunk_testbed.workloads`), packaged as `sunk/jobset` and `sunk/lws`;
    without it the set has neither. One build at a time per cache: a second
    caller waits, then finds the images pushed.
    """
    specs = _specs(coredns, workloads)
    bases = {s.suite: _ensure_base_rootfs(s.suite, log) for s in specs if s.dockerfile}
    base_shas = {suite: sha for suite, (_, sha) in bases.items()}
    planned = [(spec, spec.tag(base_shas)) for spec in specs]
    if any(_pushed_digest(spec.repository, tag) is None for spec, tag in planned):
        with file_lock(images_dir() / "build.lock"):
            missing = [(s, t) for s, t in planned if _pushed_digest(s.repository, t) is None]
            if missing:
                _build_and_push(missing, bases, log)
    found: dict[str, Image] = {}
    for spec, tag in planned:
        digest = _pushed_digest(spec.repository, tag)
        if digest is None:
            raise RuntimeError(f"{spec.repository}:{tag} is not in {registry_storage()}")
        found[spec.key] = Image(spec.repository, tag, digest)
    images = ImageSet(**found)
    record = images_dir() / "images.json"
    partial = record.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(images.to_json())
    partial.replace(record)
    return images


# What images beyond the set a bed's nodes pull are made of (`sunk_testbed.storage`'s).
ImageSpec = _Spec


def ensure_extra_images(specs: Sequence[ImageSpec], log: Log) -> dict[str, Image]:
    """Build and push images only some beds need, by their `key`: what
    `ensure_images` does for its set, with the same cache, lock and registry."""
    bases = {s.suite: _ensure_base_rootfs(s.suite, log) for s in specs if s.dockerfile}
    tags = {spec.key: spec.tag({suite: sha for suite, (_, sha) in bases.items()}) for spec in specs}

    def missing() -> list[tuple[ImageSpec, str]]:
        return [(s, tags[s.key]) for s in specs if not _pushed_digest(s.repository, tags[s.key])]

    if missing():  # the lock only when there is something to build
        with file_lock(images_dir() / "build.lock"):
            if todo := missing():
                _build_and_push(todo, bases, log)
    built = {}
    for spec in specs:
        if not (digest := _pushed_digest(spec.repository, tags[spec.key])):
            raise RuntimeError(f"{spec.repository}:{tags[spec.key]} was not pushed")
        built[spec.key] = Image(spec.repository, tags[spec.key], digest)
    return built


def _build_and_push(
    missing: Sequence[tuple[_Spec, str]], bases: dict[str, tuple[Path, str]], log: Log
) -> None:
    log_file = images_dir() / "build.log"
    buildah = _Buildah(log_file)
    for suite in sorted({spec.suite for spec, _ in missing if spec.kind == "dockerfile"}):
        _import_base(buildah, suite, *bases[suite], log)
    for spec, tag in missing:
        name = f"{LOCAL_PREFIX}{spec.repository}:{tag}"
        if buildah.image_config(name) is not None:  # built before, its push did not finish
            continue
        log(f"building {spec.repository}:{tag} (log: {log_file})")
        started = time.monotonic()
        if spec.kind == "dockerfile":
            _build_dockerfile(buildah, spec, name)
        elif spec.kind == "pause":
            with tempfile.TemporaryDirectory(dir=buildah.tmp, prefix="pause-") as out:
                _build_binary_image(buildah, spec, build_pause(Path(out)), name)
        else:
            _build_binary_image(buildah, spec, spec.inputs[0], name)
        log(f"built {spec.repository}:{tag} in {time.monotonic() - started:.0f} s")
    with _temporary_registry(buildah.tmp) as address:
        for spec, tag in missing:
            log(f"pushing {spec.repository}:{tag}")
            buildah.run(
                "push",
                "--quiet",
                "--tls-verify=false",
                f"{LOCAL_PREFIX}{spec.repository}:{tag}",
                f"docker://{address}/{spec.repository}:{tag}",
            )


@contextlib.contextmanager
def _temporary_registry(tmp: Path) -> Iterator[str]:
    """A writable registry on the cache's storage for as long as a push takes."""
    tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp, prefix="push-") as state:
        registry = Registry(Path(state), Supervisor(Path(state)), writable=True)
        try:
            yield registry.start()
        finally:
            registry.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sunk_testbed.images",
        description="Build sunk's images with buildah and push them to the cache's registry.",
    )
    parser.add_argument("--coredns", type=Path, help="a static CoreDNS binary to package too")
    parser.add_argument(
        "--workloads", type=Path, help="the directory of the JobSet and LWS managers to package"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    images = ensure_images(
        lambda message: print(f"[images] {message}", file=sys.stderr, flush=True),
        coredns=args.coredns,
        workloads=args.workloads,
    )
    for image in images.all():
        print(image.ref, image.digest)
    print(f"[images] done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
