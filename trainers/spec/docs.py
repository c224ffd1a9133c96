"""The README's GRPO hyperparameter table, rendered from the `Hyperparameters` model (`python -m
grpoflow.trainers.spec`).

Each row is one field: its name, its default in YAML spelling, and its rule: the bounds pydantic enforces, then the
field's description (the text the Prefect form shows).
"""

import json

import annotated_types
from pydantic.fields import FieldInfo

from grpoflow.trainers.spec.markdown import cell, table
from grpoflow.trainers.spec.models import MAX_INT, Hyperparameters

_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="), (annotated_types.Le, "le", "<="))


def _bounds(field: FieldInfo) -> list[str]:
    # MAX_INT caps every integer field against typos like 1e30; it is no rule of the hyperparameter's own.
    return [
        f"{sign} {getattr(m, attr)}"
        for m in field.metadata
        for kind, attr, sign in _BOUNDS
        if isinstance(m, kind) and getattr(m, attr) != MAX_INT
    ]


def hyperparameter_table() -> str:
    """The GRPO hyperparameters as a markdown table (name | default | rule), from the model's fields.

    Returns:
        `str`: the table, as README.md's section "The job spec" holds it.
    """
    rows = []
    for name, field in Hyperparameters.model_fields.items():
        rule = ". ".join(filter(None, [", ".join(_bounds(field)), field.description]))
        rows.append([name, cell(json.dumps(field.default)), cell(rule)])
    return table(["name", "default", "rule"], rows)
