"""The building blocks of the job spec's models: the section base (`Section`, `extra="forbid"`), the patterns and
annotated types its fields share (URLs, names, paths), and the checks on them that need no other field."""

import re
from typing import Annotated, Any, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from grpoflow.core.uris import (
    ALLOW_LINK_LOCAL_ENV,
    credentials_instead,
    link_local_address,
    url_credentials,
)

SLUG_PATTERN = r"^[a-z0-9][a-z0-9-_.]{0,62}$"
# Spelled without \w so that the UI's JavaScript check and Python's agree (ASCII only).
FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# An inspect-ai task as its own CLI names one, FILE.py@TASK: a Python file (no "@" in its path) and a task's name.
SUITE_PATTERN = r"^[^@]+\.py@[A-Za-z_][A-Za-z0-9_]*$"
# The Hub's rules for each half of owner/name: 1-96 of [A-Za-z0-9_.-], no "--" or "..", no "-" or "." at either end.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_ID_PATTERN = rf"^(?!.*(?:--|\.\.)){_HUB_PART}/{_HUB_PART}$"
# A Kubernetes object name (RFC 1123 subdomain), as a PersistentVolumeClaim's or a ClusterTrainingRuntime's must be.
K8S_NAME_PATTERN = r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_INT = 2**31 - 1  # every integer field (steps, lengths, counts) fits an int32 wherever it ends up
MAX_SEED = 2**32 - 1  # numpy's range, which transformers.set_seed enforces only once training starts
# Sampling is greedy in effect well above this already; from ~1e-38 down, a float32 logit divided by it is inf.
MIN_TEMPERATURE = 1e-3
# A URL with `user:password@` in its authority, as `url_credentials` finds it (a scheme, "://", then "@" before the
# first "/", "?" or "#"), spelled so that JSON schema's (ECMA) and Python's regular expressions read it alike.
CREDENTIALS_IN_URL = r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@"
# What Prefect's server answers a run whose URL holds credentials: jsonschema says "'<this>' was expected".
CREDENTIALS_REFUSED = (
    "a URL without user:password@ (credentials go in the worker's environment or a Prefect Secret block, never in "
    "a spec)"
)


class Section(BaseModel):
    # inf and NaN are YAML floats (.inf, .nan) that no field means; rejecting them here covers every float field.
    # A refused value may be a secret: pydantic's own error text (a traceback's, a log's) leaves it out.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, hide_input_in_errors=True)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1: `--set hyperparameters.max_steps=true` would train one step.
        if isinstance(value, bool) and not _accepts_bool(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("bool_not_number", "must be a number, not true or false")
        return value


def _no_credentials(value: str | None) -> str | None:
    """Refuses a URL holding a credential (`s3://KEY:SECRET@bucket`, `?token=`): the spec is stored in spec.yaml,
    Prefect's database, events and logs. The message never repeats the URL."""
    if value is not None and (where := url_credentials(value)):
        raise PydanticCustomError(
            "url_credentials",
            "holds credentials ({where}): a spec is stored in spec.yaml, Prefect's database, events and logs; "
            "give them as {instead}",
            {"where": where, "instead": credentials_instead(value)},
        )
    return value


# `_no_credentials`' `user:password@` check in the JSON schema, which Prefect's server applies to a deployment's
# parameters before it stores a run (`enforce_parameter_schema`). An `if`/`then` with a `const`, not a `pattern`:
# jsonschema's pattern and `not` messages repeat the value, and the server sends that message back. A mapping, not a
# function: Prefect's flow parameter schemas compose a field's `json_schema_extra` only when it is one.
REFUSED_IN_FORM = {"if": {"type": "string", "pattern": CREDENTIALS_IN_URL}, "then": {"const": CREDENTIALS_REFUSED}}


def not_link_local(value: str, what: str) -> None:
    """Refuses an endpoint on a link-local or cloud-metadata address unless the operator allows it."""
    if why := link_local_address(value):
        raise ValueError(
            f"{why}: refused as {what}, since a spec could send the machine's own credentials there; the operator "
            f"allows it with {ALLOW_LINK_LOCAL_ENV}=1 in the work pool's environment"
        )


def no_form_default(schema: dict) -> None:
    """Leaves a field's default out of its JSON schema (the Prefect form), not out of the model."""
    schema.pop("default", None)


def _accepts_bool(annotation: Any) -> bool:
    """Whether a field of type `annotation` means true/false (a bool in it), or takes no numbers at all."""
    kinds = set(_leaf_types(annotation))
    return bool in kinds or not kinds & {int, float}


def _leaf_types(annotation: Any) -> list:
    args = get_args(annotation)
    if not args:
        return [annotation]
    return [leaf for arg in args for leaf in _leaf_types(arg)]


def _matching(pattern: str, hint: str) -> Any:
    """A string type checked against `pattern`, failing with `hint`; the pattern also goes into the JSON schema."""

    def check(value: str) -> str:
        # fullmatch: with re.match, "$" would also accept a trailing newline.
        if not re.fullmatch(pattern, value):
            raise ValueError(hint)
        return value

    return Annotated[str, AfterValidator(check), Field(json_schema_extra={"pattern": pattern})]


# Integer fields: the bound turns a typo like 1e30 into an error at submit time rather than an overflow later.
Int = Annotated[int, Field(le=MAX_INT)]
# A path or URL that must hold no credentials: the model refuses them, and so does the deployments' parameter schema.
Url = Annotated[str, AfterValidator(_no_credentials), Field(json_schema_extra=REFUSED_IN_FORM)]
OptionalUrl = Annotated[str | None, AfterValidator(_no_credentials), Field(json_schema_extra=REFUSED_IN_FORM)]
Slug = _matching(
    SLUG_PATTERN, "must be 1-63 lowercase letters, digits, '-', '_' or '.', starting with one of the first two"
)
FunctionRef = _matching(FUNCTION_PATTERN, "must be 'package.module:callable' (a dotted module path, a colon, a name)")
SuiteRef = _matching(SUITE_PATTERN, "must be 'FILE.py@TASK' (a Python file, '@', the name of a task in it)")
EnvName = _matching(ENV_NAME_PATTERN, "must be an environment variable name (letters, digits, '_'; no leading digit)")
RepoId = _matching(
    REPO_ID_PATTERN,
    "must be 'owner/name', each 1-96 letters, digits, '-', '_' or '.', without '--' or '..', "
    "not starting or ending with '-' or '.'",
)
K8sName = _matching(
    K8S_NAME_PATTERN,
    "must be a Kubernetes object's name: up to 253 lowercase letters, digits, '-' or '.', starting and ending with a "
    "letter or digit (the name, not a path)",
)
