"""A stand-in for grpoflow's training children (SFT and GRPO), for the tests of what runs around them.

With `GRPOFLOW_CHILD_STANDIN=tests.standin_child` in the environment (the `standin` fixture sets it),
`grpoflow.jobs.launch` starts `python -m tests.standin_child MODULE JOB_DIR` where it would start `python -m
MODULE JOB_DIR`. In well under a second and without importing torch, the stand-in writes what the real child writes,
in its formats: `metrics.jsonl` one line per step (TRL's keys), `checkpoints/checkpoint-N/trainer_state.json` every
`checkpoint_every` steps (resuming after the newest intact one with the real child's `resume_checkpoint`), then a LoRA
adapter that PEFT merges (zero `lora_B`: the merged model is the start model) or the full weights in `merged/` (the
start model's), and `training.json`. It calls the job's rewards every step on canned completions, guarded as the real
child guards them, so a failing reward ends it as it ends the real child. The SFT stand-in writes
`sft_metrics.jsonl` and `sft/` (the base model, every weight moved by 1e-3). Each kept step's canned completions go to
`rollouts/` with their rewards, as the real child keeps them.

It is a double of a child process, not of grpoflow: the tasks, flows and CLI under test are the real ones. What
training produces is tested with the real children (tests/trainers, tests/flows/test_pipeline.py).

`GRPOFLOW_STANDIN` (a JSON object) asks for a behaviour, keyed by the child's stage ("grpo" or "sft") or for both:

    {"step_seconds": 0.2}                       each step takes this long (default 0.02)
    {"load_seconds": 2}                         the model load (between the real child's phase lines "loading the
                                                model ..." and "model loaded ...; step 1: generating ...") takes this
                                                long (default 0)
    {"save_seconds": 1}                         the SFT child's end of training before its save phase line takes
                                                this long (default 0)
    {"budget_stop_at": 2}                       budget.max_training_hours (which the spec must set) is reached after
                                                step 2: training stops at that step's checkpoint, as the real child's
                                                `BudgetCallback` stops it, and training.json says `stopped_by: budget`
    {"crash_at": 2, "crashes": 1}               killed (SIGKILL, as by the OOM killer) after step 2 (or the first
                                                step after it, resuming), the first `crashes` attempts (default:
                                                every attempt)
    {"crash_at": 2, "kill": "flow"}             the same, and its parent (the flow run's process) is killed first, as
                                                when the machine is lost: the flow run ends Crashed
    {"exit_at": 2, "exit_code": 3, "message": "reward 'r' failed at step 2"}
                                                stops on purpose as the real child does (exit 2, 3 or 4, recorded)
    {"hang_at": 2}                              stops stepping after step 2 until it is signalled
    {"no_result": true}                         exits 0 without training.json (something ended it early)
    {"values": {"loss": NaN}}                   metric values to put in every step's record
    {"completion": "iiiiiiii"}                  the text of every canned completion (rewarded, kept in rollouts/)
    {"sft": {...}, "grpo": {...}}               per stage
    {"jobs": {"NAME": {...}}}                   for the jobs whose spec is named NAME only (a worker started once
                                                runs several tests' jobs)
"""

import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from grpoflow.core.errors import REWARD_FAILED_EXIT
from grpoflow.core.jobdir import JobDir, replace_dir, write_json_atomic
from grpoflow.core.spec import load_spec
from grpoflow.trainers.budget import budget_summary
from grpoflow.trainers.child import record_exit, say_phase
from grpoflow.trainers.grpo import GRPO_DEFAULTS, checkpoint_step, first_step_line, resume_checkpoint
from grpoflow.trainers.model.load import LORA_TARGETS, start_model
from grpoflow.trainers.model.tiny import resolve_model_path
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward, guarded_reward

REQUEST_ENV = "GRPOFLOW_STANDIN"
STAGES = {"grpoflow.trainers.grpo": "grpo", "grpoflow.trainers.sft": "sft"}
WEIGHTS = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"}


def request(stage: str, job_name: str | None = None) -> dict:
    asked = json.loads(os.environ.get(REQUEST_ENV) or "{}")
    own = asked.get("jobs", {}).get(job_name, {})
    return {**_for_stage(asked, stage), **_for_stage(own, stage)}


def _for_stage(asked: dict, stage: str) -> dict:
    return {**{k: v for k, v in asked.items() if k not in (*STAGES.values(), "jobs")}, **asked.get(stage, {})}


def grpo_values(step: int, max_steps: int, seed: int, rewards: list[str], asked: dict) -> dict:
    """A step's record as TRL logs it: the reward rising over the run, some spread in every group."""
    reward = round(0.2 + 0.6 * step / max_steps + 0.01 * (seed % 7), 6)
    values = {
        "loss": round(0.05 + 0.01 * math.sin(step + seed), 6),
        "grad_norm": 0.5,
        "learning_rate": 1e-5,
        "num_tokens": 64.0 * step,
        "completions/mean_length": 5.0,
        "completions/clipped_ratio": 0.0,
        **{f"rewards/{name}/mean": reward for name in rewards},
        **{f"rewards/{name}/std": 0.3 for name in rewards},
        "reward": reward,
        "reward_std": 0.3,
        "frac_reward_zero_std": 0.0,
        "entropy": 1.5,
        "step_time": 0.01,
        "epoch": step / max_steps,
    }
    return {**values, **asked.get("values", {})}


def first_rows(job: JobDir, n: int) -> list[dict]:
    """The first `n` training rows of the job's dataset (the Arrow files `datasets` saved), read with pyarrow."""
    import pyarrow as pa

    train = job.dataset / "train"
    files = json.loads((train / "state.json").read_text())["_data_files"]
    with pa.memory_map(str(train / files[0]["filename"])) as source:
        return pa.ipc.open_stream(source).read_all().slice(0, n).to_pylist()


class Rewards:
    """The job's rewards (reward models aside), built and guarded as the real child builds them, called once a step
    on one group of canned completions: a reward that raises, hangs or returns a bad value stops the stand-in as it
    stops the real child (exit 3, the guard's message); what each returns is its `rewards/<name>/mean`."""

    def __init__(self, job: JobDir, spec, completion: str | None = None):
        self.spec, timeout = spec, spec.health.reward_timeout_s
        self.scores: dict[str, list] = {}  # the last step's, by reward
        self.funcs = [
            (r.name, guarded_reward(build_reward(r.name, r.function, r.kwargs), r.name, timeout))
            for r in spec.rewards
            if r.model is None and r.grader is None  # a reward model or a grader: what the real child scores with
        ]
        rows = first_rows(job, spec.hyperparameters.rollouts_per_prompt) if self.funcs else []
        column = spec.dataset.prompt_column
        self.columns = {k: [row.get(k) for row in rows] for k in (rows[0] if rows else {}) if k != column}
        self.prompts = [row[column] for row in rows]
        # Half the group answers right (the answer column, where there is one), half does not.
        answers = self.columns.get("answer") or ["42"] * len(rows)
        texts = [completion or (str(a) if i % 2 == 0 else "no") for i, a in enumerate(answers)]
        chat = bool(self.prompts) and isinstance(self.prompts[0], list)
        self.completions = [[{"role": "assistant", "content": t}] for t in texts] if chat else texts

    def __call__(self, step: int) -> dict:
        state = SimpleNamespace(global_step=step - 1, max_steps=self.spec.hyperparameters.max_steps)
        means = {}
        for name, func in self.funcs:
            values = func(prompts=self.prompts, completions=self.completions, trainer_state=state, **self.columns)
            self.scores[name] = values
            scored = [v for v in values if v is not None]
            means[f"rewards/{name}/mean"] = sum(scored) / len(scored) if scored else None
        return means

    def keep(self, job: JobDir, step: int) -> None:
        """The step's rollouts file, in the real child's columns (grpoflow.trainers.rollouts)."""
        from grpoflow.trainers.rollouts import rollout_columns, step_file, write_rows

        if self.spec.rollouts.every and step % self.spec.rollouts.every == 0 and self.completions:
            n = len(self.completions)
            logged = {"prompt": self.prompts, "completion": self.completions, "advantages": [0.0] * n}
            logged["rewards"] = {r.name: self.scores.get(r.name, [None] * n) for r in self.spec.rewards}
            weights = [r.weight for r in self.spec.rewards]
            write_rows(step_file(job.rollouts, step), rollout_columns(step, logged, weights, n, None))


def fault(job: JobDir, stage: str, step: int, asked: dict) -> int | None:
    """Does what `asked` says should happen after `step`; an exit code when the child is to stop there."""
    if step >= asked.get("crash_at", sys.maxsize):
        marker = job.logs / f"standin-{stage}-crashes"
        crashed = int(marker.read_text()) if marker.exists() else 0
        if crashed < asked.get("crashes", sys.maxsize):
            marker.write_text(str(crashed + 1))
            print(f"the training child is killed at step {step}", flush=True)
            if asked.get("kill") == "flow":
                os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
    if step == asked.get("exit_at"):
        message = asked.get("message", f"the stand-in stops at step {step}")
        print(f"grpoflow: {message}", file=sys.stderr, flush=True)
        return record_exit(job, asked.get("exit_code", 2), message)
    if step == asked.get("hang_at"):
        print(f"the training child hangs after step {step}", flush=True)
        while True:
            time.sleep(1)
    return None


def copy_model(source: str, dest: Path, weights: bool = True) -> None:
    """The model folder `source` (its weights only with `weights`) to `dest`, written beside it and renamed in."""
    staging = dest.with_name(f".{dest.name}-staging")
    shutil.rmtree(staging, ignore_errors=True)
    ignore = None if weights else shutil.ignore_patterns(*WEIGHTS, "config.json", "generation_config.json")
    shutil.copytree(source, staging, ignore=ignore)
    replace_dir(staging, dest)


def save_adapter(model_path: str, dest: Path, rank: int, alpha: int | None) -> list[str]:
    """A LoRA adapter for the model at `model_path` as PEFT saves one, on its q/v projections (or every projection
    LORA_TARGETS names that it has), with PEFT's initialisation: random `lora_A`, zero `lora_B`."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file

    tensors, targets = {}, set()
    with safe_open(str(Path(model_path) / "model.safetensors"), framework="numpy") as weights:
        names = [n for n in weights.keys() if n.endswith("_proj.weight")]
        wanted = {"q_proj", "v_proj"} & {n.split(".")[-2] for n in names} or set(LORA_TARGETS)
        rng = np.random.default_rng(0)
        for name in names:
            if (module := name.split(".")[-2]) in wanted:
                out_features, in_features = weights.get_slice(name).get_shape()
                prefix = "base_model.model." + name.removesuffix(".weight")
                tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.02, (rank, in_features)).astype(np.float32)
                tensors[f"{prefix}.lora_B.weight"] = np.zeros((out_features, rank), dtype=np.float32)
                targets.add(module)
    staging = dest.with_name(f".{dest.name}-staging")
    shutil.rmtree(staging, ignore_errors=True)
    copy_model(model_path, staging, weights=False)  # the tokenizer files, as save_model writes them
    save_file(tensors, str(staging / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": model_path,
        "r": rank,
        "lora_alpha": alpha or rank,
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "bias": "none",
        "inference_mode": True,
    }
    (staging / "adapter_config.json").write_text(json.dumps(config, indent=2))
    replace_dir(staging, dest)
    return sorted(targets)


def rotate_checkpoints(job: JobDir, keep: int | None) -> None:
    """Deletes all but the newest `keep` checkpoints, as TRL's trainer does with `save_total_limit`."""
    saved = sorted(job.checkpoints.glob("checkpoint-*"), key=checkpoint_step)
    for old in saved[: -keep if keep else 0]:
        shutil.rmtree(old, ignore_errors=True)


def grpo(job: JobDir, spec) -> int:
    asked, hp = request("grpo", spec.name), spec.hyperparameters
    started = time.monotonic()
    job.checkpoints.mkdir(exist_ok=True)  # as TRL's trainer makes its output_dir, before it trains
    checkpoint = resume_checkpoint(job)
    done = checkpoint_step(checkpoint) if checkpoint else 0
    rewards = Rewards(job, spec, asked.get("completion"))
    say_phase(f"loading the model {spec.base_model} (the stand-in's)")  # the real child's phase lines, in its order
    time.sleep(asked.get("load_seconds", 0))
    say_phase(f"model loaded in {asked.get('load_seconds', 0):.1f} s; {first_step_line(spec, checkpoint)}")
    last = min(hp.max_steps, asked.get("budget_stop_at", hp.max_steps))
    for step in range(done + 1, last + 1):
        time.sleep(asked.get("step_seconds", 0.02))
        try:
            scores = rewards(step)
        except RewardError as e:
            print(f"grpoflow: {e}", file=sys.stderr, flush=True)
            return record_exit(job, REWARD_FAILED_EXIT, str(e))
        values = grpo_values(step, hp.max_steps, hp.seed, [r.name for r in spec.rewards], asked)
        values.update(scores)
        rewards.keep(job, step)
        with job.metrics.open("a") as f:
            f.write(json.dumps({"step": step, "values": values}) + "\n")
        if step % spec.checkpoint_every == 0 or step == last:
            state = {"global_step": step, "max_steps": hp.max_steps, "log_history": [{"step": step, **values}]}
            write_json_atomic(job.checkpoints / f"checkpoint-{step}" / "trainer_state.json", state)
            rotate_checkpoints(job, spec.trl.get("save_total_limit", GRPO_DEFAULTS["save_total_limit"]))
        if (code := fault(job, "grpo", step, asked)) is not None:
            return code
    if asked.get("no_result"):
        return 0
    model_path = start_model(spec, job)
    what = "the adapter to adapter/" if hp.lora_rank else "the weights to merged/"
    say_phase(f"saving {what}", after_step=last)
    if hp.lora_rank:
        targets, target = save_adapter(model_path, job.adapter, hp.lora_rank, hp.lora_alpha), job.adapter
    else:
        targets, target = None, job.merged
        copy_model(model_path, job.merged)
    seconds = round(time.monotonic() - started, 3)
    summary = {
        "artifact_dir": target.name,
        "start_model": model_path,
        "resumed_from": Path(checkpoint).name if checkpoint else None,
        "global_step": last,
        "selected_step": last,
        "setup_seconds": 0.0,
        "train_seconds": seconds,
        "train_runtime": seconds,
        "lora_target_modules": targets,
        "lora_target_parameters": [] if targets else None,  # builtin:tiny is no mixture of experts
        "trainable_parameters": 1000 if targets else 330240,
        "total_parameters": 330240,
        **budget_summary(spec, job, last if last < hp.max_steps else None),
        "rollouts": {"files": len(list((job.root / "rollouts").glob("step-*.parquet"))), "loop_seconds": 0.0},
    }
    write_json_atomic(job.training_result, summary)
    return 0


def sft(job: JobDir, spec) -> int:
    asked = request("sft", spec.name)
    path = job.root / "sft_metrics.jsonl"
    path.unlink(missing_ok=True)  # it keeps no checkpoint: a start is from step 0, as the real child's without one
    say_phase(f"loading the model {spec.base_model} (the stand-in's)")  # the real child's phase lines, in its order
    say_phase(f"model loaded; training {spec.sft.max_steps} steps")
    for step in range(1, spec.sft.max_steps + 1):
        time.sleep(asked.get("step_seconds", 0.02))
        values = {"loss": round(2.0 / step, 6), "learning_rate": spec.sft.learning_rate, **asked.get("values", {})}
        with path.open("a") as f:
            f.write(json.dumps({"step": step, "values": values}) + "\n")
        if (code := fault(job, "sft", step, asked)) is not None:
            return code
    time.sleep(asked.get("save_seconds", 0))
    say_phase(f"saving the warmed-up weights to {job.sft.name}/")
    staging = job.root / ".sft-staging"
    shutil.rmtree(staging, ignore_errors=True)
    copy_model(resolve_model_path(spec.base_model), staging)
    nudge_weights(staging / "model.safetensors")
    replace_dir(staging, job.sft)
    return 0


def nudge_weights(path: Path) -> None:
    """Adds 1e-3 to every floating-point weight of the safetensors file `path`: a model that differs from its base,
    as the SFT warm-up's output does."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    save_file(
        {k: v + 1e-3 if np.issubdtype(v.dtype, np.floating) else v for k, v in tensors.items()},
        str(path),
        metadata={"format": "pt"},
    )


def main(module: str, job_root: str) -> int:
    print(f"grpoflow: {module} started on {job_root} (the tests' stand-in)", flush=True)
    job = JobDir(Path(job_root))
    job.logs.mkdir(parents=True, exist_ok=True)
    spec, _ = load_spec(job.spec)
    return sft(job, spec) if STAGES[module] == "sft" else grpo(job, spec)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
