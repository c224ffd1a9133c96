"""Held-out evaluation: greedy completions on the prompts held out of training, scored by one of the spec's rewards.

    python -m grpoflow.trainers.evaluate runs/<job_id>

`before` scores the model GRPO started from (the SFT output when the warm-up ran, else the base model) and `after`
the GRPO result (`merged/`); both go to `evaluation.json`. With a 0/1 reward such as `exact_answer` the score is
accuracy.
"""

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from grpoflow.trainers.held_out import eval_key
from grpoflow.trainers.jobdir import JobDir, write_json_atomic
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.load import load_tokenizer, prepare_prompts, start_model
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.dry_run import call_reward, trl_columns
from grpoflow.trainers.spec import JobSpec, load_spec

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


def generate(model, prompts: list, max_new_tokens: int, batch_size: int = 64, tokenizer=None) -> list:
    """Greedy completions for `prompts` (strings or chats), in the form TRL hands to rewards.

    Args:
        model: a model folder (loaded here), or a loaded causal LM (then `tokenizer` is required).
        prompts (`list`): strings, or lists of `{role, content}` messages.
        max_new_tokens (`int`): the most tokens per completion.
        batch_size (`int`, *optional*, defaults to 64): prompts per `generate` call.
        tokenizer (*optional*): the tokenizer of a loaded `model`.
    """
    import torch

    if isinstance(model, str):
        model, tokenizer = load_for_generation(model)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    conversational = bool(prompts) and isinstance(prompts[0], list)
    completions = []
    try:
        with torch.no_grad():
            for i in range(0, len(prompts), batch_size):
                batch = prompts[i : i + batch_size]
                if conversational:
                    batch = [
                        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in batch
                    ]
                enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=not conversational)
                enc = enc.to(model.device)
                out = model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
                texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
                completions += [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return completions


SAMPLES = 5  # held-out completions of the GRPO result kept in evaluation.json (shown before an approval)


def metric_reward(spec: JobSpec):
    """The callable of `evaluation.metric`: a job reward, or the metric's own entry."""
    entry = spec.evaluation_reward
    return build_reward(
        entry.name, entry.function, entry.kwargs, entry.model, entry.grader, spec.dataset.prompt_column
    )


def score(model, eval_rows, spec: JobSpec, tokenizer=None, samples: list | None = None, reward=None) -> float | None:
    """Mean of the evaluation metric over greedy completions of the held-out prompts (None scores are skipped);
    None when the metric scored none of them.

    `model` is a folder, or a loaded model with its `tokenizer`. The first `SAMPLES` prompts, completions and
    scores are appended to `samples` when it is given. `reward` is the metric's callable when already built.
    """
    reward = reward or metric_reward(spec)
    prompts = list(eval_rows["prompt"])
    completions = generate(model, prompts, spec.evaluation.max_new_tokens, tokenizer=tokenizer)
    if tokenizer is None:
        tokenizer = load_tokenizer(model)
    values = reward_values(reward, prompts, completions, eval_rows, tokenizer)
    if samples is not None:
        samples += [
            {"prompt": _text(p), "completion": _text(c), "score": v}
            for p, c, v in list(zip(prompts, completions, values, strict=True))[:SAMPLES]
        ]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _text(message) -> str:
    """A prompt or completion as text: a chat's last message's content."""
    return message[-1]["content"] if isinstance(message, list) else message


def reward_values(reward, prompts: list, completions: list, rows, tokenizer) -> list:
    """`reward` on `completions` of `rows`' prompts, called as in training: the other columns, `completion_ids` from
    `tokenizer`, TRL's logging hooks (see `grpoflow.trainers.rewards.call_reward`)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    columns = trl_columns({c: list(rows[c]) for c in rows.column_names})
    return call_reward(reward, prompts, completions, ids, columns)


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
    samples = []
    if training is None:
        training = json.loads(job.training_result.read_text()) if job.training_result.exists() else {}
    result = {
        "metric": spec.evaluation.metric_name,
        "n": len(rows),
        "before": score(before_model, rows, spec),
        "after": score(after_model, rows, spec, tokenizer=after_tokenizer, samples=samples),
        "select": spec.evaluation.select,
        "selected_step": training.get("selected_step", training.get("global_step")),
    }
    result["series"] = score_series(job, spec, result["before"], result["after"], training)
    unscored = [side for side in ("before", "after") if result[side] is None]
    if unscored:
        result["note"] = (
            f"no score {' or '.join(unscored)} GRPO: the metric {spec.evaluation.metric_name!r} returned None for "
            f"every one of the {len(rows)} held-out completions; pick another evaluation.metric, or make the reward "
            "score these completions"
        )
    result["seconds"] = round(time.monotonic() - started, 3)
    result["samples"] = samples  # a few of the GRPO result's held-out completions, with their scores
    write_json_atomic(job.evaluation, result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir")
    job = JobDir(Path(parser.parse_args().job_dir))
    spec, _ = load_spec(job.spec)
    print(evaluate(job, spec, start_model(spec, job)))
    sys.exit(0)
