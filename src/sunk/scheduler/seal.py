"""Which Slurm jobs are the scheduler's: a seal in the job's comment that only it can make.

A job's comment is the only place a placeholder job can say which pod (or gang)
it is for, and any Slurm user can write any comment (`sbatch --comment=...`,
`scontrol update job comment=...` on their own jobs) and read everyone's
(`squeue -o %k`). So the comment carries, after the key,
`seal=<owner>:<mac>`: an HMAC-SHA256, with a secret only the scheduler holds,
over the key and the job's owner (a uid, or `@` for the scheduler's own Slurm
user). A job is the scheduler's for a key only if the MAC matches *and* the job
really belongs to that owner, so neither a made-up comment nor a copy of a real
one, submitted by another user, is taken for the scheduler's job.

The comment is text anyone writes, so reading it never raises, whatever it
holds: the key is percent-encoded (every byte outside `A-Za-z0-9_.-~/:`), so
no space, newline or other character in a key can move the words around it,
and only the one canonical encoding of a key is read back; the owner must be
`@` or ASCII digits, and the MAC 22 base64url characters, compared as bytes.
The MAC's input (`<key>\\n<owner>`) splits one way only: the owner has no
newline. Keys made of Kubernetes names (all that `request.job_key` makes)
encode to themselves, so the comments read `sunk:<namespace>/<uid> seal=...`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from urllib.parse import quote, unquote

from sunk.slurm.models import Job

TAG = "sunk:"
SEAL = "seal="
SELF = "@"  # the job runs as the scheduler's own Slurm user
SECRET_BYTES = 32
_KEY_SAFE = "/:"  # beside quote's own A-Za-z0-9_.-~
_ENCODED_KEY = re.compile(r"[A-Za-z0-9_.~/:%-]+")
_OWNER = re.compile(r"@|[0-9]{1,10}")
_MAC = re.compile(r"[A-Za-z0-9_-]{22}")


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def encode_key(key: str) -> str:
    """The key as the comment carries it; ValueError for a key no comment can carry."""
    if not key:
        raise ValueError("a job key must not be empty")
    try:
        return quote(key, safe=_KEY_SAFE, errors="strict")
    except UnicodeEncodeError as error:
        raise ValueError(f"a job key must be text UTF-8 can encode: {key!r}") from error


def decode_key(encoded: str) -> str | None:
    """The key a comment's first word carries; None unless it is the canonical
    encoding of a key (so one key has one spelling, and one spelling one key)."""
    if _ENCODED_KEY.fullmatch(encoded) is None:
        return None
    try:
        key = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return None
    return key if quote(key, safe=_KEY_SAFE) == encoded else None


class JobSeal:
    def __init__(self, secret: bytes, own_user: str) -> None:
        if len(secret) < 16:
            raise ValueError("the job seal's secret must be at least 16 bytes")
        self._secret = secret
        self._own_user = own_user

    def comment(self, key: str, user_id: int | None, note: str | None = None) -> str:
        """The sealed comment of the job for `key`, run as `user_id` (None: as the
        scheduler's own Slurm user); a user's `note` follows it."""
        owner = SELF if user_id is None else str(user_id)
        if _OWNER.fullmatch(owner) is None:
            raise ValueError(f"a job's owner must be a uid of up to 10 digits, not {owner!r}")
        sealed = f"{TAG}{encode_key(key)} {SEAL}{owner}:{self._mac(key, owner)}"
        return f"{sealed} {note}" if note else sealed

    def key_of(self, job: Job) -> str | None:
        """The key of a job the scheduler sealed, None for any other job; never raises."""
        words = job.comment.split(" ", 2)
        if len(words) < 2 or not words[0].startswith(TAG) or not words[1].startswith(SEAL):
            return None
        key = decode_key(words[0].removeprefix(TAG))
        owner, _, mac = words[1].removeprefix(SEAL).partition(":")
        if key is None or _OWNER.fullmatch(owner) is None or _MAC.fullmatch(mac) is None:
            return None
        if not hmac.compare_digest(mac.encode("ascii"), self._mac(key, owner).encode("ascii")):
            return None
        if owner == SELF:
            return key if job.user_name == self._own_user else None
        return key if job.user_id == int(owner) else None

    def _mac(self, key: str, owner: str) -> str:
        digest = hmac.new(self._secret, f"{key}\n{owner}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")
