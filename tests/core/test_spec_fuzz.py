"""Fuzzing the spec loader: whatever the input, `load_spec` accepts it or raises `SpecError`, never anything else.

An accepted spec must also survive what the job folder does with it: `to_yaml` writes spec.yaml, and loading that file
again (as `grpoflow run --resume` does) gives the same spec.
"""

import copy
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from grpoflow.core.spec import JobSpec, SpecError, load_spec, to_yaml

BASE = {
    "name": "fuzz",
    "base_model": "builtin:tiny",
    "dataset": {"uri": "data.jsonl"},
    "rewards": [{"name": "exact_answer"}],
}
# Where the spec's mappings are (list items by index), and the keys valid at each.
SECTIONS = {
    "": JobSpec,
    "hyperparameters": JobSpec.model_fields["hyperparameters"].annotation,
    "dataset": JobSpec.model_fields["dataset"].annotation,
    "sft": JobSpec.model_fields["sft"].annotation,
    "evaluation": JobSpec.model_fields["evaluation"].annotation,
    "rewards.0": JobSpec.model_fields["rewards"].annotation.__args__[0],
    "publish": JobSpec.model_fields["publish"].annotation.__args__[0],
    "deploy": JobSpec.model_fields["deploy"].annotation.__args__[0],
    "webhooks.0": JobSpec.model_fields["webhooks"].annotation.__args__[0],
}
assert all(isinstance(model, type) and issubclass(model, BaseModel) for model in SECTIONS.values())
KNOWN_PATHS = [f"{section}.{key}".lstrip(".") for section, model in SECTIONS.items() for key in model.model_fields]
SETTINGS = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ----------------------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    # Values the fields take, and their near misses.
    st.sampled_from(["builtin:tiny", "exact_answer", "length_penalty", "1e-5", "1e5", "o/m", "../x", "a/b", "merged"]),
    st.sampled_from(["https://example.com/h", "s3://bucket/runs", "ftp://x/y", "pkg.mod:fn", "NAME", "", " ", "\n"]),
)
keys = st.one_of(st.sampled_from(sorted({p.rsplit(".", 1)[-1] for p in KNOWN_PATHS})), st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.one_of(keys, st.integers(0, 3)), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def spec_dicts(draw) -> dict:
    """BASE with a few keys set (known keys at their place, or random ones), replaced or dropped."""
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(0, 6))):
        section = draw(st.sampled_from(list(SECTIONS)))
        key = draw(st.one_of(st.sampled_from(list(SECTIONS[section].model_fields)), keys))
        node = _section(data, section)
        if node is None:
            continue
        if draw(st.integers(0, 9)) == 0:
            node.pop(key, None)
        else:
            node[key] = draw(values)
    return data


def _section(data: dict, section: str) -> dict | None:
    node = data
    for part in filter(None, section.split(".")):
        if isinstance(node, list):
            node = node[0] if node and isinstance(node[0], dict) else None
        elif isinstance(node, dict):
            node = node.setdefault(part, [{}] if part in ("rewards", "webhooks") else {})
        if not isinstance(node, dict | list):
            return None
    return node if isinstance(node, dict) else None


override_paths = st.one_of(
    st.sampled_from(KNOWN_PATHS),
    st.sampled_from(["rewards[0].weight", "rewards.1.name", "rewards.x.name", "rewards.².weight", "name.x", "a..b"]),
    st.text(alphabet=string.ascii_lowercase + "._[]0123456789²", max_size=20),
)
override_values = st.one_of(
    st.text(max_size=15),
    scalars.map(lambda v: yaml.safe_dump(v, default_flow_style=True).removesuffix("\n...\n").strip()),
    values.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()),
)
overrides = st.lists(
    st.one_of(st.builds(lambda p, v: f"{p}={v}", override_paths, override_values), st.text(max_size=20)), max_size=3
)


@st.composite
def yaml_texts(draw) -> str:
    """A spec as YAML (block or flow style), or free text, with a few characters inserted or deleted."""
    kind = draw(st.sampled_from(["block", "flow", "text"]))
    if kind == "text":
        return draw(st.text(max_size=200))
    text = yaml.safe_dump(draw(spec_dicts()), default_flow_style=kind == "flow", sort_keys=False)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = (
                text[:at]
                + draw(st.sampled_from(list(":-[]{}&*!|>'\"#%@`,?\t\n ") + ["*a", "&a ", "<<: "]))
                + text[at:]
            )
        else:
            text = text[:at] + text[at + 1 :]
    return text


# --- the property --------------------------------------------------------------------------------------------------


def accepts_or_rejects(source, sets: list[str], folder) -> None:
    try:
        spec, warnings = load_spec(source, sets)
    except SpecError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
        return
    assert isinstance(spec, JobSpec) and all(isinstance(w, str) for w in warnings)
    saved = folder / "spec.yaml"
    saved.write_text(to_yaml(spec))
    again, _ = load_spec(saved)
    assert to_yaml(again) == to_yaml(spec)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@SETTINGS
@given(data=spec_dicts(), sets=overrides)
def test_spec_dicts(folder, data, sets):
    accepts_or_rejects(data, sets, folder)


@SETTINGS
@given(text=yaml_texts(), sets=overrides)
def test_yaml_files(folder, text, sets):
    path = folder / "fuzzed.yaml"
    path.write_text(text)
    accepts_or_rejects(path, sets, folder)


# Free-text fields, and strings that YAML 1.1 (or the loader's short-float rule) would read as something else unless
# spec.yaml quotes them.
TEXT_FIELDS = [
    "name",
    "base_model",
    "dataset.uri",
    "dataset.prompt_column",
    "output_uri",
    "hyperparameters.system_prompt",
]
LOOKALIKES = ["1e5", "2e-3", "1_000", "0x1F", "0o17", "12:30", "yes", "off", "null", "~", ".inf", "2024-01-01", "+1"]


@SETTINGS
@given(field=st.sampled_from(TEXT_FIELDS), text=st.one_of(st.sampled_from(LOOKALIKES), st.text(max_size=20)))
def test_text_fields(folder, field, text):
    data = copy.deepcopy(BASE)
    section, _, key = field.rpartition(".")
    (data.setdefault(section, {}) if section else data)[key] = text
    accepts_or_rejects(data, [], folder)


def test_fuzzing_reaches_both_outcomes():
    # The strategies must reach acceptance as well as rejection, or the round trip above is never exercised.
    outcomes = set()

    @settings(max_examples=100, deadline=None, database=None)
    @given(data=spec_dicts())
    def collect(data):
        try:
            load_spec(data)
            outcomes.add("accepted")
        except SpecError:
            outcomes.add("rejected")

    collect()
    assert outcomes == {"accepted", "rejected"}
