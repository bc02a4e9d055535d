"""Which Slurm jobs are the scheduler's: a seal in the job's comment that only it can make.

A job's comment is the only place a placeholder job can say which pod (or gang)
it is for, and any Slurm user can write any comment (`sbatch --comment=...`)
and read everyone's (`squeue -o %k`). So the comment carries, after the key,
`seal=<owner>:<mac>`: an HMAC-SHA256, with a secret only the scheduler holds,
over the key and the job's owner (a uid, or `@` for the scheduler's own Slurm
user). A job is the scheduler's for a key only if the MAC matches *and* the job
really belongs to that owner, so neither a made-up comment nor a copy of a real
one, submitted by another user, is taken for the scheduler's job.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from sunk.slurm.models import Job

TAG = "sunk:"
SEAL = "seal="
SELF = "@"  # the job runs as the scheduler's own Slurm user
SECRET_BYTES = 32


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


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
        sealed = f"{TAG}{key} {SEAL}{owner}:{self._mac(key, owner)}"
        return f"{sealed} {note}" if note else sealed

    def key_of(self, job: Job) -> str | None:
        """The key of a job the scheduler sealed, None for any other job."""
        words = job.comment.split(" ", 2)
        if len(words) < 2 or not words[0].startswith(TAG) or not words[1].startswith(SEAL):
            return None
        key = words[0].removeprefix(TAG)
        owner, _, mac = words[1].removeprefix(SEAL).partition(":")
        if not key or not hmac.compare_digest(mac, self._mac(key, owner)):
            return None
        if owner == SELF:
            return key if job.user_name == self._own_user else None
        return key if owner.isdigit() and job.user_id == int(owner) else None

    def _mac(self, key: str, owner: str) -> str:
        digest = hmac.new(self._secret, f"{key}\n{owner}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")
