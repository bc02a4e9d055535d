"""The job seal (pure): only the scheduler's own jobs, for their own key, pass."""

from __future__ import annotations

import pytest

from sunk.scheduler.seal import JobSeal
from sunk.slurm.models import Job

SEAL = JobSeal(b"s" * 32, "sunk")


def job(comment: str, user_name: str = "sunk", user_id: int | None = 990) -> Job:
    return Job(job_id=7, comment=comment, user_name=user_name, user_id=user_id)


def test_a_sealed_job_is_known_by_its_key() -> None:
    assert SEAL.key_of(job(SEAL.comment("ns/uid-1", None))) == "ns/uid-1"
    assert SEAL.key_of(job(SEAL.comment("ns/gang:g", None, "a note"))) == "ns/gang:g"
    as_tenant = SEAL.comment("ns/uid-1", 5001)
    assert SEAL.key_of(job(as_tenant, user_name="alice", user_id=5001)) == "ns/uid-1"


@pytest.mark.parametrize(
    "comment",
    [
        "sunk:ns/uid-1",  # unsealed, as any `sbatch --comment` can write
        "sunk:ns/uid-1 seal=@:AAAAAAAAAAAAAAAAAAAAAA",  # a made-up MAC
        "sunk:ns/uid-1 seal=@",
        "sunk: seal=@:x",
        "someone's own comment",
        "",
    ],
)
def test_a_comment_anyone_could_write_is_no_ones(comment: str) -> None:
    assert SEAL.key_of(job(comment)) is None


def test_a_copied_seal_is_worth_nothing_to_another_user() -> None:
    """`squeue -o %k` shows every job's comment: a copy, submitted by someone
    else, must not pass for the scheduler's job."""
    own = SEAL.comment("ns/uid-1", None)
    assert SEAL.key_of(job(own, user_name="mallory", user_id=6666)) is None
    tenant = SEAL.comment("ns/uid-1", 5001)
    assert SEAL.key_of(job(tenant, user_name="mallory", user_id=6666)) is None


def test_a_seal_is_for_one_key_and_one_secret() -> None:
    mac = SEAL.comment("ns/uid-1", None).split(" ")[1]
    assert SEAL.key_of(job(f"sunk:other/uid-1 {mac}")) is None
    assert JobSeal(b"t" * 32, "sunk").key_of(job(SEAL.comment("ns/uid-1", None))) is None
    with pytest.raises(ValueError, match="16 bytes"):
        JobSeal(b"short", "sunk")


@pytest.mark.parametrize(
    "comment",
    [
        "sunk:x seal=1000:é",  # a MAC no base64 holds: once a TypeError that stopped the scheduler
        "sunk:x seal=1000:\ud800",
        "sunk:é seal=@:AAAAAAAAAAAAAAAAAAAAAA",
        "sunk:%ZZ seal=@:AAAAAAAAAAAAAAAAAAAAAA",
        "sunk:x seal=²:AAAAAAAAAAAAAAAAAAAAAA",  # a digit to str.isdigit, not to int()
    ],
)
def test_a_comment_in_any_script_is_read_without_an_error(comment: str) -> None:
    assert SEAL.key_of(job(comment)) is None


def test_a_key_with_spaces_or_non_ascii_text_keeps_its_words_apart() -> None:
    for key in ("ns/gang:a b", "ns/gang:é", "ns/gang:a\nb", "ns/%41"):
        comment = SEAL.comment(key, 5001, "a note")
        assert comment.count(" ") == 3  # key, seal, "a note"
        assert SEAL.key_of(job(comment, user_name="alice", user_id=5001)) == key
    assert SEAL.comment("ns/uid-1", 5001).startswith("sunk:ns/uid-1 seal=5001:")
    with pytest.raises(ValueError, match="UTF-8"):
        SEAL.comment("ns/\ud800", 5001)
