"""Property-based tests of every parser of user-written text, at two sizes.

A test marked `fuzz` (and given its inputs by hypothesis' `@given`) runs a
sample in every run, `SUNK_FUZZ_SAMPLE` inputs (default 200), and
`SUNK_FUZZ_EXAMPLES` inputs (default 6,000) when the run selects the marker
(`./test -m fuzz`): over 100,000 inputs across the parsers. Either way the run
ends with what was tried: inputs per test, the time, and the total. Tests set
no example count of their own, so both sizes reach all of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.statistics import collector

MARK = "fuzz"
SAMPLE = int(os.environ.get("SUNK_FUZZ_SAMPLE", "200"))
FULL = int(os.environ.get("SUNK_FUZZ_EXAMPLES", "6000"))

_COMMON: dict[str, Any] = {
    "deadline": None,  # a loaded two-core machine is no reason to fail
    "database": None,  # nothing written into the work tree; a failure prints its input
    "suppress_health_check": [HealthCheck.too_slow],
    "print_blob": True,
}
settings.register_profile("sample", max_examples=SAMPLE, **_COMMON)
settings.register_profile("fuzz", max_examples=FULL, **_COMMON)


@dataclass
class Tried:
    inputs: int = 0
    failing: int = 0
    seconds: float = 0.0


_tried: dict[str, Tried] = {}


# A full-size run of one property test may take minutes on two busy cores.
FULL_TIMEOUT = 3600


def _full(config: pytest.Config) -> bool:
    return MARK in (config.getoption("markexpr", "") or "")


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("fuzz" if _full(config) else "sample")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _full(config):
        for item in items:
            if item.get_closest_marker(MARK) is not None:
                item.add_marker(pytest.mark.timeout(FULL_TIMEOUT))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Counts the inputs hypothesis tried (innermost, so its statistics reach us)."""
    if item.get_closest_marker(MARK) is None:
        return (yield)
    tried = _tried.setdefault(item.nodeid, Tried())

    def count(stats: dict[str, Any]) -> None:
        for phase in ("explicit", "reuse", "generate", "target", "shrink"):
            for case in stats.get(f"{phase}-phase", {}).get("test-cases", []):
                tried.inputs += 1
                tried.failing += case["status"] == "interesting"

    started = time.monotonic()
    try:
        with collector.with_value(count):
            return (yield)
    finally:
        tried.seconds += time.monotonic() - started


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _tried:
        return
    write = terminalreporter.write_line
    terminalreporter.section("fuzz: inputs tried per parser")
    for nodeid, tried in sorted(_tried.items()):
        failing = f", {tried.failing} failing" if tried.failing else ""
        write(f"{tried.inputs:>9,} inputs in {tried.seconds:7.1f}s{failing}  {nodeid}")
    inputs = sum(t.inputs for t in _tried.values())
    seconds = sum(t.seconds for t in _tried.values())
    write(f"{inputs:>9,} inputs in {seconds:7.1f}s in all, {len(_tried)} property tests")
