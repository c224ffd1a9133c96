# ruff: noqa: E501  (the table's rows cannot wrap; code lines keep to 119 through `ruff format`)
"""The private and undocumented library APIs grpoflow relies on: the one list of them, one test each.

`constraints.txt` keeps installs on the versions these ran on; an upgrade that removes or changes one of them fails
its test here, naming what grpoflow would have silently relied on. Places are given as `function` (module) because
code moves between modules; grep for the function name. What a library documents in its own API reference (Prefect's
SDK reference: `temporary_settings`, `url_for`, `TerminationSignal`, its settings and profiles.toml) is public and
not listed; each row here is a debt to pay off, and there are to be at most 12 of them.

| library | private / undocumented API | what grpoflow uses it for | where |
| --- | --- | --- | --- |
| trl | `GRPOTrainer._prepare_inputs(generation_batch)`, called once per `Trainer.training_step`, returning the batch with `advantages` | generate and score once, look at the advantages, hand the batch back to the parent's call | `ZeroVarianceSkippingGRPOTrainer` (trainers/zero_variance.py) |
| trl | TRL's logging buffers: `GRPOTrainer._metrics` (`{"train": defaultdict(list), "eval": ...}` averaged into each log record) and `GRPOTrainer._logs` (the latest generation's `prompt`, `completion`, `rewards[name]`, `advantages` and `log_extra` columns, all processes', for its completion logging) | the `skipped_zero_variance` and `step_time` metrics; the rollouts files (TRL's own rows, not recomputed) | `ZeroVarianceSkippingGRPOTrainer.training_step`; `logged_generation` (trainers/rollouts.py) |
| trl | `GRPOTrainer._step`, `_current_train_step_time`, `current_gradient_accumulation_steps` (the bookkeeping of `GRPOTrainer.training_step`) | a skipped step does the same bookkeeping | `ZeroVarianceSkippingGRPOTrainer.training_step` |
| trl | `GRPOTrainer._entropy_bonus_enabled`, `aux_loss_enabled`, `beta` | when the skip cannot be exact | `skip_blocker` (trainers/zero_variance.py) |
| trl | the keyword arguments `GRPOTrainer._calculate_rewards` passes a reward, and the `log_extra(column, values)` / `log_metric(name, value)` hooks | rewards' dataset columns, the dry run and held-out evaluation call rewards the same way | `TRL_ARGUMENTS` (trainers/rewards/__init__.py), `reward_columns` (trainers/rewards/build.py), `call_reward` (trainers/rewards/dry_run.py), `evaluate` (trainers/evaluate.py) |
| transformers | `Trainer._save_checkpoint(model, trial)`, writing `trainer_state.json` last, `global_step` = the folder's number | a checkpoint without a complete trainer_state.json is torn; the benchmark times `_save_checkpoint` | `intact_checkpoint` (trainers/grpo.py), `train_cpu_seconds` (benchmarks/trainer_vs_trl.py) |
| transformers | `Trainer._load_from_checkpoint(path)` and `TrainerState.load_from_json`; `Trainer.train` resuming at `max_steps` runs one step more | a child killed after its final checkpoint restores it instead of training past max_steps | `restore_final_checkpoint` (trainers/grpo.py) |
| prefect | `prefect.events.worker.EventsWorker.drain_all(timeout=)`, `prefect.logging.handlers.APILogWorker.drain_all(timeout=)` | flush logs and events before the temporary server stops | `drain_workers` (integrations/prefect_server.py) |
| accelerate, trl | `--config_file trl/accelerate_configs/{fsdp2,zero2,zero3}.yaml` (files TRL ships, found without importing TRL) and `Accelerator.distributed_type` / `is_fsdp2` / `state.deepspeed_plugin.zero_stage` | the sharded strategies' launch, and the check of what really runs | `accelerate_config`, `child_command` (jobs/launch.py), `applied_strategy` (trainers/grpo.py) |
| trl | `GRPOTrainer.reward_func_names`, the list its metrics are named from (`rewards/<name>/mean`) | a reward model's metric carries the spec's name, not its path | `main` (trainers/grpo.py) |
| trl | `trl/chat_templates/*.jinja`, the templates TRL can parse tool calls from | a tool run's template, read without importing TRL | `trl_template` (trainers/agents.py) |
| trl | `trl.chat_template_utils.qwen3_template` (the response schema TRL attaches to Qwen2.5/Qwen3 tokenizers), `is_chat_template_prefix_preserving`, `get_training_chat_template`, `parse_response(tokenizer, ids, prefix, tools)` | builtin:tiny's compact tool template parses calls with Qwen's schema; the SFT warm-up renders rollouts with the template GRPOTrainer renders them with; held-out rollouts parse the model's turns as GRPOTrainer does | `tool_tokenizer`, `rollout_chat_template` (trainers/agents.py), `tool_rollouts` (trainers/multi_turn.py) |
"""

import inspect
import json
from collections import defaultdict

import pytest
from datasets import Dataset

# --- TRL and transformers: one real one-step GRPO run on the built-in tiny model ------------------------------------

DATASET_COLUMNS = {"answer"}


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    """A one-step `GRPOTrainer` run, recording what grpoflow's subclass and rewards would see."""
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpoflow.trainers.model.tiny import resolve_model_path

    seen = {"reward_kwargs": [], "prepared": [], "save_calls": 0, "at_step_end": None}

    def recording_reward(completions, **kwargs):
        seen["reward_kwargs"].append(kwargs)
        return [float(i) for i in range(len(completions))]  # distinct rewards: non-zero advantages

    class Probe(GRPOTrainer):
        # Overridden by name, as grpoflow's subclass does: a renamed method is never called, and the lists stay empty.
        def _prepare_inputs(self, generation_batch):
            prepared = super()._prepare_inputs(generation_batch)
            seen["prepared"].append(prepared)
            return prepared

        def _save_checkpoint(self, model, trial):
            seen["save_calls"] += 1
            return super()._save_checkpoint(model, trial)

    class AtStepEnd(TrainerCallback):
        # After training_step and the optimizer step, before `log` averages and clears `_metrics`.
        def on_step_end(self, args, state, control, **kwargs):
            seen["at_step_end"] = {
                "_step": trainer._step,
                "_current_train_step_time": trainer._current_train_step_time,
                "step_time": list(trainer._metrics["train"]["step_time"]),
                "current_gradient_accumulation_steps": trainer.current_gradient_accumulation_steps,
            }

    output = tmp_path_factory.mktemp("one_step")
    args = GRPOConfig(
        output_dir=str(output),
        max_steps=1,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=4,
        seed=7,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        report_to="none",
        disable_tqdm=True,
    )
    dataset = Dataset.from_list([{"prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(4)])
    trainer = Probe(
        model=resolve_model_path("builtin:tiny"),
        reward_funcs=recording_reward,
        args=args,
        train_dataset=dataset,
        callbacks=[AtStepEnd()],
    )
    untrained = {
        "_metrics": trainer._metrics,
        "_entropy_bonus_enabled": trainer._entropy_bonus_enabled,
        "aux_loss_enabled": trainer.aux_loss_enabled,
        "beta": trainer.beta,
    }
    trainer.train()
    return trainer, seen, untrained, output


def test_prepare_inputs_is_called_once_per_training_step_and_returns_the_advantages(one_step):
    from trl import GRPOTrainer

    trainer, seen, _, _ = one_step
    # grpoflow overrides it with this exact signature and calls it itself before the parent's training_step.
    assert list(inspect.signature(GRPOTrainer._prepare_inputs).parameters) == ["self", "generation_batch"]
    assert list(inspect.signature(GRPOTrainer.training_step).parameters) == [
        "self",
        "model",
        "inputs",
        "num_items_in_batch",
    ]
    assert len(seen["prepared"]) == trainer.state.global_step == 1
    advantages = seen["prepared"][0]["advantages"]
    assert advantages.shape == (4,) and advantages.abs().sum() > 0


def test_metrics_is_a_dict_of_lists_by_mode_averaged_into_the_log(one_step):
    trainer, _, untrained, _ = one_step
    metrics = untrained["_metrics"]
    assert set(metrics) == {"train", "eval"}
    assert all(isinstance(m, defaultdict) and m.default_factory is list for m in metrics.values())
    # What grpoflow appends, `log` must average into the record that metrics.jsonl gets.
    trainer.model.train()
    trainer._metrics["train"]["grpoflow_probe"].extend([1.0, 3.0])
    trainer.log({})
    assert trainer.state.log_history[-1]["grpoflow_probe"] == 2.0
    assert not trainer._metrics["train"], "log clears the metrics it averaged"


def test_logs_hold_the_latest_generation_as_the_rollouts_read_it(one_step):
    trainer, seen, _, _ = one_step
    logs = trainer._logs  # what `grpoflow.trainers.rollouts.logged_generation` copies at each logged step
    assert {"prompt", "completion", "rewards", "advantages", "extra"} <= logs.keys()
    assert len(logs["prompt"]) == len(logs["completion"]) == len(logs["advantages"]) == 4  # one step's group
    assert list(logs["rewards"]) == trainer.reward_func_names == ["recording_reward"]
    assert list(logs["rewards"]["recording_reward"]) == [0.0, 1.0, 2.0, 3.0]  # in the order the reward scored them
    # TRL's own advantages, row for row with the rewards (the batch it trains on is the same, shuffled).
    assert sorted(logs["advantages"]) == pytest.approx(sorted(seen["prepared"][0]["advantages"].tolist()))
    assert list(logs["advantages"]) == sorted(logs["advantages"])  # rewards 0, 1, 2, 3: advantages rise with them
    # A reward's `log_extra` column lands there too, one value per completion (the probe's completion_tokens).
    trainer._log_completion_extra("completion_tokens", [1, 2, 3, 4])
    assert trainer._pending_extra_logs["completion_tokens"] == [1, 2, 3, 4]


def test_training_step_bookkeeping_that_a_skipped_step_repeats(one_step):
    _, seen, _, _ = one_step
    at_end = seen["at_step_end"]
    assert at_end is not None
    assert at_end["_step"] == 1
    assert at_end["current_gradient_accumulation_steps"] == 1
    # One optimizer step: its time went into `step_time` and the running total was reset.
    assert len(at_end["step_time"]) == 1 and at_end["step_time"][0] > 0
    assert at_end["_current_train_step_time"] == 0.0


def test_the_flags_skip_blocker_reads(one_step, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from grpoflow.trainers.model.tiny import resolve_model_path

    _, _, untrained, _ = one_step
    assert untrained["_entropy_bonus_enabled"] is False
    assert untrained["aux_loss_enabled"] is False  # Qwen2 has no router
    assert untrained["beta"] == 0.0
    args = GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=4,
        per_device_train_batch_size=4,
        entropy_coef=0.1,
        bf16=False,
        report_to="none",
    )
    dataset = Dataset.from_list([{"prompt": "p"}] * 4)
    with_bonus = GRPOTrainer(
        model=resolve_model_path("builtin:tiny"),
        reward_funcs=lambda completions, **kw: [0.0],
        args=args,
        train_dataset=dataset,
    )
    assert with_bonus._entropy_bonus_enabled is True


def test_reward_keyword_arguments_are_those_grpoflow_passes_outside_a_trainer(one_step):
    from trl import GRPOTrainer

    trainer, seen, _, _ = one_step
    kwargs = seen["reward_kwargs"][0]
    # `call_reward` and `TRL_ARGUMENTS` (trainers/rewards/): these, plus every dataset column but the prompt.
    # (`environments` too, only with an environment factory.)
    assert set(kwargs) - DATASET_COLUMNS == {"prompts", "completion_ids", "trainer_state", "log_extra", "log_metric"}
    # A dataset column, one value per completion: the group's prompt's answer, four times.
    assert (
        len(kwargs["answer"]) == 4 and len(set(kwargs["answer"])) == 1 and kwargs["answer"][0] in {"0", "2", "4", "6"}
    )
    assert kwargs["trainer_state"] is trainer.state
    assert list(inspect.signature(GRPOTrainer._log_completion_extra).parameters) == ["self", "column", "values"]
    assert list(inspect.signature(GRPOTrainer._log_metric).parameters) == ["self", "name", "value"]
    assert "rewards/recording_reward/mean" in trainer.state.log_history[0]  # named after `__name__`


def test_checkpoint_is_saved_by_save_checkpoint_and_trainer_state_is_written_last(one_step):
    _, seen, _, output = one_step
    assert seen["save_calls"] == 1
    checkpoint = output / "checkpoint-1"
    state_file = checkpoint / "trainer_state.json"
    assert json.loads(state_file.read_text())["global_step"] == 1
    others = [p for p in checkpoint.rglob("*") if p.is_file() and p != state_file]
    assert others, "the checkpoint holds weights and optimizer state besides trainer_state.json"
    last_other = max(p.stat().st_mtime_ns for p in others)
    assert state_file.stat().st_mtime_ns >= last_other, "a checkpoint killed mid-save must lack trainer_state.json"


# --- Prefect --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "import_path", ["prefect.events.worker:EventsWorker", "prefect.logging.handlers:APILogWorker"]
)
def test_queue_workers_drain_all(import_path):
    import importlib

    module, name = import_path.split(":")
    worker = getattr(importlib.import_module(module), name)
    assert "timeout" in inspect.signature(worker.drain_all).parameters
    worker.drain_all(timeout=0.5)  # nothing queued: returns at once


# --- accelerate, standardwebhooks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["fsdp2", "zero2", "zero3"])
def test_trl_ships_the_accelerate_configs_grpoflow_launches_with(strategy):
    import yaml

    from grpoflow.jobs.launch import accelerate_config

    config = yaml.safe_load(accelerate_config(strategy).read_text())
    if strategy == "fsdp2":
        assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2
    else:
        assert config["distributed_type"] == "DEEPSPEED"
        assert config["deepspeed_config"]["zero_stage"] == int(strategy[-1])


def test_accelerator_tells_the_strategy_it_runs():
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    assert {"NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"} <= set(DistributedType.__members__)
    assert isinstance(Accelerator.is_fsdp2, property)


def test_reward_func_names_name_the_reward_metrics():
    import trl.trainer.grpo_trainer as grpo_trainer

    source = inspect.getsource(grpo_trainer.GRPOTrainer)
    assert "self.reward_func_names" in source and 'f"rewards/{reward_func_name}/mean"' in source


# --- transformers: restoring the final checkpoint --------------------------------------------------------------------


def test_trainer_load_from_checkpoint_and_state(tmp_path):
    from transformers import AutoModelForCausalLM, Trainer, TrainerState

    from grpoflow.trainers.model.tiny import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin:tiny"))
    assert "resume_from_checkpoint" in inspect.signature(Trainer._load_from_checkpoint).parameters
    checkpoint = tmp_path / "checkpoint-3"
    model.save_pretrained(checkpoint)
    TrainerState(global_step=3, max_steps=3).save_to_json(str(checkpoint / "trainer_state.json"))
    assert TrainerState.load_from_json(str(checkpoint / "trainer_state.json")).global_step == 3


def test_trl_qwen_response_template_and_training_template_helpers():
    # That the schema parses builtin:tiny's calls is test_builtin_tiny_tool_calls_parse_as_trl_reads_them
    # (tests/trainers/test_agents.py); here, that TRL still has the names.
    from trl import chat_template_utils

    assert isinstance(chat_template_utils.qwen3_template, dict) and chat_template_utils.qwen3_template
    assert callable(chat_template_utils.is_chat_template_prefix_preserving)
    assert callable(chat_template_utils.get_training_chat_template)
    assert list(inspect.signature(chat_template_utils.parse_response).parameters) == [
        "tokenizer",
        "ids",
        "prefix",
        "tools",
    ]


def test_the_table_holds_at_most_twelve_debts():
    rows = [line for line in __doc__.splitlines() if line.startswith("| ") and not line.startswith("| library")]
    rows = [row for row in rows if not row.startswith("| ---")]
    assert 0 < len(rows) <= 12, f"{len(rows)} private APIs listed: pay one off before adding another"
