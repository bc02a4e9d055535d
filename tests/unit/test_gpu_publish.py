"""The node's GPU inventory on its Node (sunk.gpus.publish): the annotation's
text, and the plugin writing it after every change, a failed write tried
again. The Node is a fake of the narrow port (`NodeAnnotations`); the
chart's policy on the real apiserver is tests/charts/test_component_policies.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunk.api import ANNOTATION_NODE_GPUS
from sunk.gpus.publish import format_gpus, gpus_patch, keep_publishing, parse_gpus


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        ("", ()),
        ("0", (0,)),
        ("0,2,3", (0, 2, 3)),
        ("7", (7,)),
        ("0,1,2,3,4,5,6,7", tuple(range(8))),
        ("9999", (9999,)),
    ],
)
def test_the_annotation_reads_back_what_the_plugin_writes(
    text: str, indices: tuple[int, ...]
) -> None:
    assert parse_gpus(text) == indices
    assert format_gpus(indices) == text


@pytest.mark.parametrize(
    "text",
    [" 0", "0, 1", "0,,1", "01", "-1", "+1", "1,0", "0,0", "a", "0,", ",0", "10000", "0\n"],
)
def test_anything_else_is_refused_naming_the_annotation(text: str) -> None:
    with pytest.raises(ValueError, match=ANNOTATION_NODE_GPUS):
        parse_gpus(text)


@pytest.mark.fuzz
@given(st.text(max_size=40))
def test_any_text_is_read_or_refused_with_value_error_alone(text: str) -> None:
    try:
        indices = parse_gpus(text)
    except ValueError:
        return
    assert format_gpus(indices) == text


@pytest.mark.fuzz
@given(st.sets(st.integers(min_value=0, max_value=9999), max_size=16))
def test_every_inventory_reads_back_unchanged(indices: set[int]) -> None:
    assert parse_gpus(format_gpus(indices)) == tuple(sorted(indices))


def test_the_patch_sets_the_annotation_and_nothing_else() -> None:
    assert gpus_patch([3, 0]) == {"metadata": {"annotations": {ANNOTATION_NODE_GPUS: "0,3"}}}


class FakeNodes:
    """The Node's annotation writes, failing the first `fail` of them."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.written: list[str] = []
        self.wrote = asyncio.Event()

    async def patch(self, node: str, body: dict[str, object]) -> None:
        assert node == "gpu-1"
        if self.fail:
            self.fail -= 1
            raise ConnectionError("apiserver away")
        metadata = body["metadata"]
        assert isinstance(metadata, dict)
        self.written.append(metadata["annotations"][ANNOTATION_NODE_GPUS])
        self.wrote.set()


async def inventories(queue: asyncio.Queue[tuple[int, ...]]) -> AsyncIterator[tuple[int, ...]]:
    while True:
        yield await queue.get()


async def until(check: object, timeout: float = 2.0) -> None:
    async def poll() -> None:
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def test_each_inventory_is_written_when_found() -> None:
    nodes, queue = FakeNodes(), asyncio.Queue[tuple[int, ...]]()
    queue.put_nowait((0, 1, 2, 3))
    task = asyncio.create_task(keep_publishing(inventories(queue), "gpu-1", nodes))
    try:
        await until(lambda: nodes.written == ["0,1,2,3"])
        queue.put_nowait((0, 2, 3))  # nvidia1 gone
        await until(lambda: nodes.written == ["0,1,2,3", "0,2,3"])
        queue.put_nowait((0, 1, 2, 3))  # back
        await until(lambda: nodes.written[-1] == "0,1,2,3")
    finally:
        task.cancel()


async def test_a_failed_write_is_tried_again() -> None:
    nodes, queue = FakeNodes(fail=2), asyncio.Queue[tuple[int, ...]]()
    queue.put_nowait((0, 1))
    task = asyncio.create_task(
        keep_publishing(inventories(queue), "gpu-1", nodes, retry_seconds=0.05)
    )
    try:
        await until(lambda: nodes.written == ["0,1"])
        assert nodes.fail == 0
    finally:
        task.cancel()


async def test_a_newer_inventory_replaces_one_not_yet_written() -> None:
    """While the apiserver refuses, the GPUs change: the newer list is the
    one written, at once (not after the retry's wait)."""
    nodes, queue = FakeNodes(fail=1), asyncio.Queue[tuple[int, ...]]()
    queue.put_nowait((0, 1, 2, 3))
    task = asyncio.create_task(
        keep_publishing(inventories(queue), "gpu-1", nodes, retry_seconds=60)
    )
    try:
        await until(lambda: nodes.fail == 0)
        queue.put_nowait((0, 1, 2))
        await until(lambda: nodes.written == ["0,1,2"])
    finally:
        task.cancel()
