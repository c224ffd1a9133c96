"""Agents and tools (`grpoflow.trainers.agents`): the spec's `tools:` and `environment:` checked before any model load
(rules, preflight's dry run), builtin:tiny's tool-calling template parsed as TRL parses it, and the example
(examples/agents.yaml) trained for real with TRL's tool loop and the environment's reward."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from datasets import load_from_disk

from grpoflow.core.errors import SetupError
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import SpecError, load_spec, to_yaml
from grpoflow.examples.agents import Locker, calculator, tool_use_reward
from grpoflow.jobs.preflight import preflight
from grpoflow.trainers import grpo, sft
from grpoflow.trainers.agents import (
    PARSEABLE_TEMPLATES,
    AgentError,
    agent_args,
    completion_messages,
    environment_problems,
    load_tools,
    rollout_chat_template,
    rollout_ids,
    rollout_tools,
    sft_completion_problems,
    tool_template_problem,
    tool_tokenizer,
    trl_template,
)
from grpoflow.trainers.dataset import ingest_dataset
from grpoflow.trainers.evaluate import score
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.load import load_tokenizer, prepare_prompts
from grpoflow.trainers.model.tiny import CHAT_TEMPLATE, TOOL_CHAT_TEMPLATE, build_tiny
from grpoflow.trainers.multi_turn import environment_name, is_multi_turn, start_rollout, tool_suffix_ids
from grpoflow.trainers.rollouts import as_text, read_rows, step_file

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
        (
            ["grpoflow.examples.agents:calculator", "grpoflow.examples.agents:nothing"],
            "tools[1]: module 'grpoflow.examples.agents' has no",
        ),
        # Not a function.
        (
            ["grpoflow.examples.agents:_OPERATORS"],
            "tools[0]: 'grpoflow.examples.agents:_OPERATORS' is a dict, not a function",
        ),
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
    assert load_tools(["grpoflow.examples.agents:calculator"]) == [calculator]


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
    # builtin:tiny's own template is swapped for its tool template (parsed with the response template it gets);
    # TRL's Qwen2.5 template passes; one that drops tool calls (Phi-3's) and one TRL cannot parse are refused, naming
    # base_model.
    assert tool_template_problem(CHAT_TEMPLATE, "builtin:tiny") is None
    assert tool_template_problem(TOOL_CHAT_TEMPLATE, "builtin:tiny", response_template=True) is None
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
        (
            {"tools": ["grpoflow.examples.agents:calculator"] * 2},
            "tools[1]: 'grpoflow.examples.agents:calculator' is listed twice",
        ),
        ({"tools": ["calculator"]}, "tools[0]: must be 'package.module:callable'"),
        ({"hyperparameters": {"use_unsloth": True}}, "hyperparameters.use_unsloth: not supported with tools"),
        (
            {"tools": [], "environment": None, "sft": {"enabled": False}},
            "trl.max_tool_calling_iterations: applies only with tools or environment",
        ),
        (  # the held-out metric may be the environment's get_reward(), by the name training logs it under
            {"evaluation": {"holdout": 8, "metric": "Lockers"}},
            "'Lockers' is not one of this spec's rewards: tool_use_reward (or the environment, Locker, or give",
        ),
    ],
)
def test_spec_rules(tmp_path, changes, message):
    with pytest.raises(SpecError) as caught:
        load_spec(example(tmp_path, **changes))
    assert message in str(caught.value)


def test_the_environment_can_be_the_held_out_metric(tmp_path):
    spec, _ = load_spec(example(tmp_path, evaluation={"holdout": 8, "metric": "Locker"}))
    assert spec.evaluation.metric_name == "Locker" and spec.evaluation_reward is None
    assert environment_name(spec) == "Locker" and is_multi_turn(spec)


def test_example_passes_preflight(tmp_path):
    spec, _ = load_spec(example(tmp_path))
    assert (
        spec.tools == ["grpoflow.examples.agents:calculator"] and spec.environment == "grpoflow.examples.agents:Locker"
    )
    assert preflight(spec) == []


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"environment": "grpoflow.examples.agents:calculator"}, "environment: calling the factory failed"),
        ({"environment": f"{__name__}:NoReset"}, "environment: the factory's NoReset has no reset method"),
        (
            {"tools": ["grpoflow.examples.agents:nothing"]},
            "tools[0]: module 'grpoflow.examples.agents' has no 'nothing'",
        ),
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


def test_preflight_of_a_tool_spec_in_a_fresh_process(tmp_path):
    # The tools' schemas come from transformers' get_json_schema as it is (it imports torch where torch is installed,
    # to map a Tensor hint): the preflight of a tool spec pays that import, a spec without tools does not.
    code = (
        "import sys; from grpoflow.jobs.preflight import preflight; from grpoflow.core.spec import load_spec; "
        f"assert preflight(load_spec({example(tmp_path)!r})[0]) == []"
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
    tokenizer = load_tokenizer(str(build_tiny()))
    tokenizer.chat_template = trl_template("phi3")
    with pytest.raises(SetupError, match="base_model: the chat template of m cannot render a tool call"):
        tool_tokenizer(tokenizer, "m")


def tiny_tool_tokenizer():
    return tool_tokenizer(load_tokenizer(str(build_tiny())), "builtin:tiny")


def test_builtin_tiny_tool_calls_parse_as_trl_reads_them():
    # The template builtin:tiny gets for tool rollouts lists the tools in the prompt, and TRL parses a completion in
    # its format into the tool call that its loop then runs.
    from trl.chat_template_utils import parse_response

    tokenizer = tiny_tool_tokenizer()
    locker = Locker()
    tools = [calculator, locker.read_note, locker.unlock]
    prompt = tokenizer.apply_chat_template(ROW["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\nTools: calculator(expression) read_note() unlock(code)<|im_end|>")
    prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    text = '<tool_call>\n{"name": "unlock", "arguments": {"code": "3"}}\n</tool_call><|im_end|>'
    message = parse_response(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"], prefix, tools)
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "unlock", "arguments": {"code": "3"}}
    locker.reset(**ROW)
    assert locker.unlock(**call["function"]["arguments"]) == "unlocked" and locker.get_reward() == 1.0


def test_builtin_tiny_tool_template_is_one_trl_can_train_on():
    # Without tools it renders as builtin:tiny's own template (a tool job's held-out evaluation, its other prompts);
    # TRL requires a multi-turn template to preserve prefixes and to render tool calls and results.
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    tokenizer = tiny_tool_tokenizer()
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "5"},
    ]
    for generation_prompt in (True, False):
        kwargs = {"tokenize": False, "add_generation_prompt": generation_prompt}
        plain = tokenizer.apply_chat_template(chat, chat_template=CHAT_TEMPLATE, **kwargs)
        assert tokenizer.apply_chat_template(chat, **kwargs) == plain
        assert tokenizer.apply_chat_template(chat[1:], **kwargs) == plain[plain.index("<|im_start|>user") :]
    assert is_chat_template_prefix_preserving(tokenizer) and supports_tool_calling(tokenizer)


# --- the SFT warm-up's conversations --------------------------------------------------------------------------------

CONVERSATION = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "read_note", "arguments": "{}"}}],
    },
    {"role": "tool", "name": "read_note", "content": "The code is 1+2."},
    {
        "role": "assistant",
        "content": None,
        "name": None,
        "tool_calls": [
            {"type": "function", "function": {"name": "unlock", "arguments": {"code": "3", "expression": None}}}
        ],
    },
    {"role": "tool", "name": "unlock", "content": "unlocked"},
    {"role": "assistant", "content": "It is open.", "tool_calls": None},
]


def test_completion_messages():
    # Text is one answer; a conversation's arguments are read from OpenAI's JSON string, and the nulls a columnar
    # file fills missing keys with are dropped.
    assert completion_messages("42", "c") == [{"role": "assistant", "content": "42"}]
    messages = completion_messages(CONVERSATION, "c")
    assert [m.get("tool_calls", [{}])[0].get("function") for m in messages[::2]] == [
        {"name": "read_note", "arguments": {}},
        {"name": "unlock", "arguments": {"code": "3"}},
        None,
    ]
    assert messages[2] == {"role": "assistant", "content": "", "tool_calls": messages[2]["tool_calls"]}
    assert messages[4] == {"role": "assistant", "content": "It is open."}


@pytest.mark.parametrize(
    "value, message",
    [
        (None, "c: must be text or a non-empty list of messages, not NoneType"),
        ([], "c: must be text or a non-empty list of messages"),
        ([{"role": "user", "content": "hi"}], "c[0]: role 'user'; a completion holds assistant and tool messages"),
        (CONVERSATION[:2], "c: must start and end with an assistant message"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}], "arguments '{' are"),
        ([{"role": "assistant", "tool_calls": [{"name": "f"}]}], "c[0].tool_calls[0]: a tool call is"),
    ],
)
def test_bad_completions_name_the_row(value, message):
    with pytest.raises(AgentError) as caught:
        completion_messages(value, "c")
    assert message in str(caught.value)


def test_sft_completion_checks():
    assert sft_completion_problems([{"completion": CONVERSATION}], "completion") == ([], [])
    problems, warnings = sft_completion_problems([{"completion": "42"}, {"completion": 3}], "completion")
    assert (
        problems
        == ["sft.completion_column: row 1 of 'completion': must be text or a non-empty list of messages, not int"]
        and warnings == []
    )
    problems, [warning] = sft_completion_problems([{"completion": "42"}], "completion")
    assert problems == [] and "none of 1 sampled completions of 'completion' calls a tool" in warning


@pytest.mark.parametrize("template", ["builtin:tiny", "qwen3"])
def test_sft_rows_are_the_rollout_token_for_token(tmp_path, template):
    # A warm-up row is what TRL's GRPO rollout builds for the same conversation: the prompt as GRPOTrainer tokenizes
    # it (with the same tools' schemas), each model turn, then the tool answers as its tool loop appends them
    # (_get_tool_suffix_ids); the loss covers exactly the tokens the rollout's tool_mask marks as the model's. Qwen3's
    # template drops earlier turns' reasoning, so it does not preserve prefixes: TRL renders with its training
    # variant, and so does the warm-up.
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import add_response_schema, parse_response

    tokenizer = tiny_tool_tokenizer()
    if template != "builtin:tiny":
        tokenizer.chat_template, tokenizer.response_template = trl_template(template), None
        add_response_schema(tokenizer)
    messages = completion_messages(CONVERSATION, "c")
    chat_template = rollout_chat_template(tokenizer)
    assert (chat_template is None) == (template == "builtin:tiny")
    row = rollout_ids(tokenizer, ROW["prompt"], messages, rollout_tools([calculator], Locker), chat_template)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        bf16=False,
        per_device_train_batch_size=2,
        num_generations=2,
        report_to="none",
        max_completion_length=64,
    )
    trainer = GRPOTrainer(
        model=str(build_tiny()),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config,
        train_dataset=Dataset.from_list([ROW] * 2),
        processing_class=tokenizer,
        tools=[calculator],
        environment_factory=Locker,
    )
    assert trainer.chat_template == chat_template
    trainer._batch_environments = [None]
    [prompt_ids], _, _ = trainer._tokenize_prompts([ROW["prompt"]])
    # A held-out rollout (trainers/multi_turn.py) starts from the same prompt tokens, with the same tools.
    agents = {"tools": [calculator], "environment_factory": Locker}
    held_out = start_rollout(ROW["prompt"], ROW, agents, tokenizer, chat_template)
    assert held_out.prompt_ids == list(prompt_ids)
    assert [t.__name__ for t in held_out.tools] == [t.__name__ for t in trainer.tools]
    expected, mask = list(prompt_ids), [0] * len(prompt_ids)
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            turn = tokenizer.apply_chat_template(
                [*ROW["prompt"], *messages[: i + 1]], tools=trainer.tools, chat_template=chat_template, tokenize=False
            )
            generated = tokenizer(
                turn[turn.rindex("<|im_start|>assistant\n") + 22 :].removesuffix("\n"), add_special_tokens=False
            )["input_ids"]
            parsed = parse_response(tokenizer, generated, prefix=expected, tools=trainer.tools)
            assert parsed.get("tool_calls") == message.get("tool_calls") and parsed["content"] == message["content"]
            expected, mask = expected + generated, mask + [1] * len(generated)
        elif messages[i - 1]["role"] == "assistant":
            suffix = trainer._get_tool_suffix_ids([m for m in messages[i:] if m["role"] == "tool"][:1])
            assert tool_suffix_ids(tokenizer, chat_template, [messages[i]]) == suffix  # and held-out rollouts'
            expected, mask = expected + suffix, mask + [0] * len(suffix)
    assert row["input_ids"] == expected
    assert row["labels"] == [t if m else -100 for t, m in zip(expected, mask, strict=True)]


def test_sft_warm_up_rows_of_the_example(tmp_path):
    # grpoflow.trainers.sft's rows for the example: every row is its whole rollout, the loss on the model's four turns;
    # a row whose completion cannot be read names itself.
    from datasets import Dataset

    from grpoflow.trainers.sft import tool_sft_dataset

    spec, _ = load_spec(example(tmp_path))
    rows = [json.loads(line) for line in (ROOT / "examples/data/lockers.jsonl").read_text().splitlines()[:3]]
    tokenizer = tiny_tool_tokenizer()
    dataset = tool_sft_dataset(Dataset.from_list(rows), spec, tokenizer, rollout_tools([calculator], Locker))
    assert dataset.column_names == ["input_ids", "labels"]
    for row, ids, labels in zip(rows, dataset["input_ids"], dataset["labels"], strict=True):
        learned = tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != -100])
        assert learned.count("<|im_end|>") == 4 and row["note"] not in learned  # the note is read_note's answer
        assert f'"expression": "{row["note"][12:-1]}"' in learned and f'"code": "{row["code"]}"' in learned
        assert len(ids) < 512  # builtin:tiny's positions
    rows[2]["completion"] = [{"role": "user", "content": "hi"}]
    with pytest.raises(AgentError, match="sft.completion_column: row 2 of 'completion'"):
        tool_sft_dataset(Dataset.from_list(rows), spec, tokenizer, [calculator])


def test_preflight_warns_when_no_sft_completion_calls_a_tool(tmp_path):
    rows = tmp_path / "answers.jsonl"
    rows.write_text(json.dumps({**ROW, "completion": "It is open."}) + "\n")
    warnings = []
    assert preflight(load_spec(example(tmp_path, dataset={"uri": str(rows)}))[0], warnings) == []
    assert any(w.startswith("sft.completion_column: none of 1 sampled completions") for w in warnings), warnings


ROLLOUTS = []  # (completion, note) for each rollout that recorded_tool_use scored


def recorded_tool_use(completions: list, note: list, **kwargs) -> list[float]:
    """grpoflow.examples.agents.tool_use_reward, recording what TRL passed it."""
    ROLLOUTS.extend(zip(completions, note, strict=True))
    return tool_use_reward(completions)


HELD_OUT = []  # (completion, note, environment) for each held-out rollout that read_note_answered scored


def tool_answered(completion: list, tool: str, answer: str) -> bool:
    """Whether `tool` ran in the rollout `completion` and answered `answer`."""
    return any(m["role"] == "tool" and m["name"] == tool and m["content"] == answer for m in completion)


def read_note_answered(completions: list, note: list, environments: list, **kwargs) -> list[float]:
    """A held-out metric: 1.0 when the rollout read the note and the tool answered with its row's note, recording
    what it was passed."""
    HELD_OUT.extend(zip(completions, note, environments, strict=True))
    return [float(tool_answered(c, "read_note", n)) for c, n in zip(completions, note, strict=True)]


@pytest.mark.slow
def test_example_calls_tools_after_the_warm_up(tmp_path):
    # The example as `grpoflow run` trains it, at its smallest (80 warm-up steps: after 60 no call parses yet, after
    # 80 the rollouts make ~2 calls each; one GRPO step): the SFT warm-up on the worked conversations, rendered
    # as the rollout will be, then GRPO with the tools and the environment handed to TRL. The warmed-up model writes
    # tool calls that TRL parses and runs (tools/call_frequency), and the tool's answer is fed back into the rollout:
    # read_note's answer is the row's own note, which only the environment, reset with that row, could give.
    # The held-out prompts are scored multi-turn too, during training (evaluation.every) and before/after, with the
    # same tools and a Locker reset with each held-out row.
    ROLLOUTS.clear()
    HELD_OUT.clear()
    rewards = [{"function": f"{__name__}:recorded_tool_use"}]
    evaluation = {"holdout": 2, "every": 1, "metric": {"function": f"{__name__}:read_note_answered"}}
    changes = {"sft": {"max_steps": 80}, "hyperparameters": {"max_steps": 1}, "evaluation": evaluation}
    spec, _ = load_spec(example(tmp_path, rewards=rewards, **changes))
    job = JobDir(tmp_path / "runs" / "lockers-20261201-000000-abcdef")
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset, prompt_column="prompt", holdout=2, seed=spec.hyperparameters.seed)
    assert sft.main(str(job.root)) == 0
    assert grpo.main(str(job.root)) == 0

    [record] = read_metrics(job.metrics)
    values = record["values"]
    assert values["tools/call_frequency"] > 0 and values["tools/failure_frequency"] < 1, values
    assert {"rewards/Locker/mean", "rewards/recorded_tool_use/mean"} <= values.keys(), values
    answered = [
        (completion, note)
        for completion, note in ROLLOUTS
        if [m["role"] for m in completion[:2]] == ["assistant", "tool"] and completion[1]["name"] == "read_note"
    ]
    assert answered and all(completion[1]["content"] == note for completion, note in answered), ROLLOUTS
    # The trained model keeps the tool-calling template, and the parser, it was trained with.
    tokenizer = load_tokenizer(str(job.merged))
    assert tokenizer.chat_template == TOOL_CHAT_TEMPLATE and tokenizer.response_template is not None

    # Held-out evaluation, multi-turn each time: at step 1 during training (evaluation.every), then before and after
    # (evaluation.json), on the 2 held-out rows. The model's calls ran, read_note answered each row's own note (only a
    # Locker reset with that row could give it), the metric scored from that answer, and the rollouts are kept whole.
    held_out = load_from_disk(str(job.dataset))["eval"]
    assert [n for _, n, _ in HELD_OUT] == list(held_out["note"]) * 3
    assert all(isinstance(env, Locker) and env.note == n for _, n, env in HELD_OUT)
    read = [c for c, n, _ in HELD_OUT if tool_answered(c, "read_note", n)]
    assert read and all(m["role"] in ("assistant", "tool") for c in read for m in c), HELD_OUT
    during, before, after = HELD_OUT[:2], HELD_OUT[2:4], HELD_OUT[4:]
    for step, scored in ((0, before), (1, after)):
        rows = read_rows(step_file(job.evaluation_rollouts, step))
        assert [r["completion"] for r in rows] == [as_text(c, chat_as_json=False) for c, _, _ in scored]
    means = [sum(tool_answered(c, "read_note", n) for c, n, _ in scored) / 2 for scored in (during, before, after)]
    result = json.loads(job.evaluation.read_text())
    assert [values["eval/read_note_answered"], result["before"], result["after"]] == pytest.approx(means)

    # Scored by the environment (metric: Locker): its get_reward() after each rollout, 1.0 only where the model called
    # unlock with the row's code (the call runs even when its answer no longer fits the rollout, as in training).
    locker = load_spec({**yaml.safe_load(job.spec.read_text()), "evaluation": {**evaluation, "metric": "Locker"}})[0]
    per_prompt = []
    score(str(job.merged), prepare_prompts(held_out, "prompt", None), locker, keep_at=(job, 9), per_prompt=per_prompt)
    kept = [r["completion"] for r in read_rows(step_file(job.evaluation_rollouts, 9))]
    calls = [
        [t["function"] for m in json.loads(c) for t in m.get("tool_calls") or []] if c[:2] == "[{" else []
        for c in kept
    ]
    unlocked = [
        {"name": "unlock", "arguments": {"code": code}} in called
        for called, code in zip(calls, held_out["code"], strict=True)
    ]
    assert set(per_prompt) <= {0.0, 1.0} and all(u for p, u in zip(per_prompt, unlocked, strict=True) if p), (
        per_prompt,
        kept,
    )
