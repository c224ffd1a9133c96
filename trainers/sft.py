"""SFT format warm-up: teaches the base model the output shape on the dataset's completion column, before GRPO.

Runs without Prefect, as its own process:

    python -m grpoflow.trainers.sft runs/<job_id>

Writes full weights and the tokenizer to `sft/` (a LoRA job trains LoRA adapters here too and merges them in), so
GRPO starts from an ordinary model folder. It checkpoints every tenth of its steps into `sft_checkpoints/` (the newest
kept), so a run stopped midway (a cancel, a crash) goes on from there when the job resumes; they go once `sft/` is
written. A chat prompt (or a string prompt with a system prompt) gets an assistant
message as completion; the loss is on the completion tokens only.

A job with `tools:` or `environment:` learns the rollout GRPO will run: each row's prompt is rendered with the tools'
schemas (the ones TRL's rollout lists) and its completion may be a whole conversation (assistant turns with tool calls,
the tools' answers between them), tokenized as TRL's tool loop concatenates it; the loss is on the model's turns only.
"""

import argparse
import shutil
import sys
from pathlib import Path

from grpoflow.core.errors import DIVERGED_EXIT, SETUP_ERROR_EXIT, SetupError, TrainingDiverged
from grpoflow.core.jobdir import JobDir, replace_dir
from grpoflow.core.spec import JobSpec, load_spec
from grpoflow.trainers.agents import (
    AgentError,
    agent_args,
    completion_messages,
    rollout_chat_template,
    rollout_ids,
    rollout_tools,
    tool_tokenizer,
)
from grpoflow.trainers.child import record_exit, say_phase
from grpoflow.trainers.grpo import checkpoint_step, intact_checkpoint
from grpoflow.trainers.metrics import finite_callback, metrics_file_callback, truncate_metrics
from grpoflow.trainers.model.load import (
    check_accelerators,
    check_chat_template,
    check_model,
    load_tokenizer,
    lora_config,
    prepare_prompts,
    setup_problem,
    torch_dtype,
    use_bf16,
    use_cpu,
    weights_size,
)
from grpoflow.trainers.model.tiny import resolve_model_path


def sft_dataset(dataset, spec: JobSpec):
    """Prompt-completion rows for `trl.SFTTrainer`: `prompt` as GRPO will see it, `completion` to imitate."""
    dataset = prepare_prompts(dataset, spec.dataset.prompt_column, spec.hyperparameters.system_prompt)
    column = spec.sft.completion_column
    conversational = isinstance(dataset[0]["prompt"], list)

    def to_completion(row):
        text = str(row[column])
        return {"completion": [{"role": "assistant", "content": text}] if conversational else text}

    if column != "completion" and "completion" in dataset.column_names:
        dataset = dataset.remove_columns("completion")
    dataset = dataset.map(to_completion)
    return dataset.select_columns(["prompt", "completion"])


def tool_sft_dataset(dataset, spec: JobSpec, tokenizer, tools: list):
    """Tokenized rows (`input_ids`, `labels`) for a tool job: each prompt with its completion column's conversation,
    as TRL's GRPO rollout renders and concatenates them (`grpoflow.trainers.agents.rollout_ids`)."""
    dataset = prepare_prompts(dataset, spec.dataset.prompt_column, spec.hyperparameters.system_prompt)
    column = spec.sft.completion_column
    template = rollout_chat_template(tokenizer)

    def to_ids(row, index):
        completion = completion_messages(row[column], f"sft.completion_column: row {index} of {column!r}")
        return rollout_ids(tokenizer, row["prompt"], completion, tools, template)

    return dataset.map(to_ids, with_indices=True, remove_columns=dataset.column_names)


def sft_config(spec: JobSpec, output_dir: Path):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        max_steps=spec.sft.max_steps,
        learning_rate=spec.sft.learning_rate,
        per_device_train_batch_size=spec.sft.batch_size,
        lr_scheduler_type="cosine",
        warmup_steps=min(20, spec.sft.max_steps // 10),
        seed=spec.hyperparameters.seed,
        data_seed=spec.hyperparameters.seed,
        bf16=use_bf16(),
        use_cpu=use_cpu(spec.gpu_count),
        model_init_kwargs={"dtype": torch_dtype()},
        logging_steps=max(1, spec.sft.max_steps // 50),
        # A resume goes on from the newest (`resume_sft_checkpoint`): at most a tenth of the warm-up is redone.
        save_strategy="steps",
        save_steps=max(1, spec.sft.max_steps // 10),
        save_total_limit=1,
        report_to="none",
        disable_tqdm=True,
        activation_checkpointing=False,  # TRL defaults the deprecated alias gradient_checkpointing to True
        # A tool job's rows are whole rollouts, tokenized here: TRL's default cut (1024 tokens) would drop their ends.
        **({"max_length": None} if spec.tools or spec.environment is not None else {}),
    )


def resume_sft_checkpoint(job: JobDir, tidy: bool = True) -> str | None:
    """The newest intact checkpoint in `sft_checkpoints/`, as GRPO's `resume_checkpoint` finds its own. With `tidy`
    (the main process), torn checkpoints are removed and the sft_metrics.jsonl lines after the checkpoint dropped, so
    each step appears once."""
    candidates = [p for p in job.sft_checkpoints.glob("checkpoint-*") if p.name.rsplit("-", 1)[-1].isdigit()]
    found = None
    for path in sorted(candidates, key=checkpoint_step, reverse=True):
        if intact_checkpoint(path):
            found = path
            break
        if tidy:
            print(f"grpoflow: removing torn SFT checkpoint {path.name}")
            shutil.rmtree(path, ignore_errors=True)
    if tidy:
        truncate_metrics(job.root / "sft_metrics.jsonl", checkpoint_step(found) if found else 0)
    return str(found) if found else None


def main(job_root: str) -> int:
    job = JobDir(Path(job_root))
    spec, _ = load_spec(job.spec)
    check_accelerators(spec)  # what GRPO will need, before a warm-up that would be for nothing

    # --- data, model and tokenizer (TRL after them: its import, ~10 CPU s, waits for no missing dataset or model)
    from datasets import load_from_disk

    rows = load_from_disk(str(job.dataset))["train"]
    model_path = resolve_model_path(spec.base_model)
    check_model(model_path)
    tokenizer = load_tokenizer(model_path)
    if agents := agent_args(spec):  # GRPO's tool rollouts: the warm-up renders its rows as they will be
        tokenizer = tool_tokenizer(tokenizer, spec.base_model)
        try:
            dataset = tool_sft_dataset(rows, spec, tokenizer, rollout_tools(**agents))
        except AgentError as e:
            raise SetupError(str(e)) from None
    else:
        dataset = sft_dataset(rows, spec)
        check_chat_template(tokenizer, dataset, spec.hyperparameters.system_prompt, spec.base_model)
    say_phase(f"loading the model {model_path} ({weights_size(model_path)})")
    from trl import SFTTrainer

    trainer = SFTTrainer(
        model=model_path,
        args=sft_config(spec, job.sft_checkpoints),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(spec.hyperparameters, model_path),
        callbacks=[
            metrics_file_callback(job.root / "sft_metrics.jsonl"),
            finite_callback("sft.learning_rate", spec.sft.learning_rate),  # NaN or inf: stops, naming the rate
        ],
    )

    # --- train (resuming from the newest checkpoint when a stopped run left one)
    checkpoint = resume_sft_checkpoint(job, tidy=trainer.is_world_process_zero())
    resuming = f"; resuming from {Path(checkpoint).name}" if checkpoint else ""
    say_phase(f"model loaded; training {spec.sft.max_steps} steps{resuming}")
    trainer.train(resume_from_checkpoint=checkpoint)

    # --- save full weights (merging LoRA adapters in), written beside sft/ and renamed into place, by one process
    if not trainer.is_world_process_zero():
        return 0
    model = trainer.model
    say_phase(f"saving the warmed-up weights to {job.sft.name}/")
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    staging = job.root / ".sft-staging"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    replace_dir(staging, job.sft)
    shutil.rmtree(job.sft_checkpoints, ignore_errors=True)
    return 0


def cli(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", help="the job folder (holds spec.yaml and dataset/)")
    args = parser.parse_args(argv)
    print(f"grpoflow: grpoflow.trainers.sft started on {args.job_dir}", flush=True)  # one line per child start
    try:
        return main(args.job_dir)
    except TrainingDiverged as e:  # exit code 4: stopped as the health monitor stops a run, not retried
        print(f"grpoflow: {e}", file=sys.stderr, flush=True)
        return record_exit(JobDir(Path(args.job_dir)), DIVERGED_EXIT, str(e))
    except Exception as e:
        if (problem := setup_problem(e, Path(args.job_dir))) is None:
            raise
        print(f"grpoflow: {problem}", file=sys.stderr)  # exit code 2: a retry cannot help
        return record_exit(JobDir(Path(args.job_dir)), SETUP_ERROR_EXIT, problem)


if __name__ == "__main__":
    sys.exit(cli())
