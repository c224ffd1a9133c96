"""Agents and tools (`trainers.agents`): the spec's `tools:` and `environment:` checked before any model load (rules,
preflight's dry run), builtin:tiny's tool-calling template parsed as TRL parses it, and the example
(examples/agents.yaml) trained for real with TRL's tool loop and the environment's reward."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from examples.agents import Locker, calculator
from trainers import grpo
from trainers.agents import (
    PARSEABLE_TEMPLATES,
    AgentError,
    agent_args,
    environment_problems,
    load_tools,
    tool_template_problem,
    trl_template,
)
from trainers.dataset import ingest_dataset
from trainers.jobdir import JobDir
from trainers.metrics import read_metrics
from trainers.modeling import SetupError, load_tokenizer
from trainers.preflight import preflight
from trainers.spec import SpecError, load_spec, to_yaml
from trainers.tiny import CHAT_TEMPLATE, build_tiny

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agents.yaml"
ROW = {"prompt": [{"role": "user", "content": "Open locker 1."}], "note": "The code is 1+2.", "code": "3"}


def example(tmp_path: Path, **changes) -> dict:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["dataset"]["uri"] = str(ROOT / data["dataset"]["uri"])
    data["output_uri"] = str(tmp_path / "runs")
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    return data


# --- tools and environments, as TRL will call them ------------------------------------------------------------------


def no_docstring(x: int) -> int:
    return x


def no_hints(x):
    """Doubles.

    Args:
        x: a number.
    """
    return 2 * x


class NoReset:
    def act(self) -> str:
        """Acts."""
        return ""


class BadReward(Locker):
    def get_reward(self) -> float:
        """Not a number."""
        return "high"


class BrokenReset(Locker):
    def reset(self, **row) -> None:
        raise KeyError("seed")


class Unschemed(Locker):
    def shout(self, text):
        return text


@pytest.mark.parametrize(
    "refs, message",
    [
        # A module that does not exist, and a name the module lacks: each names its entry.
        (["examples.no_such_module:f"], "tools[0]: cannot import 'examples.no_such_module'"),
        (["examples.agents:calculator", "examples.agents:nothing"], "tools[1]: module 'examples.agents' has no"),
        # Not a function.
        (["examples.agents:_OPERATORS"], "tools[0]: 'examples.agents:_OPERATORS' is a dict, not a function"),
        # No docstring, no type hints: transformers cannot build the schema the model would see.
        ([f"{__name__}:no_docstring"], "tools[0]: 'no_docstring' is not usable as a tool"),
        ([f"{__name__}:no_hints"], "tools[0]: 'no_hints' is not usable as a tool"),
    ],
)
def test_bad_tools_name_their_entry(refs, message):
    with pytest.raises(AgentError) as caught:
        load_tools(refs)
    assert message in str(caught.value)


def test_good_tools_load():
    assert load_tools(["examples.agents:calculator"]) == [calculator]


@pytest.mark.parametrize(
    "factory, message",
    [
        (Locker, None),  # resets, its tools have schemas, get_reward is 0.0 before any call
        (NoReset, "environment: the factory's NoReset has no reset method"),
        (BadReward, "environment: BadReward.get_reward() returned 'high'; it must return a finite number"),
        (BrokenReset, "environment: BrokenReset.reset(**row) failed on a dataset row (KeyError: 'seed')"),
        (Unschemed, "environment: Unschemed.shout: 'shout' is not usable as a tool"),
        (lambda: 1 / 0, "environment: calling the factory failed (ZeroDivisionError"),
    ],
)
def test_environment_dry_run(factory, message):
    problems = environment_problems(factory, dict(ROW))
    assert problems == [] if message is None else any(message in p for p in problems), problems


def test_template_checks():
    # builtin:tiny's own template is swapped for Qwen2.5's; TRL's Qwen2.5 template passes; one that drops tool
    # calls (Phi-3's) and one TRL cannot parse are refused, naming base_model.
    assert tool_template_problem(CHAT_TEMPLATE, "builtin:tiny") is None
    assert tool_template_problem(trl_template("qwen2_5"), "m") is None
    assert "cannot render a tool call" in tool_template_problem(trl_template("phi3"), "m")
    assert "TRL cannot parse tool calls" in tool_template_problem("{{ messages }}", "m")
    assert tool_template_problem("{{ messages }}", "m", response_template=True) is None


def test_parseable_templates_are_trls():
    # The list preflight reads (without importing TRL) is the one TRL's add_response_schema knows.
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    tokenizer = AutoTokenizer.from_pretrained(build_tiny())
    for name in PARSEABLE_TEMPLATES:
        tokenizer.chat_template = trl_template(name)
        tokenizer.response_template = tokenizer.response_schema = None
        add_response_schema(tokenizer)  # raises on a template it does not know
        assert tokenizer.response_template is not None, name


# --- the spec and its dry run ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"tools": ["examples.agents:calculator"] * 2}, "tools[1]: 'examples.agents:calculator' is listed twice"),
        ({"tools": ["calculator"]}, "tools[0]: must be 'package.module:callable'"),
        ({"hyperparameters": {"use_unsloth": True}}, "hyperparameters.use_unsloth: not supported with tools"),
        (
            {"tools": [], "environment": None, "sft": {"enabled": False}},
            "trl.max_tool_calling_iterations: applies only with tools or environment",
        ),
    ],
)
def test_spec_rules(tmp_path, changes, message):
    with pytest.raises(SpecError) as caught:
        load_spec(example(tmp_path, **changes))
    assert message in str(caught.value)


def test_example_passes_preflight(tmp_path):
    spec, _ = load_spec(example(tmp_path))
    assert spec.tools == ["examples.agents:calculator"] and spec.environment == "examples.agents:Locker"
    assert preflight(spec) == []


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"environment": "examples.agents:calculator"}, "environment: calling the factory failed"),
        ({"environment": f"{__name__}:NoReset"}, "environment: the factory's NoReset has no reset method"),
        ({"tools": ["examples.agents:nothing"]}, "tools[0]: module 'examples.agents' has no 'nothing'"),
    ],
)
def test_preflight_rejects(tmp_path, changes, message):
    spec, _ = load_spec(example(tmp_path, **changes))
    problems = preflight(spec)
    assert any(message.split(" failed")[0] in p for p in problems), problems


def test_preflight_needs_chat_prompts(tmp_path):
    rows = tmp_path / "text.jsonl"
    rows.write_text(json.dumps({"prompt": "Open locker 1.", "note": "The code is 1+2.", "code": "3"}) + "\n")
    spec, _ = load_spec(example(tmp_path, dataset={"uri": str(rows)}, sft={"enabled": False}))
    assert any(p.startswith("dataset.prompt_column: tools and environment need chat prompts") for p in preflight(spec))


def test_preflight_imports_no_torch(tmp_path):
    code = (
        "import sys; from trainers.preflight import preflight; from trainers.spec import load_spec; "
        f"assert preflight(load_spec({example(tmp_path)!r})[0]) == []; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- what the trainer gets ------------------------------------------------------------------------------------------


def test_agent_args(tmp_path):
    spec, _ = load_spec(example(tmp_path))
    assert agent_args(spec) == {"tools": [calculator], "environment_factory": Locker}
    data = example(tmp_path, tools=[], environment=None)
    del data["trl"]
    assert agent_args(load_spec(data)[0]) == {}


def test_a_template_that_cannot_call_tools_is_a_setup_error(tmp_path):
    from trainers.agents import tool_tokenizer

    tokenizer = load_tokenizer(str(build_tiny()))
    tokenizer.chat_template = trl_template("phi3")
    with pytest.raises(SetupError, match="base_model: the chat template of m cannot render a tool call"):
        tool_tokenizer(tokenizer, "m")


def test_builtin_tiny_tool_calls_parse_as_trl_reads_them():
    # The template builtin:tiny gets for tool rollouts renders the tools' schemas into the prompt, and TRL parses a
    # completion in its format into the tool call that its loop then runs.
    from trl.chat_template_utils import add_response_schema, parse_response

    from trainers.agents import tool_tokenizer

    tokenizer = add_response_schema(tool_tokenizer(load_tokenizer(str(build_tiny())), "builtin:tiny"))
    locker = Locker()
    tools = [calculator, locker.read_note, locker.unlock]
    prompt = tokenizer.apply_chat_template(ROW["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)
    assert '"name": "read_note"' in prompt and '"name": "calculator"' in prompt
    prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    text = '<tool_call>\n{"name": "unlock", "arguments": {"code": "3"}}\n</tool_call><|im_end|>'
    message = parse_response(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"], prefix, tools)
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "unlock", "arguments": {"code": "3"}}
    locker.reset(**ROW)
    assert locker.unlock(**call["function"]["arguments"]) == "unlocked" and locker.get_reward() == 1.0


@pytest.mark.slow
def test_example_trains_with_tools_and_environment(tmp_path):
    # The example as `grpoflow run` trains it: GRPO with the tools and the environment handed to TRL. builtin:tiny,
    # untrained, writes no tool call; what shows here is that TRL ran its tool loop (it logs tools/* only then) and
    # scored each rollout with the environment's get_reward beside the spec's reward.
    spec, _ = load_spec(example(tmp_path))
    job = JobDir(tmp_path / "runs" / "lockers-20261201-000000-abcdef")
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset, prompt_column="prompt", holdout=0, seed=spec.hyperparameters.seed)
    assert grpo.main(str(job.root)) == 0

    records = read_metrics(job.metrics)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        values = record["values"]
        assert {"tools/call_frequency", "tools/failure_frequency"} <= values.keys(), values
        assert {"rewards/Locker/mean", "rewards/tool_use_reward/mean"} <= values.keys(), values
        assert values["completions/mean_length"] > 0
    # The trained model keeps the tool-calling template it was trained with.
    template = job.merged / "chat_template.jinja"
    saved = (
        template.read_text()
        if template.is_file()
        else json.loads((job.merged / "tokenizer_config.json").read_text()).get("chat_template")
    )
    assert saved == trl_template("qwen2_5")
