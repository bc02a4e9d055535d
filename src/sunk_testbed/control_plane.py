"""The Kubernetes half of the test bed: a real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler on loopback, with their own PKI.

The binaries are built once from the official Go modules (testbed/kube/build.sh)
into the cache; everything else (certificates, kubeconfigs, etcd data, logs)
lives in the bed's state directory under `kube/`, so several beds can run at
once on ports picked at start and recorded in `kube/kube.json`.

Security shortcuts, acceptable only because everything listens on 127.0.0.1 of
a test machine: etcd speaks plain HTTP without client authentication (anyone
on the machine who finds its port can bypass the apiserver's authorisation),
and etcd runs with `--unsafe-no-fsync` (a machine crash may lose the bed's data;
a daemon crash does not).

The sunk components get identities only (`KubeAccess.kubeconfigs`): their
least-privilege RBAC is applied by whoever installs the component, exactly as
on a real cluster, so the tests exercise the same permissions users get.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import fcntl
import ipaddress
import json
import logging
import os
import ssl
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from lightkube import AsyncClient, KubeConfig
from lightkube.config.client_adapter import AsyncClient as _adapter_async_client
from lightkube.config.client_adapter import ConnectionParams

from sunk.kube.client import kube_client
from sunk_testbed.paths import SCRIPTS, cache_dir
from sunk_testbed.procs import Supervisor, free_port, port_open

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.6"

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CLUSTER_NAME = "sunk-testbed"

# Identities handed out to sunk's own components (user name = key, no groups).
COMPONENTS = ("sunk-operator", "sunk-syncer", "sunk-scheduler")
ADMIN = "admin"

# Kubeconfigs the bed writes itself; issue_kubeconfig must not overwrite them.
_RESERVED_KUBECONFIGS = frozenset({ADMIN, *COMPONENTS, "kube-controller-manager", "kube-scheduler"})

# How long the node lifecycle controller waits for a node's Lease renewal
# before marking it NotReady (default 50 s), and how often it checks (default
# 5 s). Shortened so that node-failure tests (a real node powered off) see
# NotReady in seconds; the bed's kubelets renew their Leases every 2 s.
NODE_MONITOR_GRACE_PERIOD = "10s"
NODE_MONITOR_PERIOD = "1s"

# Supervisor names, in start order (the Slurm half uses other names).
DAEMONS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")

_log = logging.getLogger(__name__)


# Bumped whenever testbed/kube/build.sh changes what it produces, so every
# machine rebuilds instead of reusing an older build of the same versions.
BUILD_REVISION = 2


def binaries_dir() -> Path:
    name = f"{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}-r{BUILD_REVISION}"
    return cache_dir() / "kube" / name


def ensure_binaries(log: Callable[[str], None]) -> Path:
    """Build the four binaries into the cache unless a finished build is there."""
    out = binaries_dir()
    script = [str(SCRIPTS / "kube" / "build.sh"), str(out), KUBERNETES_VERSION, ETCD_VERSION]
    return ensure_built(
        out, script, f"Kubernetes {KUBERNETES_VERSION} and etcd {ETCD_VERSION}", log
    )


def build_log(out: Path) -> Path:
    return out.parent / f"{out.name}.build.log"


def ensure_built(out: Path, script: Sequence[str], what: str, log: Callable[[str], None]) -> Path:
    """`out`, filled by `build_once` unless a finished build is there; `log`
    hears of a build (and of nothing else) before and after it."""
    if not (out / ".complete").exists():
        log(f"building {what} into {out} (log: {build_log(out)})")
        build_once(out, script, what)
        log(f"{what} built")
    return out


def build_once(out: Path, script: Sequence[str], what: str) -> None:
    """Run a build script (bash) that fills the cache directory `out` and marks it
    `.complete`, unless that is done; one build at a time per cache, a second
    caller waits for the first. Its output goes to `build_log(out)`."""
    out.mkdir(parents=True, exist_ok=True)
    log_file = build_log(out)
    with file_lock(out.parent / f"{out.name}.lock"):
        if (out / ".complete").exists():
            return
        with log_file.open("ab") as sink:
            result = subprocess.run(
                ["bash", *script],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                check=False,
            )
    if result.returncode != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"building {what} failed (see {log_file}):\n{tail}")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held by one process at a time (flock on `path`, made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- PKI


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _cert_builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, *, is_ca: bool
) -> x509.CertificateBuilder:
    """What every certificate of the bed shares: ten years, basic constraints, key usage."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(hours=1))
        .not_valid_after(_now() + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def first_service_ip(service_cidr: str = SERVICE_CIDR) -> str:
    """The ClusterIP of the `kubernetes` Service, which the serving cert must name."""
    return str(next(ipaddress.ip_network(service_cidr).hosts()))


class Pki:
    """CA, serving and client certificates and the service-account key pair.

    ECDSA P-256 keys everywhere (instant to generate, accepted by every
    component); certificates are valid for ten years because a developer's
    `sunk local` bed may live long and is never exposed beyond loopback.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca_cert = directory / "ca.crt"
        self.ca_key = directory / "ca.key"
        self.sa_key = directory / "sa.key"
        self.sa_pub = directory / "sa.pub"

    def ensure(self, service_cidr: str = SERVICE_CIDR) -> None:
        """Create whatever is missing; never replaces what exists (issued identities stay valid)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.ca_cert.exists():
            self._make_ca("ca", f"{CLUSTER_NAME}-ca")
        if not self.path("front-proxy-ca.crt").exists():
            # The aggregation layer's own CA (as kubeadm does): a cert from it
            # named front-proxy-client may assert any user in X-Remote-* headers,
            # so no client cert of the main CA can ever do that.
            self._make_ca("front-proxy-ca", f"{CLUSTER_NAME}-front-proxy-ca")
            self._issue(
                "front-proxy-client",
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "front-proxy-client")]),
                ExtendedKeyUsageOID.CLIENT_AUTH,
                ca="front-proxy-ca",
            )
        if not self.sa_key.exists():
            sa = ec.generate_private_key(ec.SECP256R1())
            _write_private(self.sa_key, _key_pem(sa))
            self.sa_pub.write_bytes(
                sa.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
        if not self.path("apiserver.crt").exists():
            self.issue_serving(
                "apiserver",
                "kube-apiserver",
                dns=[
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                ips=["127.0.0.1", first_service_ip(service_cidr)],
            )
        for name in ("kube-controller-manager", "kube-scheduler"):
            # Signed by our CA so that readiness checks can verify them too.
            if not self.path(f"{name}-serving.crt").exists():
                self.issue_serving(f"{name}-serving", name, dns=["localhost"], ips=["127.0.0.1"])
        if not self.path("apiserver-kubelet-client.crt").exists():
            # Used by the apiserver for logs and exec on kubelets.
            self.issue_client(
                "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"]
            )

    def path(self, name: str) -> Path:
        return self.dir / name

    def _make_ca(self, stem: str, common_name: str) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            _cert_builder(name, name, key.public_key(), is_ca=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        _write_private(self.path(f"{stem}.key"), _key_pem(key))
        self.path(f"{stem}.crt").write_bytes(_cert_pem(cert))

    def _ca(self, stem: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        cert = x509.load_pem_x509_certificate(self.path(f"{stem}.crt").read_bytes())
        key = serialization.load_pem_private_key(
            self.path(f"{stem}.key").read_bytes(), password=None
        )
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cert, key

    def _issue(
        self,
        file_stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: Sequence[x509.GeneralName] = (),
        ca: str = "ca",
    ) -> tuple[Path, Path]:
        ca_cert, ca_key = self._ca(ca)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _cert_builder(subject, ca_cert.subject, key.public_key(), is_ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        crt, key_file = self.path(f"{file_stem}.crt"), self.path(f"{file_stem}.key")
        _write_private(key_file, _key_pem(key))
        crt.write_bytes(_cert_pem(cert))
        return crt, key_file

    def issue_serving(
        self, file_stem: str, common_name: str, *, dns: Sequence[str], ips: Sequence[str]
    ) -> tuple[Path, Path]:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        return self._issue(file_stem, subject, ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, file_stem: str, user: str, groups: Sequence[str]) -> tuple[Path, Path]:
        """The apiserver maps CN to the user name and each O to a group."""
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(file_stem, x509.Name(attrs), ExtendedKeyUsageOID.CLIENT_AUTH)


def write_kubeconfig(
    path: Path, *, server: str, ca_file: Path, cert_file: Path, key_file: Path, user: str
) -> Path:
    """A self-contained kubeconfig (certificates embedded, so it can be copied anywhere)."""

    def data(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": data(ca_file)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(cert_file),
                    "client-key-data": data(key_file),
                },
            }
        ],
        "contexts": [{"name": user, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": user,
    }
    _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
    return path


def _set_kubeconfig_server(path: Path, server: str) -> None:
    config = yaml.safe_load(path.read_text())
    for cluster in config.get("clusters", []):
        cluster["cluster"]["server"] = server
    _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())


# ------------------------------------------------------------------ control plane


@dataclass(frozen=True)
class KubeAccess:
    """How to reach a running control plane, and as whom."""

    server: str
    ca_file: Path
    admin_kubeconfig: Path
    # sunk-operator, sunk-syncer, sunk-scheduler (identities without RBAC) and admin.
    kubeconfigs: dict[str, Path]

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "ca_file": str(self.ca_file),
            "admin_kubeconfig": str(self.admin_kubeconfig),
            "kubeconfigs": {k: str(v) for k, v in self.kubeconfigs.items()},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> KubeAccess:
        return cls(
            server=raw["server"],
            ca_file=Path(raw["ca_file"]),
            admin_kubeconfig=Path(raw["admin_kubeconfig"]),
            kubeconfigs={k: Path(v) for k, v in raw["kubeconfigs"].items()},
        )


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def allocate(cls) -> Ports:
        # free_port() may hand out the same port twice in a row; keep them distinct.
        picked: list[int] = []
        while len(picked) < 5:
            port = free_port()
            if port not in picked:
                picked.append(port)
        return cls(*picked)

    def all(self) -> list[int]:
        return [
            self.etcd_client,
            self.etcd_peer,
            self.apiserver,
            self.controller_manager,
            self.scheduler,
        ]


class KubeControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler of one bed."""

    def __init__(
        self,
        state_dir: Path,
        supervisor: Supervisor,
        *,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.dir = state_dir / "kube"
        self.supervisor = supervisor
        self.pki = Pki(self.dir / "pki")
        self._state_file = self.dir / "kube.json"
        self._kubeconfig_dir = self.dir / "kubeconfigs"
        self._log = log or _log.info

    # -- public

    def start(self, timeout: float = 60.0) -> KubeAccess:
        """Start what is not running and wait until all four daemons are ready.

        Idempotent: with everything already up this is a few health checks.
        """
        bin_dir = ensure_binaries(self._log)
        with file_lock(self.dir / ".lock"):
            state = self._prepare()
            ports = Ports(**state["ports"])
            access = KubeAccess.from_json(state["access"])
            self._start_etcd(bin_dir, ports, timeout)
            self._start_apiserver(bin_dir, ports, access, timeout)
            self._start_controller_manager(bin_dir, ports, access.server, timeout)
            self._start_scheduler(bin_dir, ports, timeout)
            return access

    def stop(self) -> None:
        """Stop the daemons, newest first; certificates and etcd data stay for a restart."""
        for name in reversed(DAEMONS):
            self.supervisor.stop(name)

    def access(self) -> KubeAccess | None:
        """The access of a running control plane, None if its apiserver is not running."""
        state = self._load()
        if state is None or self.supervisor.running("kube-apiserver") is None:
            return None
        return KubeAccess.from_json(state["access"])

    def issue_kubeconfig(self, name: str, user: str, groups: Sequence[str] = ()) -> Path:
        """Mint a client cert for `user` in `groups`; write `kubeconfigs/<name>.kubeconfig`.

        E.g. a node runtime needs ("node-1", "system:node:node-1", ["system:nodes"]).
        Needs the PKI, i.e. `start()` ran once on this state directory.
        """
        if name in _RESERVED_KUBECONFIGS:
            raise ValueError(f"kubeconfig name {name!r} belongs to the control plane itself")
        state = self._load()
        if state is None:
            raise RuntimeError(f"no control plane state in {self.dir}: start() it first")
        return self._issue_kubeconfig_at(state["access"]["server"], name, user, groups)

    # -- state

    def _load(self) -> dict[str, Any] | None:
        try:
            raw: dict[str, Any] = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return None
        return raw

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self._state_file)

    def _prepare(self) -> dict[str, Any]:
        """PKI, ports and kubeconfigs: reused when present, so identities survive a restart."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki.ensure()
        state = self._load()
        anything_running = any(self.supervisor.running(n) for n in DAEMONS)
        if state is not None:
            ports = Ports(**state["ports"])
            # After a full stop another bed may have taken a port: move to new ones.
            if anything_running or not any(port_open(p) for p in ports.all()):
                return state
            self._log(
                f"ports of the stopped control plane in {self.dir} are taken; picking new ones"
            )
        ports = Ports.allocate()
        server = f"https://127.0.0.1:{ports.apiserver}"
        if state is not None:
            for path in self._kubeconfig_dir.glob("*.kubeconfig"):
                _set_kubeconfig_server(path, server)
        else:
            self._issue_kubeconfig_at(
                server, "kube-controller-manager", "system:kube-controller-manager", ()
            )
            self._issue_kubeconfig_at(server, "kube-scheduler", "system:kube-scheduler", ())
            self._issue_kubeconfig_at(server, ADMIN, "admin", ["system:masters"])
            for component in COMPONENTS:
                self._issue_kubeconfig_at(server, component, component, ())
        access = KubeAccess(
            server=server,
            ca_file=self.pki.ca_cert,
            admin_kubeconfig=self._kubeconfig_dir / f"{ADMIN}.kubeconfig",
            kubeconfigs={n: self._kubeconfig_dir / f"{n}.kubeconfig" for n in (*COMPONENTS, ADMIN)},
        )
        state = {
            "versions": {"kubernetes": KUBERNETES_VERSION, "etcd": ETCD_VERSION},
            "ports": dataclasses.asdict(ports),
            "access": access.to_json(),
        }
        self._save(state)
        return state

    def _issue_kubeconfig_at(
        self, server: str, name: str, user: str, groups: Sequence[str]
    ) -> Path:
        cert, key = self.pki.issue_client(f"client-{name}", user, groups)
        return write_kubeconfig(
            self._kubeconfig_dir / f"{name}.kubeconfig",
            server=server,
            ca_file=self.pki.ca_cert,
            cert_file=cert,
            key_file=key,
            user=user,
        )

    # -- daemons

    def _ssl(self, client: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        if client:
            ctx.load_cert_chain(
                self.pki.path("client-admin.crt"), self.pki.path("client-admin.key")
            )
        return ctx

    @staticmethod
    def _get_ok(url: str, verify: ssl.SSLContext | bool) -> bool:
        # trust_env=False: a proxy from the environment must not see loopback traffic.
        reply = httpx2.get(url, verify=verify, timeout=2.0, trust_env=False)
        return reply.status_code == 200

    def _start_etcd(self, bin_dir: Path, ports: Ports, timeout: float) -> None:
        data = self.dir / "etcd"
        client = f"http://127.0.0.1:{ports.etcd_client}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        self.supervisor.spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=sunk",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                # A single member still listens for peers; its own port keeps beds apart.
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=sunk={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self.supervisor.wait_ready(
            "etcd", lambda: self._get_ok(f"{client}/health", False), timeout, "(GET /health)"
        )
        if self.supervisor.running("kube-apiserver") is None:
            # Write one key before the apiserver starts, so that its watch cache
            # begins after etcd revision 1, as on any real cluster: a watch from
            # resourceVersion "1" is then reliably "410 Expired". On an empty
            # etcd the cache would start at revision 1 and replay everything.
            put = {
                "key": base64.b64encode(b"/sunk-testbed/started").decode(),
                "value": base64.b64encode(_now().isoformat().encode()).decode(),
            }
            reply = httpx2.post(f"{client}/v3/kv/put", json=put, timeout=5.0, trust_env=False)
            reply.raise_for_status()

    def _start_apiserver(
        self, bin_dir: Path, ports: Ports, access: KubeAccess, timeout: float
    ) -> None:
        pki = self.pki
        self.supervisor.spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
                # Every address: real nodes (sunk_testbed.nodes) reach it from
                # their network namespace at the host's end of its link.
                "--bind-address=0.0.0.0",
                "--advertise-address=127.0.0.1",
                # The `kubernetes` Service's endpoint is written by whoever
                # starts nodes (its address is the host's end of their link):
                # the reconciler would publish 127.0.0.1, which Endpoints refuse.
                "--endpoint-reconciler-type=none",
                # Node names do not resolve here; logs and exec go to the address.
                "--kubelet-preferred-address-types=InternalIP",
                # Webhooks (and aggregated APIs) at their pods' addresses: the
                # host routes pod IPs into the room, but no Service ClusterIP.
                "--enable-aggregator-routing=true",
                f"--secure-port={ports.apiserver}",
                f"--tls-cert-file={pki.path('apiserver.crt')}",
                f"--tls-private-key-file={pki.path('apiserver.key')}",
                f"--client-ca-file={pki.ca_cert}",
                f"--kubelet-client-certificate={pki.path('apiserver-kubelet-client.crt')}",
                f"--kubelet-client-key={pki.path('apiserver-kubelet-client.key')}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # Added to the default admission set (which stays on).
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                # The aggregation layer; kube-controller-manager and kube-scheduler
                # also read this CA (via a ConfigMap) and log errors without it.
                f"--requestheader-client-ca-file={pki.path('front-proxy-ca.crt')}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.path('front-proxy-client.crt')}",
                f"--proxy-client-key-file={pki.path('front-proxy-client.key')}",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
            ],
        )
        admin = self._ssl(client=True)
        self.supervisor.wait_ready(
            "kube-apiserver",
            lambda: self._get_ok(f"{access.server}/readyz", admin),
            timeout,
            "(GET /readyz)",
        )

    def _component_flags(self, name: str, port: int) -> list[str]:
        """Identity and serving flags that the controller manager and scheduler share."""
        kubeconfig = self._kubeconfig_dir / f"{name}.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={self.pki.path(f'{name}-serving.crt')}",
            f"--tls-private-key-file={self.pki.path(f'{name}-serving.key')}",
        ]

    def _start_controller_manager(
        self, bin_dir: Path, ports: Ports, server: str, timeout: float
    ) -> None:
        self.supervisor.spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                *self._component_flags("kube-controller-manager", ports.controller_manager),
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                # CSR signing, for a node runtime that bootstraps kubelet certificates.
                f"--cluster-signing-cert-file={self.pki.ca_cert}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
                "--use-service-account-credentials=true",
                # The default client limits (20 qps, burst 30) throttle its own
                # start (one ServiceAccount and token per controller) by seconds.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                f"--cluster-name={CLUSTER_NAME}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE_PERIOD}",
                f"--node-monitor-period={NODE_MONITOR_PERIOD}",
                "--leader-elect=false",
            ],
        )
        ctx, admin = self._ssl(client=False), self._ssl(client=True)
        healthz = f"https://127.0.0.1:{ports.controller_manager}/healthz"
        # /healthz answers before the controllers run; the ServiceAccount
        # controller making `default/default` shows they do (pods are refused
        # in a namespace until its `default` ServiceAccount exists).
        account = f"{server}/api/v1/namespaces/default/serviceaccounts/default"
        self.supervisor.wait_ready(
            "kube-controller-manager",
            lambda: self._get_ok(healthz, ctx) and self._get_ok(account, admin),
            timeout,
            "(GET /healthz, then the default ServiceAccount)",
        )

    def _start_scheduler(self, bin_dir: Path, ports: Ports, timeout: float) -> None:
        self.supervisor.spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                *self._component_flags("kube-scheduler", ports.scheduler),
                "--leader-elect=false",
            ],
        )
        ctx = self._ssl(client=False)
        url = f"https://127.0.0.1:{ports.scheduler}/readyz"
        self.supervisor.wait_ready(
            "kube-scheduler", lambda: self._get_ok(url, ctx), timeout, "(GET /readyz)"
        )


def async_client(
    kubeconfig: Path, *, field_manager: str = "sunk", namespace: str | None = None
) -> AsyncClient:
    """A lightkube AsyncClient for a kubeconfig file (current context), made as
    sunk's components make theirs (connections kept between bursts)."""
    return kube_client(kubeconfig, field_manager, namespace=namespace)


def async_http_client(kubeconfig: Path, *, timeout: float = 10.0) -> httpx2.AsyncClient:
    """A plain httpx2 client with the kubeconfig's server as base URL and its credentials.

    For the few calls lightkube's typed API cannot express or whose reply it
    cannot decode, and to see raw status codes. It goes through lightkube's own
    adapter, so every kind of kubeconfig credential lightkube supports works.
    """
    config = KubeConfig.from_file(kubeconfig).get()
    if config is None:
        raise ValueError(f"{kubeconfig} has no current context")
    client: httpx2.AsyncClient = _adapter_async_client(
        config, ConnectionParams(timeout=httpx2.Timeout(timeout))
    )
    return client
