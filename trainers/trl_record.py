"""The record of `trl.GRPOConfig`'s fields and transformers' tracker names, written from the installed TRL into
`core/spec/trl_fields.json`, which the spec reads (`grpoflow.core.spec.trl_fields`) without importing TRL.

Regenerate the file from the installed TRL after upgrading it (tests/core/test_trl_fields.py fails until then):

    python -m grpoflow.trainers.trl_record

Each field is recorded as its simple types (bool, int, float, str, list, dict, None; "object" for a type no YAML value
can be), the choices where its type (an enum, a Literal) or its metadata gives them, and its help text.
"""

import dataclasses
import enum
import json
import sys
import types
import typing
from typing import Any

from grpoflow.core.spec.trl_fields import PATH

_SIMPLE = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", type(None): "None"}


def _members(annotation: Any) -> list:
    """The members of a union annotation (the annotation itself when it is no union)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [leaf for arg in typing.get_args(annotation) for leaf in _members(arg)]
    return [annotation]


def _kind(member: Any) -> str:
    origin = typing.get_origin(member)
    if origin is typing.Literal:
        return _SIMPLE[type(typing.get_args(member)[0])]
    if origin is not None:  # list[str], dict[str, Any]...
        return _SIMPLE.get(origin, "object")
    if isinstance(member, type) and issubclass(member, enum.Enum):
        return "str"
    return _SIMPLE.get(member, "object")


def _choices(members: list, metadata: Any) -> list | None:
    """The values a string must be one of: the metadata's choices, an enum's values (transformers converts the string
    to the enum), or a Literal's strings when no plain str is allowed beside it."""
    if "choices" in metadata:
        return list(metadata["choices"])
    enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
    if enums:
        return [member.value for e in enums for member in e]
    if str in members:
        return None
    literals = [v for m in members if typing.get_origin(m) is typing.Literal for v in typing.get_args(m)]
    return [v for v in literals if isinstance(v, str)] or None


def generate() -> dict:
    """The record of the installed `trl.GRPOConfig`'s fields (what `trl_fields.json` holds).

    Returns:
        `dict`: `{"trl_version": str, "fields": {name: {"types": [...], "choices": [...] | None, "help": str}},
        "report_to": [tracker names]}`.
    """
    import trl
    from transformers.integrations import INTEGRATION_TO_CALLBACK
    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    fields = {}
    for field in dataclasses.fields(GRPOConfig):
        if not field.init:
            continue
        members = _members(hints[field.name])
        fields[field.name] = {
            "types": list(dict.fromkeys(map(_kind, members))),
            "choices": _choices(members, field.metadata),
            "help": " ".join(str(field.metadata.get("help", "")).split()),
        }
    return {"trl_version": trl.__version__, "fields": fields, "report_to": list(INTEGRATION_TO_CALLBACK)}


def main() -> int:
    record = generate()
    PATH.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PATH} ({len(record['fields'])} fields of trl.GRPOConfig, TRL {record['trl_version']}; trackers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
