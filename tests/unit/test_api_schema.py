"""Structural schema reduction: what a CRD may say, from pydantic and from Kubernetes' OpenAPI."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from sunk.api.crd import nodeset_crd
from sunk.api.schema import QUANTITY, from_kubernetes, from_pydantic


def _openapi(**schemas: Any) -> dict[str, Any]:
    return {"components": {"schemas": schemas}}


def test_refs_in_all_of_are_inlined_and_descriptions_dropped() -> None:
    doc = _openapi(
        Outer={
            "type": "object",
            "description": "long text",
            "properties": {"inner": {"allOf": [{"$ref": "#/components/schemas/Inner"}]}},
        },
        Inner={"type": "object", "properties": {"x": {"type": "string", "default": ""}}},
    )
    assert from_kubernetes(doc, "Outer") == {
        "type": "object",
        "properties": {"inner": {"type": "object", "properties": {"x": {"type": "string"}}}},
    }


def test_int_or_string_and_quantity() -> None:
    doc = _openapi(
        Holder={
            "type": "object",
            "properties": {
                "port": {"$ref": "#/components/schemas/IntOrString"},
                "cpu": {"$ref": f"#/components/schemas/{QUANTITY}"},
            },
        },
        IntOrString={"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
        **{QUANTITY: {"oneOf": [{"type": "string"}, {"type": "number"}]}},
    )
    props = from_kubernetes(doc, "Holder")["properties"]
    assert props["port"] == {"x-kubernetes-int-or-string": True}
    assert props["cpu"]["x-kubernetes-int-or-string"] is True
    assert "type" not in props["cpu"]
    assert props["cpu"]["pattern"].startswith("^")


def test_optional_list_map_keys_get_a_default() -> None:
    doc = _openapi(
        Holder={
            "type": "object",
            "properties": {
                "refs": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                }
            },
        }
    )
    refs = from_kubernetes(doc, "Holder")["properties"]["refs"]
    assert refs["items"]["properties"]["name"]["default"] == ""


def test_recursion_is_refused() -> None:
    doc = _openapi(
        Loop={"type": "object", "properties": {"me": {"$ref": "#/components/schemas/Loop"}}}
    )
    with pytest.raises(ValueError, match="recursive"):
        from_kubernetes(doc, "Loop")


class _Inner(BaseModel):
    count: int = 3
    label: str | None = None


class _Outer(BaseModel):
    amount: Annotated[
        int | str, Field(json_schema_extra={"x-kubernetes-validations": [{"rule": "true"}]})
    ]
    inner: _Inner = _Inner()
    maybe: _Inner | None = None


def test_pydantic_models_become_structural() -> None:
    schema = from_pydantic(_Outer)
    assert schema["required"] == ["amount"]
    amount = schema["properties"]["amount"]
    assert amount["x-kubernetes-int-or-string"] is True
    assert amount["x-kubernetes-validations"] == [{"rule": "true"}]
    # Object defaults of our own models stay (without nulls), so the
    # apiserver shows effective settings; a None default is no default.
    assert schema["properties"]["inner"]["default"] == {"count": 3}
    assert "default" not in schema["properties"]["maybe"]
    assert schema["properties"]["maybe"]["type"] == "object"


def test_the_nodeset_crd_is_structural() -> None:
    crd = nodeset_crd()
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    root = version["schema"]["openAPIV3Schema"]

    def walk(schema: dict[str, Any], path: str) -> None:
        assert "$ref" not in schema, path
        assert not {"anyOf", "oneOf", "allOf"} & schema.keys(), path
        if "properties" in schema:
            assert schema.get("type") == "object", path
            for name, child in schema["properties"].items():
                walk(child, f"{path}.{name}")
        if "items" in schema:
            assert schema.get("type") == "array", path
            walk(schema["items"], f"{path}[]")
        if isinstance(schema.get("additionalProperties"), dict):
            walk(schema["additionalProperties"], f"{path}{{}}")
        typed = "type" in schema or schema.get("x-kubernetes-int-or-string")
        assert typed or schema.get("x-kubernetes-preserve-unknown-fields"), path

    walk(root, "")
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:6] == ["Desired", "Ready", "Updated", "Drained", "Idle", "Allocated"]


def test_every_nodeset_field_of_ours_says_what_it_is() -> None:
    """`kubectl explain nodeset.<field>` prints a description for every field
    sunk defines (the embedded pod template keeps Kubernetes' own structure and
    drops its descriptions, for size)."""
    root = nodeset_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = []

    def walk(schema: dict[str, Any], path: str) -> None:
        for name, child in schema.get("properties", {}).items():
            where = f"{path}.{name}"
            if not child.get("description") and where != ".metadata":  # Kubernetes' own
                missing.append(where)
            if where != ".spec.template":
                walk(child, where)
        if "items" in schema:
            walk(schema["items"], f"{path}[]")

    walk(root, "")
    assert missing == []
