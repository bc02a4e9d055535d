"""CustomResourceDefinitions, built from sunk's typed models.

`nodeset_crd()` is a pure function of the models and of the pod template
schema that `sunk_testbed.crd_schemas` took from a real apiserver (committed in
`sunk/api/k8s/`), so the CRD is reproducible and reviewable.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from sunk.api import GROUP
from sunk.api import nodeset as ns
from sunk.api.schema import Schema, from_pydantic

POD_TEMPLATE_SCHEMA = "podtemplatespec.json"


@cache
def pod_template_schema() -> Schema:
    """The structural schema of core/v1 PodTemplateSpec, as the apiserver publishes it."""
    text = resources.files("sunk.api.k8s").joinpath(POD_TEMPLATE_SCHEMA).read_text()
    loaded: Schema = json.loads(text)
    return loaded


def _printer_columns() -> list[dict[str, Any]]:
    def column(name: str, path: str, kind: str = "integer", **extra: Any) -> dict[str, Any]:
        return {"name": name, "type": kind, "jsonPath": path, **extra}

    return [
        column("Desired", ".status.desired"),
        column("Ready", ".status.ready"),
        column("Updated", ".status.updated"),
        column("Drained", ".status.drained"),
        column("Idle", ".status.slurm.idle"),
        column("Allocated", ".status.slurm.allocated"),
        column("Mixed", ".status.slurm.mixed", priority=1),
        column("Down", ".status.slurm.down", priority=1),
        column("Misscheduled", ".status.misscheduled", priority=1),
        column("Age", ".metadata.creationTimestamp", "date"),
    ]


def nodeset_schema(template: Schema | None = None) -> Schema:
    """The NodeSet's openAPIV3Schema: our models, with the real pod template embedded."""
    spec = from_pydantic(ns.NodeSetSpec)
    rules = spec["properties"]["template"].get("x-kubernetes-validations", [])
    spec["properties"]["template"] = {
        **(template if template is not None else pod_template_schema()),
        "description": spec["properties"]["template"].get("description", ""),
        "x-kubernetes-validations": rules,
    }
    status = from_pydantic(ns.NodeSetStatus)
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "sunk.dev/v1alpha1."},
            "kind": {"type": "string", "description": "NodeSet."},
            # The apiserver refuses anything but name and generateName here.
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def nodeset_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{ns.PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": ns.KIND,
                "listKind": f"{ns.KIND}List",
                "plural": ns.PLURAL,
                "singular": ns.KIND.lower(),
                "shortNames": ["nss"],
                "categories": ["sunk", "slurm"],
            },
            "versions": [
                {
                    "name": ns.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": nodeset_schema()},
                    # No scale subresource: like a DaemonSet, the set's size is
                    # the number of matching nodes, not a replica count.
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }
