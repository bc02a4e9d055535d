"""Shared fixtures: one test bed per test session.

The Kubernetes half lives in plugins/kube.py, the Slurm half in
plugins/slurm.py. Both record their daemons with one Supervisor in one state
directory, so a crashed session is cleaned up by the next one.

Set SUNK_TESTBED_STATE to the state directory of a bed that is already
running (e.g. the one `sunk local up` started) to run the tests against it:
nothing is then started or stopped by the tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunk_testbed.procs import Supervisor

pytest_plugins = [
    "plugins.kube",
    "plugins.slurm",
    "plugins.nodes",
    "plugins.loopwatch",
    "plugins.local_cluster",
    "plugins.fuzz",
]

BED_MARKS = ("contract", "e2e", "acceptance")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is `unit` unless its module says `contract` or `e2e`, so
    `./test -m unit` runs without a test bed, in seconds."""
    for item in items:
        if not any(item.get_closest_marker(mark) for mark in BED_MARKS):
            item.add_marker(pytest.mark.unit)
    # Unit tests first, so a run fails fast. The default install's journey
    # last: it leaves the session's nodes offering GPUs its plugin no longer
    # serves, which would hold the slurmd pods of a later module's NodeSet
    # (nodeset.pods.gpu_plugin_not_serving).
    items.sort(key=_tier)


def _tier(item: pytest.Item) -> int:
    if item.get_closest_marker("acceptance"):
        return 2
    return 0 if item.get_closest_marker("unit") else 1


@pytest.fixture(scope="session")
def testbed_external() -> bool:
    """True when the tests run against a bed they did not start."""
    return bool(os.environ.get("SUNK_TESTBED_STATE"))


@pytest.fixture(scope="session")
def testbed_state_dir(testbed_external: bool) -> Iterator[Path]:
    if testbed_external:
        yield Path(os.environ["SUNK_TESTBED_STATE"])
        return
    # Short, fixed-length paths: slurmd and munge put socket paths under it.
    path = Path(tempfile.mkdtemp(prefix="sunk-tb-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def supervisor(testbed_state_dir: Path, testbed_external: bool) -> Iterator[Supervisor]:
    sup = Supervisor(testbed_state_dir)
    yield sup
    if not testbed_external:
        sup.stop_all()
