"""The test bed's PKI: what the apiserver and its clients will check."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from lightkube import KubeConfig

from sunk_testbed.control_plane import Pki, first_service_ip, write_kubeconfig


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_apiserver_cert_names_every_address_clients_use(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ensure()
    cert = load(pki.path("apiserver.crt"))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.96.0.1"),
    }
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    cert.verify_directly_issued_by(load(pki.ca_cert))


def test_first_service_ip() -> None:
    assert first_service_ip("10.96.0.0/16") == "10.96.0.1"
    assert first_service_ip("10.0.0.0/24") == "10.0.0.1"


def test_client_cert_carries_user_and_groups(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ensure()
    crt, key = pki.issue_client("n1", "system:node:n1", ["system:nodes"])
    cert = load(crt)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:nodes"
    ]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    cert.verify_directly_issued_by(load(pki.ca_cert))
    assert key.stat().st_mode & 0o077 == 0


def test_ensure_keeps_what_exists(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ensure()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    pki.ensure()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert isinstance(load(pki.ca_cert).public_key(), ec.EllipticCurvePublicKey)


def test_kubeconfig_is_self_contained_and_readable_by_lightkube(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    pki.ensure()
    crt, key = pki.issue_client("u", "someone", [])
    path = write_kubeconfig(
        tmp_path / "u.kubeconfig",
        server="https://127.0.0.1:6443",
        ca_file=pki.ca_cert,
        cert_file=crt,
        key_file=key,
        user="someone",
    )
    config = KubeConfig.from_file(path).get()
    assert config is not None
    assert config.cluster.server == "https://127.0.0.1:6443"
    assert config.cluster.certificate_auth_data
    assert config.user is not None
    assert config.user.client_cert_data
    assert path.stat().st_mode & 0o077 == 0
