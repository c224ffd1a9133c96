"""GRPO training stage: one job folder in, trained weights (full) or adapter (LoRA/QLoRA) out.

Runs without Prefect, as its own process (what a GPU worker or `accelerate launch` executes):

    python -m grpoflow.trainers.grpo runs/<job_id>

It reads `spec.yaml` and `dataset/` from the job folder, starts from `sft/` when the SFT warm-up ran (else the
base model), writes `metrics.jsonl` every step and `checkpoints/` every `checkpoint_every` steps, resumes from the
newest checkpoint when one exists, and saves `merged/` (full fine-tune) or `adapter/` (LoRA) with the tokenizer.
"""

# torch, transformers, TRL and datasets are imported inside the functions the training child runs: `grpoflow
# validate` imports this module.
import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from grpoflow.core.errors import DIVERGED_EXIT, REWARD_FAILED_EXIT, SETUP_ERROR_EXIT, SetupError, TrainingDiverged
from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec, load_spec
from grpoflow.core.spec.rules import trl_markers
from grpoflow.trainers.agents import agent_args, tool_tokenizer
from grpoflow.trainers.budget import budget_callback, budget_summary, spent
from grpoflow.trainers.child import CANARY_ENV, VLLM_SERVER_URL_ENV, peak_memory_gb, record_exit, say_phase
from grpoflow.trainers.held_out import held_out_args, held_out_trainer, selected_step
from grpoflow.trainers.metrics import finite_callback, metrics_file_callback, truncate_metrics
from grpoflow.trainers.model.architecture import adapter_line, adapter_summary
from grpoflow.trainers.model.load import (
    check_accelerators,
    check_chat_template,
    check_model,
    load_tokenizer,
    load_unsloth,
    lora_config,
    prepare_prompts,
    quantization_config,
    setup_problem,
    start_model,
    torch_dtype,
    use_bf16,
    use_cpu,
    weights_size,
)
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward, guarded_reward
from grpoflow.trainers.rollouts import CompletionProbe, rollouts_callback, truncate_rollouts

# The trackers TRL's GRPOTrainer sends its completion table to (`log_completions`): the rows rollouts/ keeps (prompt,
# completion, each reward's score, advantage, completion tokens, truncated), from the same generation record.
TABLE_TRACKERS = ("trackio", "wandb")
# With log_completions on for a tracker's table only, TRL's console sample of each step (rich, into the child's log):
# a couple of rows, not the step's whole table again; `tracking.num_completions_to_print` sets it.
COMPLETIONS_PRINTED = 2


def completion_logging(spec: JobSpec) -> dict:
    """TRL's `log_completions` and `num_completions_to_print`: on as `tracking.log_completions` asks, and also when
    `report_to` names a tracker that shows tables (`TABLE_TRACKERS`) while the job keeps rollouts (`rollouts.every`
    > 0), so that the rows of rollouts/ reach it through TRL's own path."""
    tracking = spec.tracking
    for_table = spec.rollouts.every > 0 and any(name in TABLE_TRACKERS for name in tracking.report_to)
    printed = tracking.num_completions_to_print
    if not tracking.log_completions and for_table:
        printed = printed or COMPLETIONS_PRINTED
    return {"log_completions": tracking.log_completions or for_table, "num_completions_to_print": printed}


def tracking_args(spec: JobSpec, job: JobDir) -> dict:
    """`GRPOConfig` fields for the spec's `tracking:` block. TensorBoard writes into `<job>/tracking/`; wandb and
    mlflow take the project from their own variables (set here unless the user set them) and read their credentials
    themselves (WANDB_API_KEY, MLFLOW_TRACKING_URI, ...): no secret is in the spec."""
    tracking = spec.tracking
    if "tensorboard" in tracking.report_to:
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(job.root / "tracking")  # transformers' TensorBoardCallback
    if "wandb" in tracking.report_to:
        os.environ.setdefault("WANDB_PROJECT", tracking.project)
    if "mlflow" in tracking.report_to:
        os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", tracking.project)
    return {
        "report_to": tracking.report_to or "none",
        "project": tracking.project,  # trackio's
        "run_name": tracking.run_name or job.job_id,
        **completion_logging(spec),
    }


def generation_args(spec: JobSpec) -> dict:
    """`GRPOConfig` fields for the spec's `generation:` block: the rollout engine and, for vLLM, its mode and sizes."""
    generation = spec.generation
    if generation.engine != "vllm":
        return {"use_vllm": False, "use_transformers_continuous_batching": generation.engine == "paged"}
    args = {
        "use_vllm": True,
        "use_transformers_continuous_batching": False,
        "vllm_mode": generation.vllm_mode,
        "vllm_gpu_memory_utilization": generation.gpu_memory_utilization,
        "vllm_tensor_parallel_size": generation.tensor_parallel_size,
    }
    if generation.vllm_mode == "server":
        url = generation.vllm_server_url or os.environ.get(VLLM_SERVER_URL_ENV)
        if not url:
            raise SetupError(
                "generation.vllm_mode: server without vllm_server_url: the training task starts the server and passes "
                f"its URL; a child started by hand needs {VLLM_SERVER_URL_ENV} (or set generation.vllm_server_url)"
            )
        args["vllm_server_base_url"] = url
    return args


# grpoflow's choices for GRPOConfig fields no spec key sets: a `trl:` block may change them.
GRPO_DEFAULTS = {
    "save_total_limit": 2,
    "disable_tqdm": True,
    # TRL's default turns checkpointing on, which only costs time on small models; memory is the user's lever
    # (max_response_length, lora_rank, load_in_4bit, or trl: {activation_checkpointing: true}). By transformers' new
    # name: its deprecated alias `gradient_checkpointing` (which TRL still defaults to True) warns at every config.
    "activation_checkpointing": False,
}


def copied_hyperparameters(hp) -> dict:
    """The GRPOConfig fields that take a hyperparameter's value as it is, named by its `TRL` marker
    (core/spec/hyperparameters.py): learning_rate, max_steps, num_generations, beta, ..."""
    markers = trl_markers(type(hp))
    return {name: getattr(hp, field) for field, m in markers.items() if m and m.copied for name in m.names}


def owned_args(spec: JobSpec, job: JobDir) -> dict:
    """The `GRPOConfig` fields the spec (or the machine) sets; core/spec/rules.py's `trl_spec_keys` and
    TRL_SET_BY_GRPOFLOW reject each of them in a `trl:` block."""
    hp = spec.hyperparameters
    return {
        "output_dir": str(job.checkpoints),
        **copied_hyperparameters(hp),
        # One step trains on prompts_per_step groups across all processes, each GPU an equal share (rules.py checks
        # that it divides); TRL bounds no batch, so no gradient accumulation is needed to reach K completions.
        "per_device_train_batch_size": hp.rollouts_per_prompt * hp.prompts_per_step // spec.processes,
        "gradient_accumulation_steps": 1,
        "reward_weights": [r.weight for r in spec.rewards],
        "bf16": use_bf16(),
        "use_cpu": use_cpu(spec.processes),
        "model_init_kwargs": {"dtype": torch_dtype()},
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": spec.checkpoint_every,
        **tracking_args(spec, job),
        **generation_args(spec),
        **held_out_args(spec),
    }


def applied_strategy(accelerator) -> str:
    """The strategy the trainer's accelerator really runs: ddp, fsdp2, zero2, zero3, or fsdp1, zero1, or none (one
    process)."""
    kind = accelerator.distributed_type.name
    if kind == "FSDP":
        return "fsdp2" if accelerator.is_fsdp2 else "fsdp1"
    if kind == "DEEPSPEED":
        return f"zero{accelerator.state.deepspeed_plugin.zero_stage}"
    return "ddp" if accelerator.num_processes > 1 else "none"


def check_strategy(trainer, spec: JobSpec) -> str:
    """One line on how this run trains and generates, read back from the trainer's accelerator (what really runs,
    not what the spec asked for); a sharded strategy that did not take effect is a setup error, never a silent
    full copy per GPU."""
    applied, asked = applied_strategy(trainer.accelerator), spec.distributed.strategy
    if asked != "ddp" and applied != asked:
        raise SetupError(
            f"distributed.strategy: {asked} was asked for but accelerate runs {applied} "
            f"({trainer.accelerator.distributed_type.name}); check the accelerate config and the GPUs"
        )
    return (
        f"distributed: {applied} over {trainer.accelerator.num_processes} process(es) (distributed.strategy "
        f"{asked}); generation engine: {spec.generation.engine}"
    )


def grpo_config(spec: JobSpec, job: JobDir):
    """Maps the spec onto `trl.GRPOConfig`: its hyperparameters (one optimizer step = prompts_per_step prompts'
    groups), then grpoflow's defaults, then the spec's `trl:` block, applied last as given."""
    from trl import GRPOConfig

    defaults = {**GRPO_DEFAULTS, **paged_cache_default(spec)}
    if "gradient_checkpointing" in spec.trl:  # the old name given: transformers reads it only when the new is unset
        defaults.pop("activation_checkpointing")
    return GRPOConfig(**owned_args(spec, job), **{**defaults, **spec.trl})


# A page of the paged engine's KV cache: transformers' ContinuousBatchingConfig.page_size default.
PAGE_TOKENS = 256
# The most blocks grpoflow sizes the cache at (262,144 tokens; builtin:tiny ~0.1 GB, a 0.5B model in fp32 ~6 GB); a
# step that needs more is left to transformers' own sizing, which fits what memory there is.
MAX_PAGED_BLOCKS = 1024


def paged_cache_default(spec: JobSpec) -> dict:
    """The paged engine's KV cache on a machine without a GPU: sized for one step's completions, each a prompt of up to
    max_prompt_length tokens and its completion. Unsized, transformers takes half the memory it finds (the machine's
    RAM here) and allocates it at every step's generation: ~11 s a step on 2 cores for builtin:tiny, against ~1 s
    sized. On a GPU, TRL's default (half the free GPU memory) stays. A `trl:` block's
    transformers_continuous_batching_config replaces this one."""
    import torch

    if spec.generation.engine != "paged" or torch.cuda.is_available():
        return {}
    hp = spec.hyperparameters
    completions = hp.rollouts_per_prompt * hp.prompts_per_step // spec.processes
    blocks = paged_cache_blocks(completions, hp.max_prompt_length, hp.max_response_length)
    return {"transformers_continuous_batching_config": {"num_blocks": blocks}} if blocks else {}


def paged_cache_blocks(completions: int, prompt_tokens: int, response_tokens: int) -> int | None:
    """Blocks of the paged cache for `completions` generated together, each of up to prompt_tokens + response_tokens
    (fewer only make a request wait for room); None past MAX_PAGED_BLOCKS."""
    blocks = completions * -(-(prompt_tokens + response_tokens) // PAGE_TOKENS)  # whole pages each
    return blocks if blocks <= MAX_PAGED_BLOCKS else None


def intact_checkpoint(path: Path) -> bool:
    """True when a checkpoint finished saving: `Trainer` writes trainer_state.json last, so a checkpoint killed
    mid-save lacks it, or holds a truncated one, or one whose step is not the folder's."""
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return state.get("global_step") == int(path.name.rsplit("-", 1)[-1])


def resume_checkpoint(job: JobDir, tidy: bool = True) -> str | None:
    """The newest intact checkpoint in `checkpoints/`. With `tidy` (the main process of a run; the other ranks of a
    several-GPU run only look), torn checkpoints are removed and the metrics and rollouts kept after the checkpoint
    dropped, so each step appears once."""
    if not job.checkpoints.exists():
        return None
    candidates = [p for p in job.checkpoints.glob("checkpoint-*") if p.name.rsplit("-", 1)[-1].isdigit()]
    for path in sorted(candidates, key=checkpoint_step, reverse=True):
        if intact_checkpoint(path):
            if tidy:
                truncate_metrics(job.metrics, checkpoint_step(path))
                truncate_rollouts(job, checkpoint_step(path))
            return str(path)
        if tidy:
            print(f"grpoflow: removing torn checkpoint {path.name}")
            shutil.rmtree(path, ignore_errors=True)
    if tidy:
        truncate_metrics(job.metrics, 0)
        truncate_rollouts(job, 0)
    return None


def remove_torn_checkpoints(job: JobDir) -> None:
    """Removes the checkpoints a failed save left torn (a full disk): they only hold space, which the user is about to
    be asked to free, and a resume would skip them."""
    for path in job.checkpoints.glob("checkpoint-*"):
        if path.name.rsplit("-", 1)[-1].isdigit() and not intact_checkpoint(path):
            print(f"grpoflow: removing torn checkpoint {path.name}", file=sys.stderr)
            shutil.rmtree(path, ignore_errors=True)


def checkpoint_step(path: str | Path) -> int:
    """The global step a `checkpoint-N` folder was saved at."""
    return int(Path(path).name.rsplit("-", 1)[-1])


def restore_final_checkpoint(trainer, checkpoint: str, job: JobDir, spec: JobSpec) -> float:
    """Puts the trainer in the state of `checkpoint`, saved at max_steps (or when the budget ran out): a child killed
    after the final checkpoint resumes to nothing more than saving it. `Trainer.train` would instead run one step past
    max_steps (it checks the limit only after a step). With `evaluation.select: best` the model is then the best
    checkpoint's, as `load_best_model_at_end` would have left it. Returns the train_runtime of this process: 0, nothing
    trained."""
    from transformers import TrainerState

    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
    best = trainer.state.best_global_step
    if spec.evaluation.select == "best" and best and (job.checkpoints / f"checkpoint-{best}").is_dir():
        checkpoint = str(job.checkpoints / f"checkpoint-{best}")  # the folder as it is now (the job may have moved)
        trainer.state.best_model_checkpoint = checkpoint
    trainer._load_from_checkpoint(checkpoint)
    reached = "max_steps" if checkpoint_step(checkpoint) >= spec.hyperparameters.max_steps else "the budget"
    print(
        f"grpoflow: the final checkpoint ({reached} reached) is saved: nothing left to train; model from {checkpoint}"
    )
    return 0.0


def loading_line(spec: JobSpec, model_path: str) -> str:
    """The phase line before the trainer loads the model: what it loads and how much (TRL loads a reference copy for
    the KL term, and any reward models, in the same call)."""
    hp = spec.hyperparameters
    line = f"loading the model {model_path} ({weights_size(model_path)}{', in 4-bit' if hp.load_in_4bit else ''})"
    if hp.kl_coef:
        line += ", a reference copy for the KL term"
    if models := [r.model for r in spec.rewards if r.model]:
        line += f", the reward model{'s' if len(models) > 1 else ''} {', '.join(models)}"
    return line


def first_step_line(spec: JobSpec, checkpoint: str | None) -> str:
    """What the first step does before it logs: generate a group per prompt (the slow part on a new model)."""
    hp = spec.hyperparameters
    step = checkpoint_step(checkpoint) + 1 if checkpoint else 1
    completions = hp.rollouts_per_prompt * hp.prompts_per_step
    return f"step {step}: generating {completions} completions of up to {hp.max_response_length} tokens"


def save_artifact(trainer, spec: JobSpec, job: JobDir) -> Path:
    """Saves the adapter (LoRA jobs) or the full weights (full fine-tune), each with the tokenizer: `save_model`
    writes the trainer's `processing_class` too, from the main process only."""
    target = job.adapter if spec.hyperparameters.lora_rank else job.merged
    what = "the adapter" if spec.hyperparameters.lora_rank else "the weights"
    say_phase(f"saving {what} to {target.name}/", after_step=trainer.state.global_step)
    trainer.save_model(str(target))
    return target


def main(job_root: str) -> int:
    setup_started = time.monotonic()  # the imports of torch, transformers and TRL and the model load count as setup
    job = JobDir(Path(job_root))
    spec, _ = load_spec(job.spec)
    hp = spec.hyperparameters
    check_accelerators(spec)
    if hp.use_unsloth:
        import unsloth  # noqa: F401  (must be imported before trl and transformers to patch them)

    # --- data
    from datasets import load_from_disk

    splits = load_from_disk(str(job.dataset))
    dataset = prepare_prompts(splits["train"], spec.dataset.prompt_column, hp.system_prompt)
    # The held-out prompts scored during training (evaluation.every), prepared as the training prompts are.
    held_out = None
    if spec.evaluation.every:
        if "eval" not in splits:
            raise SetupError(
                "evaluation.every: the dataset/ folder has no held-out split (neither evaluation.holdout nor "
                "evaluation.dataset gave one); set evaluation.holdout above 0 or give evaluation.dataset"
            )
        held_out = prepare_prompts(splits["eval"], spec.dataset.prompt_column, hp.system_prompt)

    # --- rewards (each call timed out and checked, so a bad reward stops the run naming itself and the step)
    timeout = spec.health.reward_timeout_s
    # A reward model goes to TRL as its id: TRL loads it as a sequence classifier and places it on the GPU.
    column = spec.dataset.prompt_column
    reward_funcs = [
        r.model or guarded_reward(build_reward(r.name, r.function, r.kwargs, None, r.grader, column), r.name, timeout)
        for r in spec.rewards
    ]
    # Each completion's token count and truncation reach TRL's rows (rollouts/) through the first reward function.
    probe = CompletionProbe()
    if (first := next((i for i, f in enumerate(reward_funcs) if callable(f)), None)) is not None:
        reward_funcs[first] = probe.wrap(reward_funcs[first])

    # --- model and trainer
    from grpoflow.trainers.zero_variance import grpo_trainer_class

    model_path = start_model(spec, job)
    check_model(model_path)
    if hp.use_unsloth:
        # Unsloth builds (and LoRA-wraps) the model itself; TRL gets the finished model object.
        model, tokenizer = load_unsloth(model_path, hp)
        peft, quantization = None, None
    else:
        model, tokenizer = model_path, load_tokenizer(model_path)
        peft, quantization = lora_config(hp, model_path), quantization_config(hp)
    check_chat_template(tokenizer, dataset, hp.system_prompt, model_path)
    tokenizer.padding_side = "left"
    agents = agent_args(spec)  # the spec's tools and environment (TRL's multi-turn rollouts), when set
    if agents:
        tokenizer = tool_tokenizer(tokenizer, spec.base_model)
    budget = budget_callback(job, spec)  # budget.max_training_hours: stops at a checkpoint when reached
    finite = finite_callback("hyperparameters.learning_rate", hp.learning_rate)  # NaN or inf: stops, names the rate
    say_phase(loading_line(spec, model_path))
    loading = time.monotonic()
    trainer_class = grpo_trainer_class(hp.skip_zero_variance_groups)
    if held_out is not None:
        trainer_class = held_out_trainer(trainer_class, spec, held_out, job)
    rollouts = rollouts_callback(job, spec)  # rollouts/ and completions/degenerate_ratio, before metrics.jsonl's line
    trainer = trainer_class(
        model=model,
        reward_funcs=reward_funcs,
        args=grpo_config(spec, job),
        train_dataset=dataset,
        eval_dataset=held_out,
        processing_class=tokenizer,
        peft_config=peft,
        quantization_config=quantization,
        callbacks=[rollouts, metrics_file_callback(job.metrics), finite, budget],
        **agents,
    )
    rollouts.trainer = trainer
    probe.stop_ids = {*trainer.eos_token_ids, getattr(trainer.processing_class, "pad_token_id", None)}
    trainer.reward_func_names[: len(spec.rewards)] = [r.name for r in spec.rewards]  # TRL names a model by its path

    model = trainer.model
    adapters = adapter_summary(model)
    trainable, total = adapters["trainable_parameters"], adapters["total_parameters"]
    quantized = getattr(model, "is_loaded_in_4bit", False)
    print(f"grpoflow: start model {model_path}; loaded in 4-bit: {quantized}; trainable {trainable:,}/{total:,}")
    if line := adapter_line(adapters, model_path):
        say_phase(line)  # in train.log and in the run's log
    loaded = f"model loaded in {time.monotonic() - loading:.1f} s"
    parallelism = check_strategy(trainer, spec)
    if trainer.is_world_process_zero():
        print(f"grpoflow: {parallelism}", flush=True)

    # --- train (resuming from the newest checkpoint when a previous attempt left one)
    checkpoint = resume_checkpoint(job, tidy=trainer.is_world_process_zero())
    started = time.monotonic()
    setup_seconds = round(started - setup_started, 3)
    if checkpoint and (checkpoint_step(checkpoint) >= hp.max_steps or spent(job, spec, checkpoint)):
        train_runtime = restore_final_checkpoint(trainer, checkpoint, job, spec)
        budget.stopped_at = checkpoint_step(checkpoint) if checkpoint_step(checkpoint) < hp.max_steps else None
    else:
        resuming = f"; resuming from {Path(checkpoint).name}" if checkpoint else ""
        say_phase(f"{loaded}{resuming}; {first_step_line(spec, checkpoint)}")
        train_runtime = trainer.train(resume_from_checkpoint=checkpoint).metrics.get("train_runtime")
    if os.environ.get(CANARY_ENV):  # the canary's one step (grpoflow.jobs.canary): measured, nothing saved
        write_json_atomic(job.training_result, {"train_runtime": train_runtime, "peak_memory_gb": peak_memory_gb()})
        return 0

    # --- save
    target = save_artifact(trainer, spec, job)
    train_seconds = round(time.monotonic() - started, 3)
    summary = {
        "artifact_dir": target.name,
        "start_model": model_path,
        "resumed_from": Path(checkpoint).name if checkpoint else None,
        "global_step": trainer.state.global_step,
        "selected_step": selected_step(trainer, spec),
        "setup_seconds": setup_seconds,
        "train_seconds": train_seconds,
        "train_runtime": train_runtime,
        **adapters,
        **budget_summary(spec, job, budget.stopped_at, checkpoint),
        "rollouts": rollouts.summary(),
    }

    # --- held-out evaluation, here when the trained model in memory is exactly what merged/ holds
    if evaluates_in_training(spec):
        from grpoflow.trainers.evaluate import evaluate

        summary["evaluated_in_training"] = True
        step = trainer.state.global_step
        say_phase("scoring the held-out prompts with the base model and the trained one", after_step=step)
        summary["evaluation"] = evaluate(job, spec, model_path, after=(trainer.model, tokenizer), training=summary)
    write_json_atomic(job.training_result, summary)
    return 0


def evaluates_in_training(spec: JobSpec) -> bool:
    """Whether the training child runs the held-out evaluation itself, saving the evaluation stage a second
    process start and model load: for a one-process full fine-tune, whose in-memory model is `merged/`. LoRA jobs
    are evaluated on `merged/` after the merge stage (the adapter on a 4-bit base is not the merged model)."""
    hp = spec.hyperparameters
    return hp.lora_rank is None and not hp.use_unsloth and spec.processes == 1


def cli(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", help="the job folder (holds spec.yaml and dataset/)")
    args = parser.parse_args(argv)
    print(f"grpoflow: grpoflow.trainers.grpo started on {args.job_dir}", flush=True)  # one line per child start
    try:
        return main(args.job_dir)
    except RewardError as e:
        # The user's reward failed mid-training: its traceback for the log, then one line the task reports; exit
        # code 3 tells it that a retry would meet the same reward again.
        traceback.print_exception(e)
        print(f"grpoflow: {e}", file=sys.stderr, flush=True)
        return record_exit(JobDir(Path(args.job_dir)), REWARD_FAILED_EXIT, str(e))
    except TrainingDiverged as e:
        # Exit code 4: the task stops the run as its health monitor would; a retry would resume into the same NaNs.
        print(f"grpoflow: {e}", file=sys.stderr, flush=True)
        return record_exit(JobDir(Path(args.job_dir)), DIVERGED_EXIT, str(e))
    except Exception as e:
        job = JobDir(Path(args.job_dir))
        if (problem := setup_problem(e, job.root)) is None:
            raise
        # Exit code 2 tells the calling task that a retry cannot help.
        print(f"grpoflow: {problem}", file=sys.stderr)
        if os.environ.get("RANK", "0") == "0":
            remove_torn_checkpoints(job)
        return record_exit(job, SETUP_ERROR_EXIT, problem)


if __name__ == "__main__":
    sys.exit(cli())
