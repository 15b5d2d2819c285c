"""The base of every config model: unknown keys are errors; optional settings drawn plainly in Prefect's form."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


# Prefect's run form draws the flow's JSON schema. An optional setting (`X | None`) drew an `X | None`
# switch and a `Property is type "None"` line; `_form_schema` gives it X's schema alone and no
# `default: null` (the form would fill an empty box with it and send the null). Validation is
# unchanged, and Prefect's server check still takes an explicit null for a property with no default.
# An optional choice (`Literal[...] | None`) becomes an enum that holds None: a select offering None.
# Optional sections (source, sources, tokenizer.train, train, the cleaning blocks, dedup.near) keep their
# switch: None there is a choice.
# docs/FIELD-NOTES.md says what was measured.
def _form_schema(schema: dict[str, Any]) -> None:
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf", [])
        if len(options) == 2 and {"type": "null"} in options:
            (kept,) = [o for o in options if o != {"type": "null"}]
            if "$ref" not in kept and kept.get("type") not in ("object", "array"):
                del prop["anyOf"]
                prop.update({"enum": [*kept["enum"], None]} if "enum" in kept else kept)
        if "default" in prop and prop["default"] is None and "anyOf" not in prop:
            del prop["default"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=_form_schema)
