"""The node's GPU inventory on its Node: the annotation `sunk.dev/gpus`
("0,2,3", the indices of the GPUs the plugin finds now), written by the
node's own plugin after every change, so what is on the node is seen from
the apiserver (`kubectl get node`) and by what renders Slurm's gres.conf.

`format_gpus` and `parse_gpus` (pure) are the annotation's text: indices
ascending, comma-separated, no blanks, "" for none. A reader refuses
anything else, naming the annotation: any holder of `patch nodes` can write
it, and the chart lets the plugin write only this annotation, of its own
Node, in this form.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from sunk.api import ANNOTATION_NODE_GPUS

log = logging.getLogger(__name__)

# As the chart's admission policy has it: indices of at most four digits.
_GPUS = re.compile(r"(?:(?:0|[1-9][0-9]{0,3})(?:,(?:0|[1-9][0-9]{0,3}))*)?")


def format_gpus(indices: Iterable[int]) -> str:
    """(3, 0, 2) -> "0,2,3"."""
    return ",".join(str(i) for i in sorted(set(indices)))


def parse_gpus(text: str) -> tuple[int, ...]:
    """`"0,2,3"` -> (0, 2, 3). ValueError, naming the annotation, for text
    `format_gpus` does not write (blanks, signs, leading zeros, repeats,
    an order other than ascending)."""
    if not _GPUS.fullmatch(text):
        raise ValueError(
            f"annotation {ANNOTATION_NODE_GPUS}: {text[:64]!r} is not GPU indices"
            ' ascending, comma-separated ("0,2,3")'
        )
    indices = tuple(int(part) for part in text.split(",")) if text else ()
    if list(indices) != sorted(set(indices)):
        raise ValueError(
            f"annotation {ANNOTATION_NODE_GPUS}: {text[:64]!r} is not in ascending"
            " order without repeats"
        )
    return indices


def gpus_patch(indices: Iterable[int]) -> dict[str, object]:
    """The merge patch that sets the annotation (nothing else of the Node)."""
    return {"metadata": {"annotations": {ANNOTATION_NODE_GPUS: format_gpus(indices)}}}


class NodeAnnotations(Protocol):
    async def patch(self, node: str, body: dict[str, object]) -> None: ...


class KubeNodeAnnotations:
    """`NodeAnnotations` on the apiserver: a merge patch of the Node."""

    def __init__(self, kube: AsyncClient) -> None:
        self.kube = kube

    async def patch(self, node: str, body: dict[str, object]) -> None:
        await self.kube.patch(Node, node, body, patch_type=PatchType.MERGE)


async def keep_publishing(
    found: AsyncIterator[tuple[int, ...]],
    node: str,
    nodes: NodeAnnotations,
    retry_seconds: float = 5.0,
) -> None:
    """Write each inventory `found` yields on the Node; a write that fails
    is tried again every `retry_seconds` until it is done or a newer
    inventory replaces it."""
    pending: asyncio.Future[tuple[int, ...]] | None = None
    iterator = aiter(found)
    latest = await anext(iterator)
    try:
        while True:
            try:
                await nodes.patch(node, gpus_patch(latest))
                log.info("node %s: %s=%r", node, ANNOTATION_NODE_GPUS, format_gpus(latest))
                wait: float | None = None
            except Exception as error:  # the apiserver away, the policy refusing: say so, retry
                log.warning(
                    "node %s: writing %s failed (again in %gs): %s",
                    node,
                    ANNOTATION_NODE_GPUS,
                    retry_seconds,
                    error,
                )
                wait = retry_seconds
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=wait)
            if done:
                latest = pending.result()
                pending = None
    finally:
        if pending is not None:
            pending.cancel()
