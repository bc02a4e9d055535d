"""Gang sizes of indexed Jobs and JobSets, from their specs (pure)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sunk.scheduler.request import InvalidPod
from sunk.scheduler.workloads import job_gang_size, jobset_gang_size


@pytest.mark.parametrize(
    ("spec", "size"),
    [
        ({"parallelism": 4, "completions": 4}, 4),
        ({"parallelism": 4, "completions": 2}, 2),  # Kubernetes runs only 2
        ({"completions": 1}, 1),  # parallelism defaults to 1
        ({"parallelism": 3}, 3),  # completions default to parallelism
        ({}, 1),
    ],
)
def test_an_indexed_jobs_gang_is_all_its_pods_at_once(spec: dict[str, Any], size: int) -> None:
    assert job_gang_size(spec, "Job j: spec") == size


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        (
            {"parallelism": 2, "completions": 8},
            "Job j: spec: completions (8) exceed parallelism (2)",
        ),
        ({"parallelism": -1}, "Job j: spec.parallelism: -1 is not a count"),
        ({"parallelism": "2"}, "Job j: spec.parallelism: '2' is not a count"),
        ({"completions": True}, "Job j: spec.completions: True is not a count"),
    ],
)
def test_a_job_that_runs_in_waves_is_refused_naming_the_field(
    spec: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(InvalidPod, match=re.escape(refusal)):
        job_gang_size(spec, "Job j: spec")


def replicated(name: str, replicas: int | None, **job: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "template": {"spec": job}}
    if replicas is not None:
        entry["replicas"] = replicas
    return entry


def test_a_jobsets_gang_is_replicas_times_parallelism_summed() -> None:
    spec = {
        "replicatedJobs": [
            replicated("driver", 1, parallelism=1, completions=1),
            replicated("workers", 2, parallelism=2, completions=2),
            replicated("sidecar", None),  # replicas default to 1, parallelism to 1
        ]
    }
    assert jobset_gang_size(spec, "js") == 1 + 4 + 1


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        (
            {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": []},
            "JobSet js: spec.startupPolicy.startupPolicyOrder InOrder",
        ),
        ({"replicatedJobs": []}, "JobSet js: its replicated Jobs have no pods"),
        ({"replicatedJobs": [replicated("w", 0)]}, "its replicated Jobs have no pods"),
        (
            {"replicatedJobs": [replicated("w", 2, parallelism=1, completions=3)]},
            "JobSet js: spec.replicatedJobs[0].template.spec: completions (3) exceed",
        ),
        (
            {"replicatedJobs": [replicated("w", None), {"name": "x", "replicas": "2"}]},
            "spec.replicatedJobs[1].replicas: '2' is not a count",
        ),
    ],
)
def test_a_jobset_that_cannot_start_at_once_is_refused_naming_the_field(
    spec: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(InvalidPod, match=re.escape(refusal)):
        jobset_gang_size(spec, "js")
