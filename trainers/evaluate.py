"""Held-out evaluation: greedy completions on the prompts held out of training (or `evaluation.samples` sampled ones
each), scored by one of the spec's rewards.

    python -m grpoflow.trainers.evaluate runs/<job_id>

`before` scores the model GRPO started from (the SFT output when the warm-up ran, else the base model) and `after`
the GRPO result (`merged/`); both go to `evaluation.json`, with `ci`, paired bootstrap intervals over the held-out
prompts of each score and of the gain (`evaluation.confidence`; `grpoflow.core.scores.intervals`). With a 0/1
reward such as `exact_answer` the score is accuracy. With `evaluation.samples` above 1 a prompt's score is the mean of
its completions', and `pass_at_k` holds pass@1 and pass@samples of both models (`grpoflow.core.scores.pass_rates`).

No regression: when the GRPO result does not beat the start (`improved: false`), the job says so (`note`, the
`no_improvement` alert), and with `evaluation.select: best` the start is the best model there is: it is kept. merged/
then holds the start model, `after` is its score and `selected_step` is 0; the GRPO result stays in checkpoints/ (and
a LoRA job's adapter in adapter/), its step and score in `trained`. With `select: last` the last step is kept, as
asked; the promotion gate (`evaluation.gate.min_gain`, 0 by default) publishes and deploys neither.
"""

import argparse
import json
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.scores import beats, eval_key, intervals, pass_rates
from grpoflow.core.spec import JobSpec, load_spec
from grpoflow.core.spec.markdown import number
from grpoflow.trainers.health import Alert
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.load import load_tokenizer, prepare_prompts, start_model
from grpoflow.trainers.model.merge import save_start_model, write_model_json
from grpoflow.trainers.multi_turn import environment_name, is_multi_turn, tool_rollouts
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.dry_run import call_reward, trl_columns
from grpoflow.trainers.rollouts import as_text, prompt_text, write_held_out

# One model load at a time in a process: a sweep's jobs evaluate in threads of one process, and neither transformers'
# lazy imports nor `from_pretrained`'s meta-device initialisation is safe to run in two threads at once.
_LOADING = threading.Lock()


def load_for_generation(model_path: str):
    """The model (eval mode, on the GPU when there is one) and its tokenizer."""
    with _LOADING:
        import torch
        from transformers import AutoModelForCausalLM

        from grpoflow.trainers.model.load import torch_dtype

        tokenizer = load_tokenizer(model_path)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype()).to(device).eval()
    return model, tokenizer


def generate(
    model, prompts: list, max_new_tokens: int, batch_size: int = 64, tokenizer=None, samples: int = 1, seed: int = 0
) -> list:
    """Greedy completions for `prompts` (strings or chats), in the form TRL hands to rewards; with `samples` above 1,
    that many sampled completions of each prompt, one prompt's after another's.

    Args:
        model: a model folder (loaded here), or a loaded causal LM (then `tokenizer` is required).
        prompts (`list`): strings, or lists of `{role, content}` messages.
        max_new_tokens (`int`): the most tokens per completion.
        batch_size (`int`, *optional*, defaults to 64): prompts per `generate` call.
        tokenizer (*optional*): the tokenizer of a loaded `model`.
        samples (`int`, *optional*, defaults to 1): completions per prompt; above 1 they are sampled (temperature
            1, the model's own top-k/top-p left out).
        seed (`int`, *optional*, defaults to 0): the sampling's seed, on a forked RNG: the same completions each
            time, and the caller's random state (training's, between evaluations) untouched.
    """
    if isinstance(model, str):
        model, tokenizer = load_for_generation(model)
    conversational = bool(prompts) and isinstance(prompts[0], list)
    completions = []
    sampling = sampling_args(samples, samples)
    with generation_mode(model, tokenizer, samples, seed):
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i : i + batch_size]
            if conversational:
                batch = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in batch]
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=not conversational)
            enc = enc.to(model.device)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            completions += [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    return completions


def sampling_args(samples: int, per_call: int = 1) -> dict:
    """`generate`'s keyword arguments for `evaluation.samples`: greedy for 1; else sampled at temperature 1 (the
    model's own top-k/top-p left out), `per_call` completions of each input."""
    if samples == 1:
        return {"do_sample": False}
    return {"do_sample": True, "num_return_sequences": per_call, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


@contextmanager
def generation_mode(model, tokenizer, samples: int, seed: int):
    """The model in eval mode, without gradients, its tokenizer padding on the left, and with `samples` above 1 the
    sampling seeded on a forked RNG; all as it was afterwards."""
    import torch

    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices, enabled=samples > 1):
            if samples > 1:
                torch.manual_seed(seed)
            yield
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)


SAMPLES = 5  # held-out completions of the GRPO result kept in evaluation.json (shown before an approval)


def metric_reward(spec: JobSpec):
    """The callable of `evaluation.metric`: a job reward, or the metric's own entry; None when the metric is the
    environment's `get_reward()`."""
    if (entry := spec.evaluation_reward) is None:
        return None
    return build_reward(
        entry.name, entry.function, entry.kwargs, entry.model, entry.grader, spec.dataset.prompt_column
    )


def score(
    model,
    eval_rows,
    spec: JobSpec,
    tokenizer=None,
    samples: list | None = None,
    reward=None,
    keep_at=None,
    per_prompt: list | None = None,
    per_sample: list | None = None,
) -> float | None:
    """Mean of the evaluation metric over the held-out prompts' completions (greedy; `evaluation.samples` sampled
    ones each when above 1, a prompt's score their mean); None scores are skipped; None when the metric scored none.

    `model` is a folder, or a loaded model with its `tokenizer`. The first `SAMPLES` prompts, completions and
    scores are appended to `samples` when it is given (a prompt's first completion). `reward` is the metric's
    callable when already built. With `keep_at`, a `(JobDir, step)`, every completion and its score go to the job's
    `evaluation/step-<NNNNNN>.parquet` (`grpoflow.trainers.rollouts.write_held_out`). Each prompt's score (None: not
    scored) is appended to `per_prompt`, and the list of its completions' scores to `per_sample`, when given.
    """
    if isinstance(model, str):
        model, tokenizer = load_for_generation(model)
    n, seed = spec.evaluation.samples, spec.hyperparameters.seed
    prompts = [p for p in eval_rows["prompt"] for _ in range(n)]
    rows = eval_rows.select([i for i in range(len(eval_rows)) for _ in range(n)]) if n > 1 else eval_rows
    ids = environments = None
    if is_multi_turn(spec):  # rollouts with the job's tools and environment, as in training
        with generation_mode(model, tokenizer, n, seed):
            rollouts = tool_rollouts(model, tokenizer, prompts, list(rows), spec, sampling_args(n))
        prompts, completions = [r.prompt for r in rollouts], [r.messages for r in rollouts]
        ids = [r.completion_ids for r in rollouts]
        environments = [r.environment for r in rollouts] if spec.environment else None
    else:
        completions = generate(
            model, list(eval_rows["prompt"]), spec.evaluation.max_new_tokens, tokenizer=tokenizer, samples=n, seed=seed
        )
    if spec.evaluation.metric_name == environment_name(spec):  # the environment's own reward, as training logs it
        values = [environment.get_reward() for environment in environments]
    else:
        values = reward_values(reward or metric_reward(spec), prompts, completions, rows, tokenizer, ids, environments)
    if keep_at is not None:
        write_held_out(*keep_at, prompts, completions, values, samples=n)
    each = [values[i : i + n] for i in range(0, len(values), n)]
    if per_sample is not None:
        per_sample += each
    means = [_mean(v) for v in each]
    if per_prompt is not None:
        per_prompt += means
    if samples is not None:
        samples += [
            {"prompt": prompt_text(p), "completion": as_text(c, chat_as_json=False), "score": v}
            for p, c, v in list(zip(prompts, completions, values, strict=True))[::n][:SAMPLES]
        ]
    return _mean(means)


def _mean(values: list) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def reward_values(reward, prompts: list, completions: list, rows, tokenizer, ids=None, environments=None) -> list:
    """`reward` on `completions` of `rows`' prompts, called as in training: the other columns, `completion_ids` (from
    `tokenizer` unless given), the rollouts' `environments` when the job has one, TRL's logging hooks (see
    `grpoflow.trainers.rewards.call_reward`)."""
    if ids is None:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    columns = trl_columns({c: list(rows[c]) for c in rows.column_names})
    return call_reward(reward, prompts, completions, ids, columns, environments)


def score_series(job: JobDir, spec: JobSpec, before: float | None, after: float | None, training: dict) -> list:
    """The held-out score by step: the start model's at step 0, then those taken during training (`eval/<metric>` in
    metrics.jsonl, `evaluation.every`); without any, the GRPO result's at its last step."""
    key = eval_key(spec)
    during = [{"step": r["step"], "score": r["values"][key]} for r in read_metrics(job.metrics) if key in r["values"]]
    if not during and training.get("global_step"):
        during = [{"step": training["global_step"], "score": after}]
    return [{"step": 0, "score": before}, *during]


def evaluate(job: JobDir, spec: JobSpec, before_model: str, after=None, training: dict | None = None) -> dict | None:
    """Scores `before_model` and the GRPO result on the held-out split; None when the spec holds nothing out.

    Args:
        job (`JobDir`): the job folder (its `dataset/` eval split; `evaluation.json` is written there).
        spec (`JobSpec`): the job's spec (metric, max_new_tokens, prompt column, system prompt).
        before_model (`str`): the folder of the model GRPO started from.
        after (*optional*): `(model, tokenizer)` of the GRPO result already in memory (the training child passes
            its trained model, whose weights are `merged/`'s); by default `merged/` is loaded.
        training (`dict`, *optional*): the training summary (its `global_step`, `selected_step`); by default
            `training.json`.
    """
    from datasets import load_from_disk

    started = time.monotonic()
    dataset = load_from_disk(str(job.dataset))
    if "eval" not in dataset:
        return None
    rows = prepare_prompts(dataset["eval"], spec.dataset.prompt_column, spec.hyperparameters.system_prompt)
    after_model, after_tokenizer = after or (str(job.merged), None)
    start_samples, samples, start_scores, scores, start_each, each = [], [], [], [], [], []
    if training is None:
        training = json.loads(job.training_result.read_text()) if job.training_result.exists() else {}
    trained_step = training.get("selected_step", training.get("global_step"))
    after_at = (job, trained_step) if trained_step else None  # evaluation/step-<that step>.parquet
    result = {
        "metric": spec.evaluation.metric_name,
        "n": len(rows),
        "before": score(
            before_model,
            rows,
            spec,
            None,
            start_samples,
            keep_at=(job, 0),
            per_prompt=start_scores,
            per_sample=start_each,
        ),
        "after": score(
            after_model, rows, spec, after_tokenizer, samples, keep_at=after_at, per_prompt=scores, per_sample=each
        ),
        "select": spec.evaluation.select,
        "selected_step": training.get("selected_step", training.get("global_step")),
    }
    result["series"] = score_series(job, spec, result["before"], result["after"], training)
    result["improved"] = beats(result["after"], result["before"])
    unscored = [side for side in ("before", "after") if result[side] is None]
    if unscored:
        result["note"] = (
            f"no score {' or '.join(unscored)} GRPO: the metric {spec.evaluation.metric_name!r} returned None for "
            f"every one of the {len(rows)} held-out completions; pick another evaluation.metric, or make the reward "
            "score these completions"
        )
    elif not result["improved"]:
        if spec.evaluation.select == "best":
            keep_start(job, before_model, result)
            samples, scores, each = start_samples, start_scores, start_each
        result["note"] = no_improvement_note(result)
    result |= held_out_intervals(start_scores, scores, spec.evaluation.confidence)
    if spec.evaluation.samples > 1:  # pass@1 and pass@samples of the start and of the kept model
        ks = sorted({1, spec.evaluation.samples})
        result["pass_at_k"] = {"before": pass_rates(start_each, ks), "after": pass_rates(each, ks)}
    result["seconds"] = round(time.monotonic() - started, 3)
    result["samples"] = samples  # a few of the kept model's held-out completions, with their scores
    write_json_atomic(job.evaluation, result)
    return result


def held_out_intervals(before: list, after: list, confidence: float | None) -> dict:
    """evaluation.json's `confidence` and `ci`: the paired bootstrap intervals of `before`, `after` and the gain over
    the held-out prompts (`grpoflow.core.scores.intervals`); `ci` is None with `evaluation.confidence: null`."""
    return {"confidence": confidence, "ci": intervals(before, after, confidence) if confidence else None}


def keep_start(job: JobDir, start: str, result: dict) -> None:
    """Makes the start model the job's model (merged/, model.json) and `result` say so: `after` its score, step 0,
    the GRPO result's step and score in `trained`."""
    save_start_model(start, job.merged)
    write_model_json(job)
    result["trained"] = {"step": result["selected_step"], "score": result["after"]}
    result |= {"after": result["before"], "selected_step": 0}


def no_improvement_note(result: dict) -> str:
    """What evaluation.json, the report, the run's message and `grpoflow run` say when no checkpoint beat the start."""
    trained = result.get("trained") or {"step": result["selected_step"], "score": result["after"]}
    which = "best" if result.get("select") == "best" else "last"
    who = "the GRPO result" if trained["step"] is None else f"the {which}, step {trained['step']},"
    note = (
        f"no checkpoint beat the starting model: {who} scored {number(trained['score'])} against the start's "
        f"{number(result['before'])}"
    )
    return note + ("; the starting model is kept (merged/ holds it)" if result.get("trained") else "")


def no_improvement_alert(evaluation: dict | None) -> Alert | None:
    """The `no_improvement` alert (a `grpoflow.training.alert`) of an evaluation whose GRPO result did not beat the
    start model; None when it did, or when a score is missing."""
    if not evaluation or evaluation.get("improved") is not False:
        return None
    trained = evaluation.get("trained") or {"step": evaluation["selected_step"], "score": evaluation["after"]}
    evidence = {
        "metric": evaluation["metric"],
        "start_score": evaluation["before"],
        "trained_step": trained["step"],
        "trained_score": trained["score"],
        "select": evaluation.get("select"),
        "kept": "start" if evaluation.get("trained") else f"step {trained['step']}",
    }
    advice = (
        "The trained model is no better on the held-out prompts than the one GRPO started from. Check that the "
        "rewards pay for what evaluation.metric measures, lower learning_rate, and score during training "
        "(evaluation.every) with select: best, which keeps the start when nothing beats it. The promotion gate "
        "(evaluation.gate.min_gain, 0 by default) publishes and deploys no such model."
    )
    return Alert("no_improvement", trained["step"] or 0, evaluation["note"], evidence, advice)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir")
    job = JobDir(Path(parser.parse_args().job_dir))
    spec, _ = load_spec(job.spec)
    print(evaluate(job, spec, start_model(spec, job)))
    sys.exit(0)
