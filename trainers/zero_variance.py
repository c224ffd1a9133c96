"""Skipping the backward pass and optimizer step of GRPO steps that carry no learning signal.

When every completion of a group gets the same reward, GRPO's advantages for the group are all 0. With kl_coef = 0
(no KL term), no entropy bonus and no router auxiliary loss, every loss type TRL offers is then exactly 0, and so is
its gradient: the step's forward pass, backward pass and optimizer step do work that cannot teach the model anything.
`ZeroVarianceSkippingGRPOTrainer` (the spec's `hyperparameters.skip_zero_variance_groups: true`) looks at the
advantages after generation and scoring, and when they are all 0 it skips the forward and backward pass. The
parameters' gradients then stay `None`, and torch.optim optimizers skip a parameter whose `.grad` is None altogether
(their documented rule), so on a skipped step:

- the parameters are unchanged, bit for bit;
- the optimizer state is unchanged: no Adam step count, no first or second moment update, no weight decay;
- the learning-rate scheduler still advances: the schedule stays a function of the step number, so warm-up and
  decay end at max_steps as configured and a resumed run finds the same learning rate (not advancing would stretch
  the schedule by the number of skipped steps, and the last steps would train at a rate the schedule never meant);
- the step counts toward max_steps and is logged as usual (reward, reward_std, rewards/*, completion lengths, loss 0,
  grad_norm 0) plus `skipped_zero_variance` (1 for a skipped step, 0 otherwise); `entropy` and `clip_ratio/*` need
  the forward pass and are not logged for it.

This changes the trajectory compared with plain TRL. TRL still runs an optimizer step on the zero gradient, and Adam
then moves the parameters along its momentum (m / (sqrt(v) + eps) is not 0 once any earlier step had a gradient),
decays the weights when weight_decay > 0, and counts the step in its bias correction. Skipping drops these
momentum-only updates: a step without signal does not move the model. Steps with signal are computed exactly as
TRL computes them, so a run in which no step is skipped matches `GRPOTrainer` bit for bit.

Only a whole step is skipped: with several groups per step (not grpoflow's layout, whose step is one group), the
step is skipped only when all its groups have zero variance. Where the gradient is not 0 or the skip cannot be
coordinated (kl_coef > 0, an entropy bonus, a router auxiliary loss, DeepSpeed, gradient accumulation across
several processes, or a GRPOTrainer replaced by Unsloth), the trainer warns once and behaves exactly like
`GRPOTrainer` (and logs no `skipped_zero_variance`).
"""

import time
import warnings

import torch
from accelerate.utils import DistributedType
from trl import GRPOTrainer

SKIPPED_METRIC = "skipped_zero_variance"


def skip_blocker(trainer: GRPOTrainer) -> str | None:
    """Why `trainer` cannot skip zero-advantage steps (their gradient is not 0, or ranks could not agree), or None."""
    if not GRPOTrainer.__module__.startswith("trl."):
        return f"GRPOTrainer is {GRPOTrainer.__module__}'s (Unsloth's?), and the skip is written against TRL's own"
    if trainer.beta != 0.0:
        return "kl_coef > 0: the KL term has a gradient even when every advantage is 0"
    if trainer._entropy_bonus_enabled:
        return "an entropy bonus has a gradient even when every advantage is 0"
    if trainer.aux_loss_enabled:
        return "the router auxiliary loss has a gradient even when every advantage is 0"
    if trainer.accelerator.distributed_type == DistributedType.DEEPSPEED:
        return "DeepSpeed steps its optimizer inside the backward pass"
    if trainer.accelerator.num_processes > 1 and trainer.args.gradient_accumulation_steps > 1:
        return "gradient accumulation over several processes: skipping a last micro-batch would skip the gradient sync"
    return None


class ZeroVarianceSkippingGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` that skips forward, backward and optimizer work for steps whose advantages are all 0.

    Takes exactly `GRPOTrainer`'s arguments; see the module docstring for what a skipped step does and does not do.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._prepared = None
        self._skip_blocker = skip_blocker(self)
        if self._skip_blocker:
            warnings.warn(f"skip_zero_variance_groups has no effect: {self._skip_blocker}", stacklevel=2)

    def training_step(self, model, inputs, num_items_in_batch):
        if self._skip_blocker:
            return super().training_step(model, inputs, num_items_in_batch)
        started = time.perf_counter()
        # What Trainer.training_step does before `_prepare_inputs`: mode decides TRL's train/eval generation path. Only
        # when needed: the parent's call does it again, and a walk of every module costs ~0.2 ms (0.3% of a tiny step).
        if not model.training:
            model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        prepared = self._prepare_inputs(inputs)  # generation and scoring, exactly as the parent does them
        skip = self._no_signal(prepared["advantages"])
        self._metrics["train"][SKIPPED_METRIC].append(float(skip))
        self._current_train_step_time += time.perf_counter() - started
        if not skip:
            # The parent's own `_prepare_inputs` call gets this batch back instead of generating again.
            self._prepared = prepared
            return super().training_step(model, inputs, num_items_in_batch)
        # The bookkeeping GRPOTrainer.training_step does around the forward and backward pass it no longer needs.
        self._step += 1
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return torch.zeros((), device=self.args.device)

    def _prepare_inputs(self, generation_batch):
        prepared, self._prepared = self._prepared, None
        return prepared if prepared is not None else super()._prepare_inputs(generation_batch)

    def _no_signal(self, advantages: torch.Tensor) -> bool:
        # Every process must agree, or one would wait forever in a gradient all-reduce the others skipped.
        nonzero = self.accelerator.reduce(torch.count_nonzero(advantages).reshape(1), reduction="sum")
        return int(nonzero.item()) == 0


def grpo_trainer_class(skip_zero_variance_groups: bool) -> type[GRPOTrainer]:
    """The trainer class for a job: `ZeroVarianceSkippingGRPOTrainer` when the spec asks for skipping, else TRL's own.

    Args:
        skip_zero_variance_groups (`bool`): the spec's `hyperparameters.skip_zero_variance_groups`.
    """
    return ZeroVarianceSkippingGRPOTrainer if skip_zero_variance_groups else GRPOTrainer
