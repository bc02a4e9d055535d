"""Property-based tests of what pod authors and login users write that the
scheduler reads: job comments and the seal, pod labels and annotations
(requests, gangs, tenancy identity), time limits (tests/plugins/fuzz.py sets
how many inputs each tries)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from lightkube.resources.core_v1 import Pod

from sunk.scheduler.jobs import JobIndex
from sunk.scheduler.request import (
    ANNOTATION_ACCOUNT,
    ANNOTATION_COMMENT,
    ANNOTATION_EXCLUSIVE,
    ANNOTATION_GPU_TYPE,
    ANNOTATION_GROUP_ID,
    ANNOTATION_PARTITION,
    ANNOTATION_QOS,
    ANNOTATION_RESERVATION,
    ANNOTATION_TIME_LIMIT,
    ANNOTATION_USER_ID,
    GANG_NAME,
    GANG_SIZE,
    JOB_COMPLETION_INDEX,
    JOBSET_NAME,
    LWS_GROUP_INDEX,
    LWS_NAME,
    LWS_SIZE,
    MAX_TIME_LIMIT,
    InvalidPod,
    Options,
    gang_of,
    identity_of,
    job_key,
    job_spec,
    time_limit_minutes,
)
from sunk.scheduler.seal import JobSeal, decode_key, encode_key
from sunk.scheduler.tenancy import Grant, Tenancy
from sunk.slurm.models import Job

pytestmark = pytest.mark.fuzz

SEAL = JobSeal(b"f" * 32, "sunk")
TENANCY = Tenancy(
    tenants=[
        Grant(
            namespaces=["ns"],
            uids="5000-5009",
            user=5000,
            gids="5000-5001",
            accounts=["team"],
            partitions=["k8s", "gpu"],
            qos=["high"],
        )
    ]
)
GRANTED_UIDS = range(5000, 5010)

# Any text a comment or an annotation may hold, lone surrogates included (a
# JSON string may carry them), and text near the forms the parsers look for.
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=80)
NEAR = st.sampled_from(
    ["sunk:", "seal=", "@", ":", " ", "%", "%2", "%C3", "%FF", "/", "gang:", "\n", "é", "0", "9"]
)
NEAR_TEXT = st.lists(st.one_of(NEAR, ANY_TEXT), max_size=8).map("".join)
TEXT = st.one_of(ANY_TEXT, NEAR_TEXT)
UIDS = st.one_of(st.none(), st.integers(0, 2**32))


def a_job(comment: str, user_id: int | None = 5001, user_name: str = "alice") -> Job:
    return Job(job_id=7, comment=comment, user_id=user_id, user_name=user_name)


@given(comment=TEXT, user_id=UIDS, user_name=st.sampled_from(["sunk", "alice", ""]))
def test_no_comment_makes_the_seal_raise_or_passes_without_the_secret(
    comment: str, user_id: int | None, user_name: str
) -> None:
    """Text anyone writes: read without an error, and never taken for a sealed job."""
    assert SEAL.key_of(a_job(comment, user_id, user_name)) is None


@given(key=TEXT, owner=st.one_of(st.none(), st.integers(0, 9_999_999_999)), note=TEXT)
def test_a_sealed_comment_reads_back_its_key_for_its_owner_only(
    key: str, owner: int | None, note: str
) -> None:
    try:
        comment = SEAL.comment(key, owner, note)
    except ValueError:
        assume(False)  # an empty key or one UTF-8 cannot encode: refused, as declared
        raise
    own = a_job(comment, owner, "sunk" if owner is None else "someone")
    assert SEAL.key_of(own) == key
    other = a_job(comment, (owner or 0) + 1, "mallory")
    assert SEAL.key_of(other) is None


@given(key=TEXT, owner=st.integers(1000, 99_999), data=st.data())
def test_no_change_to_a_sealed_comment_keeps_its_seal(key: str, owner: int, data: Any) -> None:
    """A copy with any character of its key or seal changed, added or removed
    is no one's: one spelling per key, and the MAC over exactly it."""
    assume(key)
    try:
        comment = SEAL.comment(key, owner)
    except ValueError:
        assume(False)
        raise
    at = data.draw(st.integers(0, len(comment) - 1))
    replacement = data.draw(st.one_of(st.just(""), NEAR, st.characters(codec=None)))
    changed = comment[:at] + replacement + comment[at + 1 :]
    assume(changed != comment)
    assert SEAL.key_of(a_job(changed, owner)) is None


@given(key=TEXT)
def test_a_key_has_one_spelling(key: str) -> None:
    try:
        encoded = encode_key(key)
    except ValueError:
        return
    assert " " not in encoded
    assert "\n" not in encoded
    assert decode_key(encoded) == key
    lowered = re.sub(r"%[0-9A-F]{2}", lambda escape: escape.group().lower(), encoded)
    if lowered != encoded:  # %C3 and %c3 are not both the key's
        assert decode_key(lowered) is None


@given(jobs=st.lists(st.tuples(st.integers(1, 50), TEXT, UIDS), max_size=30))
def test_the_job_index_takes_any_comments_and_keeps_the_sealed_ones(
    jobs: list[tuple[int, str, int | None]],
) -> None:
    index = JobIndex(SEAL)
    sealed = {job_id: SEAL.comment(f"ns/uid-{job_id}", 5001) for job_id in range(100, 105)}
    everything = {job_id: a_job(comment, uid) for job_id, comment, uid in jobs}
    everything |= {job_id: a_job(comment, 5001) for job_id, comment in sealed.items()}
    index.reindex(everything)
    assert index.sizes()["keys with jobs"] == len(sealed)
    for job_id, comment, uid in jobs:
        assert index.job_changed(job_id, None, a_job(comment, uid)) is None


# -- pods ---------------------------------------------------------------------------

ANNOTATIONS = [
    ANNOTATION_PARTITION,
    ANNOTATION_ACCOUNT,
    ANNOTATION_QOS,
    ANNOTATION_RESERVATION,
    ANNOTATION_TIME_LIMIT,
    ANNOTATION_EXCLUSIVE,
    ANNOTATION_COMMENT,
    ANNOTATION_USER_ID,
    ANNOTATION_GROUP_ID,
    ANNOTATION_GPU_TYPE,
    GANG_NAME,
    GANG_SIZE,
    JOB_COMPLETION_INDEX,
    LWS_SIZE,
]
LABEL_KEYS = [GANG_NAME, GANG_SIZE, JOBSET_NAME, LWS_NAME, LWS_GROUP_INDEX]
# Every fuzzed pod is a Job's: an index annotation makes it an indexed Job's.
OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j", "controller": True}
# Label values, as the apiserver lets them through.
LABEL_VALUES = st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
VALUES = st.one_of(
    TEXT,
    LABEL_VALUES,
    st.sampled_from(["5001", "0", "64030", "3", "1-00:00:00", "gpu", "k8s", "high", "team"]),
    st.integers(-5, 10**12).map(str),
)


def a_pod(annotations: dict[str, str], labels: dict[str, str], gpus: str | None) -> Pod:
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    return Pod.from_dict(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": "uid-p",
                "annotations": annotations,
                "labels": labels,
                "ownerReferences": [OWNER],
            },
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
                "terminationGracePeriodSeconds": 10,
            },
        }
    )


@given(
    annotations=st.dictionaries(st.sampled_from(ANNOTATIONS), VALUES),
    labels=st.dictionaries(st.sampled_from(LABEL_KEYS), LABEL_VALUES),
    gpus=st.sampled_from([None, "1", "8"]),
)
def test_a_pods_annotations_give_a_job_it_owns_or_a_refusal(
    annotations: dict[str, str], labels: dict[str, str], gpus: str | None
) -> None:
    """Never an error but InvalidPod; a job only as a granted uid; its comment
    reads back to the pod's own key; no Slurm field holds a separator it did not ask."""
    pod = a_pod(annotations, labels, gpus)
    try:
        gang = gang_of(pod)
        identity = identity_of(pod, TENANCY, "the test's tenancy", Options())
        spec = job_spec([pod], Options(), SEAL, identity, gang)
    except InvalidPod:
        return
    assert identity.user_id in GRANTED_UIDS
    assert identity.group_id in (None, 5000, 5001)
    assert identity.partition in ("k8s", "gpu")
    assert identity.account == "team"
    assert identity.qos in (None, "high")
    assert identity.reservation is None
    assert spec.comment is not None
    assert SEAL.key_of(a_job(spec.comment, identity.user_id)) == job_key("ns", "uid-p", gang)
    if spec.tres_per_node is not None:
        assert spec.tres_per_node.count(":") <= 2
        assert "," not in spec.tres_per_node
    if spec.time_limit_minutes is not None:
        assert 1 <= spec.time_limit_minutes <= MAX_TIME_LIMIT


@given(minutes=st.integers(1, MAX_TIME_LIMIT), form=st.integers(0, 3))
def test_a_time_limit_reads_back_as_written(minutes: int, form: int) -> None:
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    text = [
        str(minutes),
        f"{minutes}:00",
        f"{minutes // 60}:{minutes % 60:02d}:00",
        f"{days}-{hours:02d}:{mins:02d}:00",
    ][form]
    assume(form != 3 or days < 100_000)
    assert time_limit_minutes(text) == minutes


@given(text=TEXT)
def test_a_time_limit_is_minutes_or_a_refusal(text: str) -> None:
    try:
        minutes = time_limit_minutes(text)
    except InvalidPod:
        return
    assert 1 <= minutes <= MAX_TIME_LIMIT
