"""How late the session's event loop runs, per test module.

The bed's fixtures, the in-process controllers and the tests share one event
loop. When it falls behind, polls go stale and heartbeats are late, and a test
fails far from the cause; the summary at the end of the run shows which module
held the loop up and which tasks it left behind. A synchronous test or fixture
(one that runs a CLI, say) pauses the loop for its whole length, and counts as
lag too: nothing in the loop runs meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

TICK = 0.05
LATE = 1.0  # seconds behind that count as a stall


@dataclass
class ModuleLag:
    worst: float = 0.0
    stalls: int = 0
    leftover: Counter[str] = field(default_factory=Counter)


@dataclass
class LoopWatch:
    current: str = "(session set-up)"
    modules: dict[str, ModuleLag] = field(default_factory=dict)

    def note(self, late: float) -> None:
        lag = self.modules.setdefault(self.current, ModuleLag())
        lag.worst = max(lag.worst, late)
        lag.stalls += late >= LATE

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            await asyncio.sleep(TICK)
            self.note(time.monotonic() - started - TICK)


WATCH = LoopWatch()


def _task_kind(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", task.get_name())


@pytest_asyncio.fixture(scope="session", loop_scope="session", autouse=True)
async def loop_watch() -> AsyncIterator[LoopWatch]:
    task = asyncio.create_task(WATCH.run(), name="loop-watch")
    yield WATCH
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest_asyncio.fixture(scope="module", loop_scope="session", autouse=True)
async def loop_watch_module(
    loop_watch: LoopWatch, request: pytest.FixtureRequest
) -> AsyncIterator[None]:
    loop_watch.current = request.module.__name__
    yield
    # Let cancelled tasks finish before counting what the module left running.
    await asyncio.sleep(0)
    me = asyncio.current_task()
    kinds = Counter(
        _task_kind(t) for t in asyncio.all_tasks() if t is not me and t.get_name() != "loop-watch"
    )
    lag = loop_watch.modules.setdefault(request.module.__name__, ModuleLag())
    lag.leftover = kinds
    loop_watch.current = "(between modules)"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not WATCH.modules:
        return
    terminalreporter.section("event loop lag by module")
    for module, lag in WATCH.modules.items():
        line = f"{module}: worst {lag.worst:.2f}s late, {lag.stalls} stalls ≥ {LATE:.0f}s"
        if lag.leftover:
            line += "; tasks left: " + ", ".join(f"{k} x{n}" for k, n in lag.leftover.items())
        terminalreporter.write_line(line)
