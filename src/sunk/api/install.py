"""Install sunk's CRDs and wait until they can be used."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from sunk.api.crd import nodeset_crd

FIELD_MANAGER = "sunk"


def crds() -> list[dict[str, Any]]:
    return [nodeset_crd()]


async def install_crds(
    client: AsyncClient,
    definitions: Sequence[dict[str, Any]] | None = None,
    *,
    namespace: str = "default",
) -> None:
    """Server-side apply each CRD, then wait until its resource answers a list.

    Established is not enough: for a second or two after it a list can still
    answer 404, then 429 "storage is (re)initializing". Callers bound the
    wait with `asyncio.timeout`. The list is made in `namespace`: one the
    caller may read (the operator's RBAC is namespaced).
    """
    definitions = list(definitions) if definitions is not None else crds()
    for definition in definitions:
        obj = codecs.from_dict(definition)
        assert isinstance(obj, CustomResourceDefinition)
        await client.apply(obj, field_manager=FIELD_MANAGER, force=True)
    for definition in definitions:
        spec = definition["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("storage"))
        resource = create_namespaced_resource(
            spec["group"], version, spec["names"]["kind"], spec["names"]["plural"]
        )
        await _wait_usable(client, resource, namespace)


async def _wait_usable(client: AsyncClient, resource: Any, namespace: str) -> None:
    while True:
        try:
            async for _ in client.list(resource, namespace=namespace, chunk_size=1):
                break
            return
        except httpx2.HTTPStatusError as error:
            # ApiError when the reply is a Status; a bare 404 page otherwise.
            code = error.status.code if isinstance(error, ApiError) else error.response.status_code
            if code not in (404, 429):
                raise
        await asyncio.sleep(0.1)
