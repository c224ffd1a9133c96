"""Held-out scores during training, and the best checkpoint by them (`evaluation.every`, `evaluation.select`).

Every `evaluation.every` GRPO steps, and at the last step, the policy being trained completes the held-out prompts
greedily, as the before/after evaluation does, and `evaluation.metric` scores them, inside the training process: no
model is loaded twice. It is the trainer's `evaluate` (the method transformers' Trainer calls every `eval_steps`),
so the rest is the Trainer's own machinery:

- the score is logged as `eval_<metric>`, which metrics.jsonl writes as `eval/<metric>` on that step's line
  (`grpoflow.trainers.metrics`) and each tracker of `report_to` shows as its own `eval/<metric>` curve;
- with `select: best`, `metric_for_best_model` and `load_best_model_at_end` make the Trainer keep the best-scoring
  checkpoint through its rotation (`save_total_limit` keeps it beside the newest), record it in `trainer_state.json`
  (so a resumed run knows it), and load it when training ends: what is then saved, merged, evaluated "after",
  published and gated is that checkpoint's model.

With `every: 0` (the default) nothing here is used: the trainer and its arguments are TRL's as before.

How two held-out scores are named and compared is said once, in `grpoflow.core.scores`.
"""

import time

from grpoflow.core.spec import JobSpec
from grpoflow.trainers.evaluate import metric_reward, score


def held_out_args(spec: JobSpec) -> dict:
    """The `GRPOConfig` fields of `evaluation.every` and `evaluation.select`; none when `every` is 0."""
    evaluation = spec.evaluation
    if not evaluation.every:
        return {}
    hp = spec.hyperparameters
    args = {
        "eval_strategy": "steps",
        "eval_steps": evaluation.every,
        # Unused by the greedy evaluation; TRL checks that it holds whole groups, which the train batch does.
        "per_device_eval_batch_size": hp.rollouts_per_prompt * hp.prompts_per_step // spec.processes,
    }
    if evaluation.select == "best":
        args |= {
            "load_best_model_at_end": True,
            "metric_for_best_model": f"eval_{evaluation.metric_name}",
            "greater_is_better": True,
        }
    return args


def held_out_trainer(base: type, spec: JobSpec, rows, job=None) -> type:
    """`base` (TRL's GRPOTrainer or a subclass) whose `evaluate` scores the held-out `rows` with `evaluation.metric`.

    Args:
        base (`type`): the trainer class the job trains with.
        spec (`JobSpec`): the job's spec (the metric, max_new_tokens).
        rows: the held-out split, its prompts prepared as training's are (`prepare_prompts`).
        job (`JobDir`, *optional*): the job folder; each evaluation's completions and scores then go to its
            `evaluation/step-<NNNNNN>.parquet`.
    """
    from transformers import Trainer

    reward = metric_reward(spec)
    key = f"eval_{spec.evaluation.metric_name}"

    class HeldOutTrainer(base):
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            started = time.monotonic()
            at = (job, self.state.global_step) if job is not None else None
            value = score(self.model, rows, spec, tokenizer=self.processing_class, reward=reward, keep_at=at)
            # NaN when the metric scored no completion: never the best, and null in metrics.jsonl.
            metrics = {key: float("nan") if value is None else value, "eval_seconds": time.monotonic() - started}
            # Trainer's own log, not GRPOTrainer's, which would log the last step's completions a second time.
            Trainer.log(self, metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
            return metrics

    return HeldOutTrainer


def selected_step(trainer, spec: JobSpec) -> int:
    """The step whose model the trainer ends with: the best-scoring checkpoint's with `select: best` (when one was
    scored), else the last step."""
    state = trainer.state
    if spec.evaluation.select == "best" and state.best_model_checkpoint and state.best_global_step:
        return state.best_global_step
    return state.global_step
