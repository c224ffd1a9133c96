"""The job spec: pydantic models of a grpoflow job and its GRPO hyperparameters, and the loader that checks them.

- `models.py`: the models and field types (each field's description is its one documented copy);
- `rules.py`: the cross-field rules, which read their defaults from the models;
- `loading.py`: YAML in (hardened), `--set` overrides, shape caps, errors as "dotted.location: message" lines,
  `load_spec`, and the resolved spec out (`resolved_dict`, `to_yaml`);
- `docs.py`: the hyperparameter table (`python -m grpoflow.core.spec` prints it) and the docs' spec page,
  every field of every section (`spec_reference`).

A rejected spec raises `SpecError`, which lists every violation at once.
"""

from grpoflow.core.spec.docs import hyperparameter_table
from grpoflow.core.spec.fields import (
    ENV_NAME_PATTERN,
    FUNCTION_PATTERN,
    MAX_INT,
    MAX_SEED,
    REPO_ID_PATTERN,
    SLUG_PATTERN,
)
from grpoflow.core.spec.hyperparameters import Hyperparameters
from grpoflow.core.spec.loading import (
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    MAX_SPEC_VALUES,
    SpecError,
    apply_overrides,
    load_spec,
    resolved_dict,
    to_yaml,
)
from grpoflow.core.spec.models import (
    BudgetSpec,
    DatasetSpec,
    DeploySpec,
    EvaluationSpec,
    HealthSpec,
    JobSpec,
    PublishSpec,
    RewardSpec,
    SFTSpec,
    WebhookSpec,
)
from grpoflow.core.spec.rules import LIGER_UNSUPPORTED, model_family, rule_problems

__all__ = [
    "ENV_NAME_PATTERN",
    "FUNCTION_PATTERN",
    "LIGER_UNSUPPORTED",
    "MAX_INT",
    "MAX_SEED",
    "MAX_SPEC_BYTES",
    "MAX_SPEC_DEPTH",
    "MAX_SPEC_VALUES",
    "REPO_ID_PATTERN",
    "SLUG_PATTERN",
    "DatasetSpec",
    "DeploySpec",
    "EvaluationSpec",
    "BudgetSpec",
    "HealthSpec",
    "Hyperparameters",
    "JobSpec",
    "PublishSpec",
    "RewardSpec",
    "SFTSpec",
    "SpecError",
    "WebhookSpec",
    "apply_overrides",
    "hyperparameter_table",
    "load_spec",
    "model_family",
    "resolved_dict",
    "rule_problems",
    "to_yaml",
]
