"""The slurm chart's JWKS (charts/slurm/files/jwks.py, run by the keys hook in
the Slurm image): the public halves of the RS256 keys, as pyjwt and
cryptography read them, from the PEM forms ssh-keygen and openssl write."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from plugins.chart_files import FILES, chart_module
from sunk.slurm.auth import SigningKey, mint

SCRIPT = FILES / "jwks.py"


@pytest.fixture(scope="module")
def jwks() -> ModuleType:
    return chart_module("jwks")


def _pem(private: rsa.RSAPrivateKey, form: serialization.PrivateFormat) -> bytes:
    return private.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


@pytest.mark.parametrize(
    "form", [serialization.PrivateFormat.TraditionalOpenSSL, serialization.PrivateFormat.PKCS8]
)
def test_a_token_sunk_mints_verifies_with_the_jwk_of_its_kid(
    jwks: ModuleType, form: serialization.PrivateFormat
) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = _pem(private, form)
    document = jwks.jwks({"20260101T000000Z": pem})
    [key] = document["keys"]
    assert {k: key[k] for k in ("kty", "alg", "kid", "use")} == {
        "kty": "RSA",
        "alg": "RS256",
        "kid": "20260101T000000Z",
        "use": "sig",
    }
    numbers = private.public_key().public_numbers()
    assert int.from_bytes(base64.urlsafe_b64decode(key["n"] + "=="), "big") == numbers.n
    assert key["e"] == "AQAB"
    token = mint(SigningKey.from_pem("20260101T000000Z", pem), "sunk-syncer", 600, now=1000)
    public = jwt.PyJWK(key).key
    claims = jwt.decode(token.value, public, algorithms=["RS256"], options={"verify_exp": False})
    assert claims["sun"] == "sunk-syncer"
    assert set(key) == {"kty", "alg", "use", "kid", "n", "e"}  # nothing private


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen here")
def test_the_keys_hooks_key_reads_as_cryptography_reads_it(
    jwks: ModuleType, tmp_path: Path
) -> None:
    """The hook makes keys with `ssh-keygen -t rsa -m PEM` (in the Slurm image)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-C", "",
         "-f", str(tmp_path / "k")],
        check=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    pem = (tmp_path / "k").read_bytes()
    key = SigningKey.from_pem("k", pem)
    assert jwks.rsa_public_numbers(pem) == (
        key.private.public_key().public_numbers().n,
        key.private.public_key().public_numbers().e,
    )


def test_the_hook_reads_a_secret_and_writes_the_jwks_of_its_pem_keys(
    jwks: ModuleType,
) -> None:
    pems = {
        kid: _pem(
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            serialization.PrivateFormat.PKCS8,
        )
        for kid in ("b", "a")
    }
    secret = {
        "kind": "Secret",
        "data": {
            **{f"{kid}.pem": base64.b64encode(pem).decode() for kid, pem in pems.items()},
            "README": base64.b64encode(b"not a key").decode(),
        },
    }
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], input=json.dumps(secret), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert [k["kid"] for k in json.loads(out.stdout)["keys"]] == ["a", "b"]
    empty = subprocess.run(
        [sys.executable, str(SCRIPT)], input='{"data": {}}', capture_output=True, text=True
    )
    assert empty.returncode == 1
    assert "no <kid>.pem key" in empty.stderr
    bad = {"data": {"x.pem": base64.b64encode(b"nonsense").decode()}}
    refused = subprocess.run(
        [sys.executable, str(SCRIPT)], input=json.dumps(bad), capture_output=True, text=True
    )
    assert refused.returncode == 1
    assert "key x: not a PEM key" in refused.stderr
