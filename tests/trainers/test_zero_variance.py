"""ZeroVarianceSkippingGRPOTrainer: a step whose advantages are all 0 leaves parameters and optimizer state untouched;
a step with signal is computed exactly as by `trl.GRPOTrainer`."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict
from safetensors.torch import load_file
from trl import GRPOConfig, GRPOTrainer

from grpoflow.core.jobdir import JobDir, write_text_atomic
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.trainers.grpo import main as train_stage
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.tiny import resolve_model_path
from grpoflow.trainers.zero_variance import SKIPPED_METRIC, ZeroVarianceSkippingGRPOTrainer, grpo_trainer_class

STEPS = 3


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def ranked_reward(completions, **kwargs):
    # Distinct rewards within every group, whatever the completions: every step has signal.
    return [float(i) for i in range(len(completions))]


def signal_once_reward():
    """Signal at the first step only, then a constant: the case where TRL's Adam keeps moving on momentum."""
    calls = []

    def signal_once(completions, **kwargs):
        calls.append(1)
        return ranked_reward(completions) if len(calls) == 1 else constant_reward(completions)

    return signal_once


def make_trainer(cls, reward, tmp_path, **config):
    config = {"max_steps": STEPS, **config}
    args = GRPOConfig(
        output_dir=str(tmp_path / cls.__name__),
        learning_rate=1e-2,  # large, so that any update shows in the parameters
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=4,
        seed=7,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        **config,
    )
    dataset = Dataset.from_list([{"prompt": f"What is {i}+{i}?"} for i in range(8)])
    return cls(model=resolve_model_path("builtin:tiny"), reward_funcs=reward, args=args, train_dataset=dataset)


def parameters(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def step_logs(trainer) -> list[dict]:
    return [r for r in trainer.state.log_history if "reward" in r]


def test_all_zero_variance_run_leaves_parameters_and_optimizer_state_untouched(tmp_path):
    trainer = make_trainer(ZeroVarianceSkippingGRPOTrainer, constant_reward, tmp_path)
    before = parameters(trainer)
    trainer.train()
    assert_same(before, parameters(trainer))
    assert trainer.optimizer.state_dict()["state"] == {}  # Adam never stepped: no step count, no moments
    assert trainer.state.global_step == STEPS  # skipped steps still count toward max_steps
    assert trainer.lr_scheduler.last_epoch == STEPS  # and the schedule advances with them
    logs = step_logs(trainer)
    assert [r[SKIPPED_METRIC] for r in logs] == [1.0] * STEPS
    assert [r["reward"] for r in logs] == [1.0] * STEPS
    assert all(r["loss"] == 0.0 for r in logs)


@pytest.mark.slow
def test_parent_trainer_steps_adam_on_the_same_run(tmp_path):
    # The contrast the option exists for: TRL runs the optimizer on the zero gradient and counts Adam steps.
    trainer = make_trainer(GRPOTrainer, constant_reward, tmp_path)
    trainer.train()
    steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {STEPS}


@pytest.mark.slow
def test_skipped_steps_drop_the_momentum_only_updates_trl_makes(tmp_path):
    skipping = make_trainer(ZeroVarianceSkippingGRPOTrainer, signal_once_reward(), tmp_path, max_steps=1)
    skipping.train()
    after_signal = parameters(skipping)
    adam_state = {k: {n: t.clone() for n, t in v.items()} for k, v in skipping.optimizer.state_dict()["state"].items()}

    skipping = make_trainer(ZeroVarianceSkippingGRPOTrainer, signal_once_reward(), tmp_path)
    plain = make_trainer(GRPOTrainer, signal_once_reward(), tmp_path)
    skipping.train()
    plain.train()

    assert_same(after_signal, parameters(skipping))  # the two skipped steps moved nothing ...
    state = skipping.optimizer.state_dict()["state"]
    assert state.keys() == adam_state.keys()
    for key, values in state.items():
        for name, tensor in values.items():
            assert torch.equal(tensor, adam_state[key][name]), (key, name)  # ... nor touched Adam's state
    assert [r[SKIPPED_METRIC] for r in step_logs(skipping)] == [0.0, 1.0, 1.0]
    moved = [n for n, p in parameters(plain).items() if not torch.equal(p, after_signal[n])]
    assert moved, "TRL's momentum-only steps move the parameters"


@pytest.mark.slow
def test_run_with_signal_matches_grpo_trainer_bit_for_bit(tmp_path):
    plain = make_trainer(GRPOTrainer, ranked_reward, tmp_path)
    plain.train()
    skipping = make_trainer(ZeroVarianceSkippingGRPOTrainer, ranked_reward, tmp_path)
    skipping.train()
    assert_same(parameters(plain), parameters(skipping))
    assert [r["reward"] for r in step_logs(plain)] == [r["reward"] for r in step_logs(skipping)]
    assert [r["loss"] for r in step_logs(plain)] == [r["loss"] for r in step_logs(skipping)]
    assert [r[SKIPPED_METRIC] for r in step_logs(skipping)] == [0.0] * STEPS


def test_kl_term_disables_skipping_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="kl_coef > 0"):
        trainer = make_trainer(ZeroVarianceSkippingGRPOTrainer, constant_reward, tmp_path, beta=0.1, max_steps=1)
    trainer.train()
    assert SKIPPED_METRIC not in step_logs(trainer)[0]  # GRPOTrainer's own step ran
    assert trainer.optimizer.state_dict()["state"]  # and so did the optimizer, on the KL term's gradient


@pytest.mark.parametrize(
    "skip, expected",
    [
        (True, ZeroVarianceSkippingGRPOTrainer),  # the spec asks for it
        (False, GRPOTrainer),  # the default: TRL's own trainer, untouched
    ],
)
def test_grpo_trainer_class(skip, expected):
    assert grpo_trainer_class(skip) is expected


def test_spec_option_trains_with_the_skipping_trainer(tmp_path):
    # The training stage's real path (`python -m grpoflow.trainers.grpo JOB_DIR` runs this `main`), with a reward that
    # is 0.0 for every completion this short: every step skipped, and the saved weights are the base model's, bit for
    # bit.
    spec, _ = load_spec(
        {
            "name": "skip",
            "base_model": "builtin:tiny",
            "dataset": {"uri": "unused.jsonl"},
            "rewards": [{"name": "length_penalty", "kwargs": {"max_chars": 1000}}],
            "hyperparameters": {
                "max_steps": STEPS,
                "rollouts_per_prompt": 4,
                "max_response_length": 4,
                "learning_rate": 1e-2,
                "skip_zero_variance_groups": True,
            },
            "evaluation": {"holdout": 0},
            "output_uri": str(tmp_path),
        }
    )
    job = JobDir(tmp_path / "job")
    write_text_atomic(job.spec, to_yaml(spec))
    DatasetDict({"train": Dataset.from_list([{"prompt": f"What is {i}+1?"} for i in range(8)])}).save_to_disk(
        str(job.dataset)
    )
    assert train_stage(str(job.root)) == 0
    assert [r["values"][SKIPPED_METRIC] for r in read_metrics(job.metrics)] == [1.0] * STEPS
    base = load_file(Path(resolve_model_path("builtin:tiny")) / "model.safetensors")
    trained = load_file(job.merged / "model.safetensors")
    assert_same(base, trained)
