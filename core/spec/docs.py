"""The spec's reference tables, rendered from the pydantic models: the GRPO hyperparameter table
(`python -m grpoflow.core.spec`) and the docs' spec page, every field of every section (`spec_reference`, written
into the site by docs/gen_reference.py).

Each row is one field: its name, its type, its default in YAML spelling, its rule (the bounds pydantic enforces, then
the field's description: the text the Prefect form shows) and the trl.GRPOConfig fields it sets.
"""

import json
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from grpoflow.core.spec.fields import MAX_INT
from grpoflow.core.spec.hyperparameters import Hyperparameters
from grpoflow.core.spec.markdown import cell, table
from grpoflow.core.spec.models import JobSpec
from grpoflow.core.spec.rules import SECTION_TRL_KEYS, trl_markers

_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "<="),
    (annotated_types.MinLen, "min_length", "length >="),
)


def _bounds(field: FieldInfo) -> list[str]:
    # MAX_INT caps every integer field against typos like 1e30; it is no rule of the hyperparameter's own.
    return [
        f"{sign} {getattr(m, attr)}"
        for m in field.metadata
        for kind, attr, sign in _BOUNDS
        if isinstance(m, kind) and getattr(m, attr) != MAX_INT
    ]


def _rule(field: FieldInfo) -> str:
    return ". ".join(filter(None, [", ".join(_bounds(field)), field.description]))


def hyperparameter_table() -> str:
    """The GRPO hyperparameters as a markdown table (name | default | rule), from the model's fields.

    Returns:
        `str`: the table, as the docs' spec reference page holds it.
    """
    rows = [
        [name, cell(json.dumps(field.default)), cell(_rule(field))]
        for name, field in Hyperparameters.model_fields.items()
    ]
    return table(["name", "default", "rule"], rows)


# --- every section of the spec


def sections(
    model: type[BaseModel] = JobSpec, path: str = "", found: dict | None = None
) -> dict[str, type[BaseModel]]:
    """Each section of the spec by its dotted path (`""` for the top level, `rewards[]` for a list's entries, ...),
    in the order a spec file reads, each model once (the first path that reaches it)."""
    found = {} if found is None else found
    found[path] = model
    for name, field in model.model_fields.items():
        for leaf, in_list in _models(field.annotation):
            if leaf not in found.values():
                sections(leaf, (f"{path}.{name}" if path else name) + ("[]" if in_list else ""), found)
    return found


def _models(annotation: Any, in_list: bool = False) -> list[tuple[type[BaseModel], bool]]:
    """The pydantic models inside a field's type, each with whether it sits in a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, in_list)]
    return [m for arg in get_args(annotation) for m in _models(arg, in_list or get_origin(annotation) is list)]


def anchor(path: str) -> str:
    """The heading id of section `path` on the spec page."""
    return (path or "top-level").replace("[]", "").replace(".", "-")


def type_name(annotation: Any, paths: dict[type, str]) -> str:
    """A field's type as a reader writes it in YAML terms: `int`, `str | null`, `list[str]`, a section's link."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_name(args[0], paths)
    if origin in (Union, types.UnionType):
        return " \\| ".join(dict.fromkeys(type_name(a, paths) for a in args))
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin is list:
        return f"list[{type_name(args[0], paths)}]"
    if origin is dict or annotation is dict:
        return "mapping"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if annotation in paths:
        return f"[{annotation.model_config.get('title') or paths[annotation]}](#{anchor(paths[annotation])})"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if isinstance(field.default, BaseModel):
        return "its defaults"
    return cell(json.dumps(field.default))


def _trl_names(section: str, model: type[BaseModel]) -> dict[str, list[str]]:
    """Each field of `section` with the trl.GRPOConfig fields it sets."""
    if model is Hyperparameters:
        return {name: [*m.names, *m.also] if m else [] for name, m in trl_markers(model).items()}
    names: dict[str, list[str]] = {}
    for trl_name, key in SECTION_TRL_KEYS.items():
        key = key.split(" ", 1)[0]  # "evaluation.every (the score before ...)": the key alone
        owner, _, field = key.rpartition(".")
        if owner.replace("[]", "") == section.replace("[]", "") and field in model.model_fields:
            names.setdefault(field, []).append(trl_name)
    return names


def section_table(path: str, model: type[BaseModel], paths: dict[type, str]) -> str:
    """One section's fields as a markdown table: field | type | default | rule | TRL name."""
    trl = _trl_names(path, model)
    rows = []
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        trl_cell = ", ".join(f"`{n}`" for n in trl.get(name, [])) or "—"
        rows.append([f"`{key}`", type_name(field.annotation, paths), _default(field), cell(_rule(field)), trl_cell])
    return table(["field", "type", "default", "rule", "TRL name"], rows)


def spec_reference() -> str:
    """The docs' spec page (markdown): every section of the job spec, each a table of its fields.

    Returns:
        `str`: the page, headed by its title.
    """
    found = sections()
    paths = {model: path for path, model in found.items()}
    parts = [
        "# Job spec reference",
        "Every field of a job spec, section by section, generated from the pydantic models "
        "(`core/spec/models.py`: each field's description is its one written copy, the text the Prefect form "
        "shows). *Rule* is what `grpoflow validate` enforces on the field (bounds, then the description, which "
        "names the rules across fields). *TRL name* is the `trl.GRPOConfig` field the value becomes; any other "
        "GRPOConfig field goes in the `trl:` mapping, as TRL names it.",
    ]
    for path, model in found.items():
        title = f"`{path}`" if path else "Top level"
        parts += [
            f"## {title} {{#{anchor(path)}}}",
            " ".join(model.__doc__.split()),
            section_table(path, model, paths),
        ]
    return "\n\n".join(parts) + "\n"
