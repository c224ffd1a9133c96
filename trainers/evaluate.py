"""Held-out evaluation: greedy completions on the prompts held out of training, scored by one of the spec's rewards.

    python -m trainers.evaluate runs/<job_id>

`before` scores the model GRPO started from (the SFT output when the warm-up ran, else the base model) and `after`
the GRPO result (`merged/`); both go to `evaluation.json`. With a 0/1 reward such as `exact_answer` the score is
accuracy.
"""

import argparse
import sys
from pathlib import Path

import torch

from trainers.jobdir import JobDir, write_json_atomic
from trainers.modeling import load_tokenizer, prepare_prompts
from trainers.rewards import build_reward
from trainers.spec import JobSpec, load_spec


@torch.no_grad()
def generate(model_path: str, prompts: list, max_new_tokens: int, batch_size: int = 64) -> list:
    """Greedy completions for `prompts` (strings or chats), in the form TRL hands to rewards."""
    from transformers import AutoModelForCausalLM

    from trainers.modeling import torch_dtype

    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "left"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype()).to(device).eval()
    conversational = bool(prompts) and isinstance(prompts[0], list)
    completions = []
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        if conversational:
            batch = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in batch]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=not conversational).to(device)
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        completions += [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    return completions


def score(model_path: str, eval_rows, spec: JobSpec) -> float:
    """Mean of the evaluation reward over greedy completions of the held-out prompts (None scores are skipped)."""
    reward_spec = next(r for r in spec.rewards if r.name == spec.evaluation.metric)
    reward = build_reward(reward_spec.name, reward_spec.function, reward_spec.kwargs)
    prompts = list(eval_rows["prompt"])
    completions = generate(model_path, prompts, spec.evaluation.max_new_tokens)
    columns = {c: list(eval_rows[c]) for c in eval_rows.column_names if c != "prompt"}
    values = reward(prompts=prompts, completions=completions, **columns)
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def evaluate(job: JobDir, spec: JobSpec, before_model: str) -> dict | None:
    """Scores `before_model` and `merged/` on the held-out split; None when the spec holds nothing out."""
    from datasets import load_from_disk

    dataset = load_from_disk(str(job.dataset))
    if "eval" not in dataset:
        return None
    rows = prepare_prompts(dataset["eval"], spec.dataset.prompt_column, spec.hyperparameters.system_prompt)
    result = {
        "metric": spec.evaluation.metric,
        "n": len(rows),
        "before": score(before_model, rows, spec),
        "after": score(str(job.merged), rows, spec),
    }
    write_json_atomic(job.evaluation, result)
    return result


if __name__ == "__main__":
    from trainers.grpo import start_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir")
    job = JobDir(Path(parser.parse_args().job_dir))
    spec, _ = load_spec(job.spec)
    print(evaluate(job, spec, start_model(spec, job)))
    sys.exit(0)
