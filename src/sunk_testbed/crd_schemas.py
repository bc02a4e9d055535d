"""Regenerate the Kubernetes schemas sunk embeds in its CRDs, from a real apiserver.

    python -m sunk_testbed.crd_schemas KUBECONFIG

writes `src/sunk/api/k8s/podtemplatespec.json`. A contract test compares the
committed file with what the test bed's apiserver publishes, so a Kubernetes
upgrade that changes the pod API is noticed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import sunk.api.k8s
from sunk.api.crd import POD_TEMPLATE_SCHEMA
from sunk.api.schema import Schema, from_kubernetes
from sunk_testbed.control_plane import async_http_client

CORE_V1 = "/openapi/v3/api/v1"
POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"


def pod_template_schema(openapi: dict[str, Any]) -> Schema:
    """PodTemplateSpec, reduced to what a CRD may embed.

    A CRD may not describe `metadata` of an embedded object beyond plain
    fields, and the controller owns the pod's name, namespace and owner
    references anyway: the template's metadata keeps labels and annotations.
    """
    schema = from_kubernetes(openapi, POD_TEMPLATE)
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    schema["properties"]["metadata"] = {
        "type": "object",
        "properties": {"labels": string_map, "annotations": string_map},
    }
    return schema


async def fetch_core_openapi(kubeconfig: Path) -> dict[str, Any]:
    async with async_http_client(kubeconfig) as http:
        reply = await http.get(CORE_V1)
        reply.raise_for_status()
        document: dict[str, Any] = reply.json()
        return document


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m sunk_testbed.crd_schemas KUBECONFIG")
    openapi = asyncio.run(fetch_core_openapi(Path(argv[1])))
    target = Path(sunk.api.k8s.__file__).parent / POD_TEMPLATE_SCHEMA
    target.write_text(json.dumps(pod_template_schema(openapi), indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv)
