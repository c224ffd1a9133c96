"""Agents and tools: the spec's `tools:` and `environment:` imported as TRL's `GRPOTrainer` takes them.

`tools` are `package.module:function` references, each a typed function with a Google-style docstring (its JSON schema
is what the model sees, built by transformers' `get_json_schema`). `environment` is a `package.module:Factory`
reference, TRL's `environment_factory`: a callable returning an object with `reset(**row)` (called with each dataset
row before its rollout; it may return text appended to the last user message), public methods that become the
rollout's tools, and optionally `get_reward()`, a number scored per rollout beside the spec's rewards (logged as
rewards/<class name>/mean). The rollout ends when the model answers without a tool call, or after
`trl.max_tool_calling_iterations` tool turns.

Nothing here imports torch: preflight (jobs/preflight.py) runs `agent_problems` before any model loads.
"""

# transformers' and TRL's chat-template helpers are imported where they are used: `grpoflow validate` imports this
# module.
import importlib
import importlib.util
import inspect
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The chat templates whose tool calls TRL 1.16 can parse (`trl.chat_template_utils.add_response_schema`), by their file
# in trl/chat_templates/; tests/trainers/test_agents.py checks each against TRL itself.
PARSEABLE_TEMPLATES = (
    "qwen2_5",
    "qwen3",
    "qwen3_instruct_2507",
    "qwen3_vl",
    "qwen3_5_nothink",
    "qwen3_5_think",
    "qwen3_6",
    "qwen3_8",
    "llama3_1",
    "llama3_2",
    "glm4moe",
    "gptoss",
    "deepseek_r1_distill",
    "lfm2_v2",
    "lfm2_2_5",
    "lfm2_2_5_v2",
    "lfm2_2_5_vl",
    "gemma4",
    "gemma4_v2",
    "gemma4_v3",
    "gemma4_v4",
    "gemma4_v5",
    "nemotron_3_nano",
    "nemotron_3_super",
    "nemotron_3_ultra",
    "nemotron_3_5_lightning",
)
# builtin:tiny is a Qwen2 with Qwen's chat tokens: for tool rollouts it gets
# grpoflow.trainers.model.tiny.TOOL_CHAT_TEMPLATE, whose tool calls are Qwen's, parsed with the response template TRL
# gives Qwen2.5/Qwen3 (trl.chat_template_utils).
TINY_RESPONSE_TEMPLATE = "qwen3_template"
# Methods of an environment that TRL does not expose as tools.
ENVIRONMENT_HOOKS = ("reset", "get_reward")


class AgentError(ValueError):
    """A `tools:` or `environment:` entry that cannot be used; the message names the spec field."""


def import_ref(ref: str, where: str) -> Any:
    """Imports `package.module:name` and returns the object; `AgentError` naming `where` when it cannot."""
    module_name, _, name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module: any error in it is theirs
        raise AgentError(f"{where}: cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    if not hasattr(module, name):
        raise AgentError(f"{where}: module {module_name!r} has no {name!r}")
    return getattr(module, name)


def tool_schema(function: Callable, where: str) -> dict:
    """The JSON schema the model sees for `function` (transformers' `get_json_schema`), or `AgentError` saying what
    the function lacks (a docstring, a type hint, an argument's description)."""
    try:
        return _json_schema(function)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException
        raise AgentError(
            f"{where}: {getattr(function, '__name__', function)!r} is not usable as a tool: {e} (a tool needs type "
            "hints on every argument and a Google-style docstring with an Args: line for each)"
        ) from None


def _json_schema(function: Callable) -> dict:
    from transformers.utils import chat_template_utils

    return chat_template_utils.get_json_schema(function)


def load_tools(refs: list[str]) -> list[Callable]:
    """The spec's `tools:` imported, each checked to be a function with a schema."""
    tools = []
    for i, ref in enumerate(refs):
        where = f"tools[{i}]"
        tool = import_ref(ref, where)
        if not callable(tool):
            raise AgentError(f"{where}: {ref!r} is a {type(tool).__name__}, not a function")
        tool_schema(tool, where)
        tools.append(tool)
    return tools


def load_environment(ref: str | None) -> Callable | None:
    """The spec's `environment:` factory imported (None when unset); `AgentError` when it is not callable."""
    if ref is None:
        return None
    factory = import_ref(ref, "environment")
    if not callable(factory):
        raise AgentError(f"environment: {ref!r} is a {type(factory).__name__}, not a class or function")
    return factory


def environment_tools(instance: Any) -> list[Callable]:
    """The environment's methods TRL exposes as tools: the public functions of its class, but reset and get_reward."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in ENVIRONMENT_HOOKS and not name.startswith("_")
    ]


def environment_problems(factory: Callable, row: dict) -> list[str]:
    """The environment's dry run on one dataset row, as TRL drives it: the factory builds an instance, which has a
    `reset`; each tool method has a schema; `reset(**row)` returns None or text; `get_reward()`, when defined,
    returns a finite number. Returns one line per problem, each starting with "environment:"."""
    try:
        instance = factory()
    except Exception as e:
        return [f"environment: calling the factory failed ({type(e).__name__}: {e})"]
    kind = type(instance).__name__
    if not callable(getattr(instance, "reset", None)):
        return [f"environment: the factory's {kind} has no reset method (TRL calls reset(**row) before each rollout)"]
    problems = []
    for method in environment_tools(instance):
        try:
            tool_schema(method, f"environment: {kind}.{method.__name__}")
        except AgentError as e:
            problems.append(str(e))
    try:
        observation = instance.reset(**row)
    except Exception as e:
        return [*problems, f"environment: {kind}.reset(**row) failed on a dataset row ({type(e).__name__}: {e})"]
    if observation is not None and not isinstance(observation, str):
        problems.append(
            f"environment: {kind}.reset returned a {type(observation).__name__}; it must return None or text "
            "(appended to the prompt's last user message)"
        )
    if callable(getattr(instance, "get_reward", None)) and (problem := _reward_problem(instance, kind)):
        problems.append(problem)
    return problems


def _reward_problem(instance: Any, kind: str) -> str | None:
    if inspect.iscoroutinefunction(instance.get_reward):
        return None  # awaited on TRL's event loop; calling it here would need one
    try:
        reward = instance.get_reward()
    except Exception as e:
        return f"environment: {kind}.get_reward() failed after reset ({type(e).__name__}: {e})"
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return f"environment: {kind}.get_reward() returned {reward!r}; it must return a finite number"
    return None


# --- chat templates -------------------------------------------------------------------------------------------------


def trl_template(name: str) -> str:
    """The text of TRL's chat template `name` (trl/chat_templates/NAME.jinja), read without importing TRL."""
    spec = importlib.util.find_spec("trl")
    return (Path(spec.submodule_search_locations[0]) / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def tool_template_problem(chat_template: str | None, model_id: str, response_template: bool = False) -> str | None:
    """Why TRL cannot run tool rollouts through `chat_template`, or None: it must render a tool-calling conversation
    (TRL's `supports_tool_calling`), and TRL must know how to parse its tool calls (a template it recognises, unless
    the tokenizer carries its own `response_template`)."""
    from grpoflow.trainers.model.tiny import CHAT_TEMPLATE

    if chat_template == CHAT_TEMPLATE:
        return None  # builtin:tiny: tool_tokenizer gives it TOOL_CHAT_TEMPLATE
    fix = "use a tool-calling chat model (Qwen2.5/Qwen3 or Llama 3.1 Instruct, ...)"
    if not chat_template:
        return f"base_model: the tokenizer of {model_id} has no chat template, so it cannot render tools; {fix}"
    if not renders_tool_calls(chat_template):
        return (
            f"base_model: the chat template of {model_id} cannot render a tool call and its result (user -> assistant "
            f"with tool_calls -> tool), which tools and environment need; {fix}"
        )
    if not response_template and chat_template not in {trl_template(name) for name in PARSEABLE_TEMPLATES}:
        return (
            f"base_model: TRL cannot parse tool calls in the chat template of {model_id} (it knows those of "
            f"{', '.join(sorted({n.split('_')[0] for n in PARSEABLE_TEMPLATES}))}); {fix}, or set a response_template "
            "on its tokenizer"
        )
    return None


def renders_tool_calls(chat_template: str) -> bool:
    """TRL's `supports_tool_calling` on the template text, rendered by transformers' own `render_jinja_template`
    (which needs no torch): the tool call's name and arguments and the tool's answer all appear."""
    from transformers.utils.chat_template_utils import render_jinja_template

    name, key, value, content = "tool_name_a8f3e2b1", "tool_arg_key_b9d4f5c2", "tool_arg_val_d6e7a9f3", "tool_c4f9a8e2"
    call = {"type": "function", "function": {"name": name, "arguments": {key: value}}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": name, "content": content},
    ]
    try:
        rendered, _ = render_jinja_template([messages], chat_template=chat_template)
    except Exception:  # the template refuses the roles, or indexes content as a list
        return False
    return all(s in rendered[0] for s in (name, key, value, content))


def tool_tokenizer(tokenizer, model_id: str):
    """The tokenizer ready for TRL's tool rollouts: builtin:tiny's template becomes its tool-calling one, with the
    response template TRL parses its calls by (both saved with the trained model, so it keeps calling tools the same
    way); any other template TRL cannot use is a `SetupError`."""
    from grpoflow.core.errors import SetupError
    from grpoflow.trainers.model.tiny import CHAT_TEMPLATE, TOOL_CHAT_TEMPLATE

    if tokenizer.chat_template == CHAT_TEMPLATE:
        from trl import chat_template_utils

        tokenizer.chat_template = TOOL_CHAT_TEMPLATE
        tokenizer.response_template = getattr(chat_template_utils, TINY_RESPONSE_TEMPLATE)
    has_parser = getattr(tokenizer, "response_template", None) is not None
    if problem := tool_template_problem(tokenizer.chat_template, model_id, has_parser):
        raise SetupError(problem)
    return tokenizer


def agent_args(spec) -> dict:
    """`GRPOTrainer` keyword arguments for the spec's `tools:` and `environment:` (empty when neither is set), or a
    `SetupError` naming the entry that cannot be imported."""
    from grpoflow.core.errors import SetupError

    if not spec.tools and spec.environment is None:
        return {}
    try:
        return {"tools": load_tools(spec.tools), "environment_factory": load_environment(spec.environment)}
    except AgentError as e:
        raise SetupError(str(e)) from None


# --- the SFT warm-up's conversations, rendered as the GRPO rollout will see them ----------------------------------


def rollout_tools(tools: list[Callable], environment_factory: Callable | None) -> list[Callable]:
    """The tools whose schemas TRL renders into each rollout's prompt, in its order: the spec's `tools:`, then the
    public methods of one environment instance (`GRPOTrainer` probes one the same way)."""
    listed = list(tools)
    if environment_factory is not None:
        listed += [method for method in environment_tools(environment_factory()) if method not in listed]
    return listed


def rollout_chat_template(tokenizer) -> str | None:
    """The chat template GRPOTrainer renders tool rollouts with: None (the tokenizer's own) when it preserves prefixes,
    else TRL's training variant of it, as `GRPOTrainer.__init__` picks it."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


def completion_messages(value: Any, where: str) -> list[dict]:
    """An SFT target for a tool job as chat messages: text is one assistant answer; a list holds the rollout after the
    prompt (assistant turns, with `tool_calls`, and the `tool` answers between them). Tool-call arguments may be a
    JSON string (OpenAI's format) or an object (keys a columnar file filled with null are dropped). `AgentError`
    naming `where` when the value is neither."""
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    if not isinstance(value, list) or not value:
        raise AgentError(f"{where}: must be text or a non-empty list of messages, not {type(value).__name__}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ("assistant", "tool"):
            role = message.get("role") if isinstance(message, dict) else type(message).__name__
            raise AgentError(f"{where}[{i}]: role {role!r}; a completion holds assistant and tool messages only")
        message = {k: v for k, v in message.items() if v is not None}
        message.setdefault("content", "")
        if message.get("tool_calls"):
            message["tool_calls"] = [
                _tool_call(call, f"{where}[{i}].tool_calls[{j}]") for j, call in enumerate(message["tool_calls"])
            ]
        else:
            message.pop("tool_calls", None)
        messages.append(message)
    if messages[0]["role"] != "assistant" or messages[-1]["role"] != "assistant":
        raise AgentError(f"{where}: must start and end with an assistant message (the model's turns)")
    return messages


def _tool_call(call: Any, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise AgentError(
            f"{where}: a tool call is {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}"
        )
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            raise AgentError(f"{where}: arguments {arguments!r} are not JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise AgentError(f"{where}: arguments must be an object (or its JSON), not {type(arguments).__name__}")
    arguments = {k: v for k, v in arguments.items() if v is not None}
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}


def rollout_ids(
    tokenizer, prompt: list[dict], completion: list[dict], tools: list[Callable], chat_template: str | None = None
) -> dict:
    """One SFT row for a tool job, token for token as TRL's GRPO rollout builds it: the prompt rendered with the
    tools' schemas and the generation prompt, then per assistant turn the tokens the model generates (up to and with
    its end-of-turn token: the loss is on these) and, between turns, the tool answers and the next generation prompt
    (context: labels -100, like the rollout's tool_mask 0). `chat_template` is the one GRPOTrainer renders with when
    it replaces the tokenizer's (`rollout_chat_template`). Returns `input_ids` and `labels`."""
    options = {"tools": tools or None, "chat_template": chat_template}

    def render(messages, generation_prompt):
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **options
        )

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    messages = [*prompt, *completion]
    text = render(prompt, True)
    input_ids = tokenizer.apply_chat_template(
        prompt, add_generation_prompt=True, tokenize=True, return_dict=True, **options
    )["input_ids"]
    labels = [-100] * len(input_ids)
    eos = tokenizer.eos_token
    for k in range(len(prompt), len(messages)):
        if messages[k]["role"] != "assistant":
            continue
        before, through = render(messages[:k], True), render(messages[: k + 1], False)
        if not before.startswith(text) or not through.startswith(before):
            raise AgentError(
                "sft.completion_column: the chat template renders a conversation differently from its beginning, so "
                "the warm-up cannot rebuild the rollout turn by turn"
            )
        context = ids(before[len(text) :])
        turn = through[len(before) :]
        if eos and eos in turn:  # generation stops at the end-of-turn token; what follows is the next turn's context
            turn = turn[: turn.index(eos) + len(eos)]
        generated = ids(turn)
        input_ids += context + generated
        labels += [-100] * len(context) + generated
        text = before + turn
    return {"input_ids": input_ids, "labels": labels}


def sft_completion_problems(rows: list[dict], column: str) -> tuple[list[str], list[str]]:
    """The SFT warm-up's targets of a tool job checked on sampled rows: each is text or a conversation that
    `completion_messages` reads (problems); when none calls a tool, the warm-up would teach the model to answer
    without its tools (a warning). Returns (problems, warnings), each line naming sft.completion_column."""
    problems, calls = [], 0
    for i, row in enumerate(rows):
        try:
            messages = completion_messages(row.get(column), f"sft.completion_column: row {i} of {column!r}")
        except AgentError as e:
            problems.append(str(e))
            continue
        calls += sum(bool(m.get("tool_calls")) for m in messages)
    if problems or calls or not rows:
        return problems, []
    return [], [
        f"sft.completion_column: none of {len(rows)} sampled completions of {column!r} calls a tool, so the warm-up "
        "teaches the model to answer without its tools; give conversations (assistant turns with tool_calls, the "
        "tool answers between them), e.g. examples/data/make_lockers.py"
    ]
