"""Held-out rollouts of a job with `tools:` or `environment:`: each held-out prompt completed multi-turn with the job's
own tools and environment, as training generates its rollouts (TRL's `GRPOTrainer(tools=..., environment_factory=)`).

Step by step what TRL 1.16's trainer does (`_generate_and_score_completions`, `_tool_call_loop`):

- each rollout gets its own environment instance, `reset(**row)` with the prompt's dataset row (text it returns is
  appended to the last user message), and its methods are tools beside the spec's `tools:`;
- the prompt is rendered with those tools by the chat template TRL renders tool rollouts with
  (`grpoflow.trainers.agents.rollout_chat_template`), and each model turn parsed by TRL's own
  `trl.chat_template_utils.parse_response`;
- each tool call is run (an error, or an unknown tool, becomes the answer `{'error': ...}`), the answers are appended
  as tokens after the turn (the chat template's tool turn and the next generation prompt), and the model goes on,
  until a turn without a call, `trl.max_tool_calling_iterations` tool turns, or the rollout's token budget
  (`evaluation.max_new_tokens`, the whole rollout with the tools' answers, as `max_response_length` is in training):
  answers that would not fit end the rollout before them, as TRL drops them.

A rollout is its list of messages after the prompt (assistant turns, with `tool_calls`, and the tools' answers), the
form rewards see in training. TRL's loop is a private method that runs on the trainer's own state (its batch, its
per-rollout tool tables), which held-out evaluation outside training (before/after) has none of: these are its steps on
TRL's public parser, and `tests/trainers/test_agents.py` checks them on the example trained for real.
"""

import asyncio
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any

from grpoflow.core.spec import JobSpec
from grpoflow.core.spec.rules import function_name
from grpoflow.trainers.agents import agent_args, environment_tools, rollout_chat_template, tool_tokenizer


@dataclass
class Rollout:
    """One held-out rollout: its prompt (after the environment's reset), tools, token ids and messages so far."""

    prompt: list
    tools: list
    environment: Any = None
    prompt_ids: list = field(default_factory=list)
    completion_ids: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    calls: list = field(default_factory=list)  # the tool calls of the last turn, still to run


def is_multi_turn(spec: JobSpec) -> bool:
    """Whether the job's rollouts are multi-turn: it has `tools:` or an `environment:`."""
    return bool(spec.tools) or spec.environment is not None


def environment_name(spec: JobSpec) -> str | None:
    """The environment's name as training's metrics give it (`rewards/<name>/mean`): its factory's; None without one.
    `evaluation.metric` naming it scores the held-out rollouts by its `get_reward()`."""
    return function_name(spec.environment) if spec.environment else None


def tool_rollouts(model, tokenizer, prompts: list, rows: list[dict], spec: JobSpec, sampling: dict) -> list[Rollout]:
    """The held-out `prompts` (one rollout each) completed multi-turn with the job's tools and environment.

    Args:
        model: a loaded causal LM (in eval mode; the caller seeds sampling).
        tokenizer: its tokenizer; builtin:tiny's gets its tool-calling template (`tool_tokenizer`).
        prompts (`list`): chats, one per rollout (a prompt with several samples is here that many times).
        rows (`list[dict]`): each rollout's dataset row, what the environment is reset with.
        spec (`JobSpec`): the job's spec (tools, environment, `trl.max_tool_calling_iterations`,
            `evaluation.max_new_tokens`).
        sampling (`dict`): `generate` keyword arguments (greedy, or sampled).
    """
    from trl.chat_template_utils import parse_response

    agents = agent_args(spec)
    tokenizer = tool_tokenizer(tokenizer, spec.base_model)
    template = rollout_chat_template(tokenizer)
    budget = spec.evaluation.max_new_tokens
    limit = spec.trl.get("max_tool_calling_iterations")
    limit = sys.maxsize if limit is None else limit  # TRL's default: no limit
    positions = getattr(model.config, "max_position_embeddings", None) or sys.maxsize
    rollouts = [start_rollout(p, row, agents, tokenizer, template) for p, row in zip(prompts, rows, strict=True)]
    active, turns = list(rollouts), 0
    while active:
        for rollout, ids in zip(active, _generate(model, tokenizer, active, budget, sampling), strict=True):
            prefix = rollout.prompt_ids + rollout.completion_ids
            message = parse_response(tokenizer, ids, prefix=prefix, tools=rollout.tools) if ids else {}
            rollout.completion_ids += ids
            if message:
                rollout.messages.append(message)
            rollout.calls = message.get("tool_calls") or []
        if turns >= limit:
            break
        active = [r for r in active if r.calls and _answer(r, tokenizer, template, budget, positions)]
        turns += 1
    return rollouts


def start_rollout(prompt: list, row: dict, agents: dict, tokenizer, template: str | None) -> Rollout:
    """A rollout's environment built and reset with its row, its tools and its prompt's token ids."""
    environment, tools = None, list(agents.get("tools") or [])
    if (factory := agents.get("environment_factory")) is not None:
        environment = factory()
        observation = environment.reset(**row)
        if observation is not None:
            prompt = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + observation}]
        tools += environment_tools(environment)
    options = {"tools": tools or None, "chat_template": template, "tokenize": True, "return_dict": True}
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **options)["input_ids"]
    return Rollout(prompt, tools, environment, list(prompt_ids))


def _generate(model, tokenizer, rollouts: list[Rollout], budget: int, sampling: dict, batch_size: int = 64) -> list:
    """Each rollout's next turn: the tokens generated after its ids so far, through the end-of-turn token, within
    what is left of its budget."""
    import torch

    stops = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    turns = []
    for i in range(0, len(rollouts), batch_size):
        batch = [r.prompt_ids + r.completion_ids for r in rollouts[i : i + batch_size]]
        width = max(map(len, batch))
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=model.device)
        left = [budget - len(r.completion_ids) for r in rollouts[i : i + batch_size]]
        if max(left) <= 0:  # tool answers that filled the budget exactly: nothing more to generate
            turns += [[] for _ in batch]
            continue
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, max_new_tokens=max(left), pad_token_id=pad, **sampling
        )
        for tokens, room in zip(out[:, width:].tolist(), left, strict=True):
            end = next((k + 1 for k, t in enumerate(tokens) if t in stops), len(tokens))
            turns.append(tokens[: min(end, room)])
    return turns


def _answer(rollout: Rollout, tokenizer, template: str | None, budget: int, positions: int) -> bool:
    """Runs the rollout's tool calls and appends their answers, as messages and as the tokens that follow the turn;
    False (nothing appended) when they would not fit in the budget or the model's positions: the rollout ends."""
    run = _run(rollout)
    answers = [{"role": "tool", "name": name, "content": content} for name, content in map(run, rollout.calls)]
    suffix = tool_suffix_ids(tokenizer, template, answers)
    length = len(rollout.completion_ids) + len(suffix)
    if length > budget or len(rollout.prompt_ids) + length >= positions:
        return False
    rollout.messages += answers
    rollout.completion_ids += suffix
    return True


def _run(rollout: Rollout):
    """A function running one tool call of `rollout` as TRL does: (tool name, its answer as text, or the error)."""
    table = {tool.__name__: tool for tool in rollout.tools}

    def run(call: dict) -> tuple[str, Any]:
        function = call.get("function") or {}
        name = function.get("name", call.get("name", "unknown"))
        if call.get("type") != "function":
            return name, str({"error": f"Unsupported tool call type: {call.get('type')}"})
        try:
            if name not in table:
                raise ValueError(f"Tool {name} not found.")
            result = table[name](**(function.get("arguments") or {}))
            result = asyncio.run(result) if inspect.iscoroutine(result) else result
        except Exception as e:  # the model's call or the tool failed: the model reads the error, as in training
            result = {"error": str(e)}
        return name, result if isinstance(result, list) else str(result)

    return run


def tool_suffix_ids(tokenizer, template: str | None, answers: list[dict]) -> list[int]:
    """The tokens after an assistant turn that called tools: the tools' answers and the next generation prompt, cut
    from a rendered dummy conversation at its end-of-turn token, as TRL's trainer cuts them."""
    call = [{"type": "function", "function": {"name": answers[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
    options = {"tokenize": True, "chat_template": template, "return_dict": False}
    prefix = tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **options)
    full = tokenizer.apply_chat_template(dummy + answers, add_generation_prompt=True, **options)
    ends = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if ends:
        prefix = prefix[: ends[-1] + 1]
    return list(full[len(prefix) :])
