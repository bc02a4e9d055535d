"""The JWKS slurmctld and slurmdbd verify RS256 tokens with, from the RS256
keys' Secret: the keys hook runs it in the Slurm image (Python's standard
library only) at every install and upgrade.

Reads a Kubernetes Secret (the apiserver's JSON) on stdin, one `<kid>.pem`
entry per key (PKCS#1 or PKCS#8 PEM, unencrypted), and prints the JWKS: for
each key its public half (`n`, `e`) with `kty` RSA, `alg` RS256 (Slurm skips
any other alg) and `kid` (Slurm picks the key a token names by it). The
private halves never leave the Secret: only the modulus and exponent are read.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

SUFFIX = ".pem"
_PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----(.*?)-----END \1-----", re.DOTALL)


def _element(der: bytes, pos: int) -> tuple[int, int, int]:
    """The DER element at `pos`: (tag, start of its content, end of its content)."""
    tag = der[pos]
    length = der[pos + 1]
    pos += 2
    if length & 0x80:
        size = length & 0x7F
        length = int.from_bytes(der[pos : pos + size], "big")
        pos += size
    return tag, pos, pos + length


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        element = _element(der, start)
        out.append(element)
        start = element[2]
    return out


def rsa_public_numbers(pem: bytes) -> tuple[int, int]:
    """(n, e) of an RSA private key in PEM: `RSA PRIVATE KEY` (PKCS#1, what
    `ssh-keygen -m PEM` writes) or `PRIVATE KEY` (PKCS#8, what openssl writes)."""
    found = _PEM.search(pem)
    if found is None:
        raise ValueError("not a PEM key")
    label, body = found.group(1), base64.b64decode(b"".join(found.group(2).split()))
    tag, start, end = _element(body, 0)
    if tag != 0x30:
        raise ValueError("not a DER sequence")
    fields = _children(body, start, end)
    if label == b"PRIVATE KEY":  # PKCS#8: version, algorithm, the PKCS#1 key in an octet string
        if len(fields) < 3 or fields[2][0] != 0x04:
            raise ValueError("not a PKCS#8 private key")
        inner = body[fields[2][1] : fields[2][2]]
        return rsa_public_numbers(
            b"-----BEGIN RSA PRIVATE KEY-----"
            + base64.b64encode(inner)
            + b"-----END RSA PRIVATE KEY-----"
        )
    if label != b"RSA PRIVATE KEY":
        raise ValueError(f"not an RSA private key: {label.decode()}")
    # PKCS#1: version, modulus, public exponent, then the private numbers.
    if len(fields) < 3 or any(f[0] != 0x02 for f in fields[:3]):
        raise ValueError("not a PKCS#1 RSA private key")
    n = int.from_bytes(body[fields[1][1] : fields[1][2]], "big")
    e = int.from_bytes(body[fields[2][1] : fields[2][2]], "big")
    return n, e


def _b64url(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def jwk(kid: str, pem: bytes) -> dict[str, str]:
    try:
        n, e = rsa_public_numbers(pem)
    except (ValueError, IndexError) as error:
        raise ValueError(f"key {kid}: {error}") from None
    return {
        "kty": "RSA",
        "alg": "RS256",
        "use": "sig",
        "kid": kid,
        "n": _b64url(n),
        "e": _b64url(e),
    }


def jwks(keys: Mapping[str, bytes]) -> dict[str, list[dict[str, str]]]:
    """The JWKS of `keys` (kid → PEM), in kid order."""
    return {"keys": [jwk(kid, keys[kid]) for kid in sorted(keys)]}


def keys_of_secret(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """The `<kid>.pem` entries of a Secret as the apiserver returns it."""
    data: Mapping[str, str] = secret.get("data") or {}
    return {
        name.removesuffix(SUFFIX): base64.b64decode(value)
        for name, value in data.items()
        if name.endswith(SUFFIX)
    }


def main() -> int:
    keys = keys_of_secret(json.load(sys.stdin))
    if not keys:
        print("the Secret holds no <kid>.pem key", file=sys.stderr)
        return 1
    try:
        document = jwks(keys)
    except ValueError as error:
        print(f"a key of the Secret is not an RSA private key: {error}", file=sys.stderr)
        return 1
    json.dump(document, sys.stdout, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
