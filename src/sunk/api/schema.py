"""Structural OpenAPI schemas for CRDs, from pydantic models and Kubernetes' own OpenAPI.

Kubernetes accepts only *structural* schemas in CRDs: every node has a type,
no `$ref`, no `oneOf` at the top of a property, and a handful of
`x-kubernetes-*` extensions. Two sources feed ours:

- sunk's own types are pydantic models; `from_pydantic` turns their JSON
  schema into a structural one (CEL rules and other extensions travel in
  `json_schema_extra`).
- embedded Kubernetes types (a NodeSet's pod template) come from the
  apiserver's published OpenAPI v3, resolved and reduced by `from_kubernetes`,
  so a bad template is refused at admission with the field named, exactly as
  the apiserver would for a Pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]

# The apiserver's OpenAPI describes a Quantity as "number or string" only; its
# parser's grammar, as CRD generators spell it, refuses "lots" at admission.
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_REF_ADDITIONS: dict[str, Schema] = {QUANTITY: {"pattern": QUANTITY_PATTERN}}

# Keys a CRD schema may carry; everything else in a source schema is dropped.
_STRUCTURAL_KEYS = frozenset(
    {
        "type",
        "format",
        "properties",
        "additionalProperties",
        "items",
        "required",
        "enum",
        "default",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "pattern",
        "nullable",
        "description",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)


def from_pydantic(model: type[BaseModel]) -> Schema:
    """The structural schema of `model` (its JSON schema, `$ref`s inlined)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    return _reduce(raw, definitions, keep_descriptions=True, object_defaults=True, stack=())


def from_kubernetes(
    openapi: Mapping[str, Any], name: str, *, keep_descriptions: bool = False
) -> Schema:
    """A type from an apiserver OpenAPI v3 document (`components.schemas[name]`), resolved.

    Descriptions are dropped by default: they triple the size of a pod
    template's schema, and `kubectl explain pod.spec` documents the fields.
    """
    definitions = openapi["components"]["schemas"]
    return _reduce(
        definitions[name],
        definitions,
        keep_descriptions=keep_descriptions,
        object_defaults=False,
        stack=(),
    )


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _reduce(
    node: Mapping[str, Any],
    definitions: Mapping[str, Any],
    *,
    keep_descriptions: bool,
    object_defaults: bool,
    stack: tuple[str, ...],
) -> Schema:
    def reduce(child: Mapping[str, Any], stack: tuple[str, ...] = stack) -> Schema:
        return _reduce(
            child,
            definitions,
            keep_descriptions=keep_descriptions,
            object_defaults=object_defaults,
            stack=stack,
        )

    if "$ref" in node:
        name = _ref_name(node["$ref"])
        if name in stack:
            raise ValueError(f"recursive schema through {name}: not expressible in a CRD")
        merged = {
            **definitions[name],
            **_REF_ADDITIONS.get(name, {}),
            **{k: v for k, v in node.items() if k != "$ref"},
        }
        return reduce(merged, (*stack, name))
    if "allOf" in node and len(node["allOf"]) == 1:
        # OpenAPI v3 wraps a $ref in allOf to attach a description or default.
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return reduce({**node["allOf"][0], **rest})

    variants = node.get("anyOf") or node.get("oneOf")
    if variants is not None:
        return _reduce_variants(node, variants, reduce)

    out: Schema = {}
    for key, value in node.items():
        if key not in _STRUCTURAL_KEYS:
            continue
        if key == "description" and not keep_descriptions:
            continue
        if key == "properties":
            out[key] = {prop: reduce(sub) for prop, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = reduce(value)
        elif key == "additionalProperties" and value is False:
            # pydantic's extra="forbid"; a CRD may not say it, but the
            # apiserver's strict field validation reports unknown fields.
            continue
        elif key == "default" and _drop_default(value, object_defaults):
            continue
        elif key == "default":
            out[key] = _without_nulls(value)
        else:
            out[key] = value
    _default_list_map_keys(out)
    if out.get("format") in ("int-or-string", "quantity"):
        out.pop("format")
        out.pop("type", None)
        out["x-kubernetes-int-or-string"] = True
    if "type" not in out and not _typeless_ok(out):
        out["type"] = "object"
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out.setdefault("x-kubernetes-preserve-unknown-fields", True)
    return out


def _reduce_variants(
    node: Mapping[str, Any], variants: list[Mapping[str, Any]], reduce: Any
) -> Schema:
    """`anyOf`/`oneOf`: Optional[X] becomes X; int|str (and a Quantity's number|str)
    becomes int-or-string, the only union a structural schema has."""
    rest = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
    kinds = [v for v in variants if v.get("type") != "null"]
    types = {v.get("type") for v in kinds}
    if types in ({"integer", "string"}, {"number", "string"}):
        out: Schema = reduce({k: v for k, v in rest.items() if k not in ("type", "format")})
        out.pop("type", None)
        out.pop("x-kubernetes-preserve-unknown-fields", None)
        out["x-kubernetes-int-or-string"] = True
        return out
    if len(kinds) == 1:
        merged: Schema = reduce({**kinds[0], **rest})
        return merged
    raise ValueError(f"cannot express a union of {sorted(map(str, types))} in a CRD schema")


def _drop_default(value: Any, object_defaults: bool) -> bool:
    """Which defaults a CRD schema keeps.

    Kubernetes' OpenAPI has Go's zero values as defaults ("" for a required
    enum) and empty objects, which are no defaults at all; meaningful scalars
    (a port's protocol: TCP) stay, since a list-map key must be required or
    defaulted. sunk's own object defaults stay, so the apiserver fills in and
    shows the effective settings of a NodeSet.
    """
    if value is None:
        return True
    if isinstance(value, dict | list):
        return not object_defaults
    return not object_defaults and value in ("", 0, False)


def _without_nulls(value: Any) -> Any:
    """pydantic dumps unset optional fields as null; a CRD default may not hold null."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _default_list_map_keys(schema: Schema) -> None:
    """A list-map key must be required or defaulted in a CRD: give optional ones the
    zero value the apiserver itself would see (e.g. imagePullSecrets[].name)."""
    items = schema.get("items")
    if not isinstance(items, dict):
        return
    required = set(items.get("required", ()))
    for key in schema.get("x-kubernetes-list-map-keys", ()):
        prop = items.get("properties", {}).get(key)
        if prop is not None and key not in required and "default" not in prop:
            prop["default"] = 0 if prop.get("type") == "integer" else ""


def _typeless_ok(schema: Mapping[str, Any]) -> bool:
    return bool(
        schema.get("x-kubernetes-int-or-string")
        or schema.get("x-kubernetes-preserve-unknown-fields")
    )
