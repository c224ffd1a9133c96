"""The GRPO training stage (`grpoflow.trainers.grpo`): the spec mapped onto TRL's GRPOConfig, checkpoints and resume,
and a real run on builtin:tiny that trains, saves merged/ or adapter/, and resumes; the slow test kills the child with
SIGKILL and checks that it resumes bit-exactly."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.trainers import grpo
from grpoflow.trainers.dataset import ingest_dataset
from grpoflow.trainers.grpo import grpo_config, intact_checkpoint, resume_checkpoint
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.tiny import build_tiny
from grpoflow.trainers.rollouts import kept_steps, read_rows, step_file
from tests.conftest import arithmetic_rows, write_jsonl
from tests.trainers.test_held_out import VARIETY
from tests.trainers.test_rollouts import check_rollouts, same_rollouts

# --- the spec mapped onto GRPOConfig -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, expected",
    [
        # One optimizer step = one prompt's group of rollouts_per_prompt completions, on one process.
        (
            {"hyperparameters": {"rollouts_per_prompt": 4}},
            {"num_generations": 4, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1},
        ),
        # The spec's names for TRL's fields.
        (
            {"hyperparameters": {"kl_coef": 0.05, "max_response_length": 6, "learning_rate": 1e-3, "max_steps": 3}},
            {"beta": 0.05, "max_completion_length": 6, "learning_rate": 1e-3, "max_steps": 3},
        ),
        # Checkpoints every checkpoint_every steps, the last two kept; seed for sampling and data order alike.
        (
            {"checkpoint_every": 2, "hyperparameters": {"seed": 7}},
            {"save_steps": 2, "save_total_limit": 2, "seed": 7, "data_seed": 7},
        ),
        # One weight per reward, in the spec's order.
        (
            {"rewards": [{"name": "exact_answer", "weight": 2.0}, {"name": "length_penalty", "weight": 0.5}]},
            {"reward_weights": [2.0, 0.5]},
        ),
        # Every step logged (metrics.jsonl has each), nothing reported elsewhere unless tracking asks; no
        # evaluation during training unless evaluation.every asks.
        ({}, {"logging_steps": 1, "report_to": [], "gradient_checkpointing": False, "eval_strategy": "no"}),
        # evaluation.every: the Trainer's evaluation every that many steps; select: best keeps the best checkpoint,
        # saved at every evaluation.
        (
            {"evaluation": {"every": 3}, "hyperparameters": {"max_steps": 9}},
            {"eval_strategy": "steps", "eval_steps": 3, "save_steps": 1, "load_best_model_at_end": False},
        ),
        (
            {"evaluation": {"every": 3, "select": "best"}, "hyperparameters": {"max_steps": 9}},
            {"eval_steps": 3, "save_steps": 3, "load_best_model_at_end": True},
        ),
        (
            {"evaluation": {"every": 3, "select": "best", "metric": "length_penalty"}},
            {"metric_for_best_model": "eval_length_penalty", "greater_is_better": True},
        ),
        # tracking: the trackers, the project (trackio's), the run named after the job unless named, completions.
        (
            {"tracking": {"report_to": ["tensorboard"]}},
            {"report_to": ["tensorboard"], "run_name": "job", "log_completions": False},  # no tables in TensorBoard
        ),
        (
            {"tracking": {"project": "p", "run_name": "r", "log_completions": True, "num_completions_to_print": 2}},
            {"project": "p", "run_name": "r", "log_completions": True, "num_completions_to_print": 2},
        ),
        # A tracker that shows tables gets the rollouts' rows through TRL's log_completions, the log a glimpse of
        # them; none when the job keeps no rollouts, and all of them printed where the user asked for that.
        (
            {"tracking": {"report_to": ["trackio"]}},
            {"report_to": ["trackio"], "log_completions": True, "num_completions_to_print": 2},
        ),
        ({"tracking": {"report_to": ["trackio"]}, "rollouts": {"every": 0}}, {"log_completions": False}),
        (
            {"tracking": {"report_to": ["trackio"], "log_completions": True}},
            {"log_completions": True, "num_completions_to_print": None},
        ),
        ({}, {"log_completions": False}),
    ],
)
def test_grpo_config(make_spec, tmp_path, changes, expected):
    # (gpu_count > 1 splits the group over the processes; GRPOConfig checks that against the world size, so
    # tests/trainers/test_launch.py shows it on two real processes.)
    spec, _ = load_spec(make_spec("cfg", **changes))
    job = JobDir(tmp_path / "job")
    config = grpo_config(spec, job)
    assert {k: getattr(config, k) for k in expected} == expected
    assert config.output_dir == str(job.checkpoints)


TRL_BLOCK = {"loss_type": "dr_grpo", "scale_rewards": "none", "num_iterations": 2, "epsilon_high": 0.28}
TRL_BLOCK |= {"lr_scheduler_type": "constant"}


def test_trl_block_reaches_grpo_config(make_spec, tmp_path):
    spec, _ = load_spec(make_spec("trl", trl=TRL_BLOCK))
    config = grpo_config(spec, JobDir(tmp_path / "job"))
    assert {k: getattr(config, k) for k in TRL_BLOCK} == {**TRL_BLOCK, "lr_scheduler_type": "constant"}
    # grpoflow's own defaults give way to the block; the spec's fields stay the spec's.
    spec, _ = load_spec(make_spec("trl2", trl={"gradient_checkpointing": True, "save_total_limit": 5}))
    config = grpo_config(spec, JobDir(tmp_path / "job"))
    assert (config.gradient_checkpointing, config.save_total_limit, config.num_generations) == (True, 5, 4)
    assert config.activation_checkpointing  # the deprecated name given still turns it on
    spec, _ = load_spec(make_spec("trl3", trl={"activation_checkpointing": True}))
    assert grpo_config(spec, JobDir(tmp_path / "job")).activation_checkpointing


def test_grpo_config_says_no_deprecation(make_spec, tmp_path):
    # grpoflow's default turns checkpointing off by transformers' own name: no FutureWarning at every config (and so
    # in every training log) about the alias TRL still defaults to True.
    spec, _ = load_spec(make_spec("quiet"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = grpo_config(spec, JobDir(tmp_path / "job"))
    assert config.activation_checkpointing is False and config.gradient_checkpointing is False
    assert [str(w.message) for w in caught if "checkpointing" in str(w.message)] == []


def test_every_field_grpo_config_sets_is_owned_by_the_spec(make_spec, tmp_path):
    # The rejection table of trl: (rules.py) and what grpo_config sets cannot drift apart.
    from grpoflow.core.spec.hyperparameters import Hyperparameters
    from grpoflow.core.spec.rules import TRL_SET_BY_GRPOFLOW, trl_spec_keys
    from grpoflow.core.spec.trl_fields import trl_fields

    spec, _ = load_spec(make_spec("own"))
    owned = set(trl_spec_keys(Hyperparameters)) | set(TRL_SET_BY_GRPOFLOW)
    unset = {"num_train_epochs"}  # owned, yet left to TRL: max_steps wins over it
    # Set only with generation.engine vllm (server mode: its URL); the old name of continuous batching; the
    # strategy's fields, which accelerate launch's config sets.
    unset |= {"vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_server_base_url"}
    unset |= {"vllm_server_host", "vllm_server_port", "use_transformers_paged", "fsdp", "fsdp_config", "deepspeed"}
    # Set only with evaluation.every > 0 (and select: best); eval_on_start never (the before score is step 0).
    unset |= {"eval_strategy", "eval_steps", "eval_on_start", "load_best_model_at_end", "metric_for_best_model"}
    unset |= {"greater_is_better"}
    assert set(grpo.owned_args(spec, JobDir(tmp_path / "job"))) == (owned & set(trl_fields()["fields"])) - unset
    assert not set(grpo.GRPO_DEFAULTS) & owned


# Values unlike every default, so that a hyperparameter that did not reach GRPOConfig shows.
UNLIKE_DEFAULTS = {"learning_rate": 3e-5, "max_steps": 7, "rollouts_per_prompt": 6, "kl_coef": 0.04, "seed": 11,
                   "max_response_length": 33, "temperature": 0.7}  # fmt: skip


def test_every_hyperparameter_reaches_grpo_config_or_is_grpoflow_only(make_spec, tmp_path):
    from grpoflow.core.spec.hyperparameters import Hyperparameters
    from grpoflow.core.spec.rules import trl_markers
    from grpoflow.core.spec.trl_fields import trl_fields

    markers = trl_markers(Hyperparameters)
    assert [name for name, marker in markers.items() if marker is None] == []  # each says where it goes
    fields = trl_fields()["fields"]
    for name, marker in markers.items():
        assert set(marker.names) <= set(fields), name  # a real GRPOConfig field of the pinned TRL
    spec, _ = load_spec(make_spec("marked", hyperparameters=UNLIKE_DEFAULTS))
    config = grpo.grpo_config(spec, JobDir(tmp_path / "job"))
    for field, marker in markers.items():
        for trl_name in marker.names if marker.copied else ():
            assert getattr(config, trl_name) == getattr(spec.hyperparameters, field), (field, trl_name)
    assert config.num_generations == 6 and config.beta == 0.04 and config.data_seed == 11


@pytest.mark.parametrize(
    "hyperparameters, gpu_count, per_device",
    [
        ({"rollouts_per_prompt": 4}, 1, 4),  # the default: one prompt's group per step
        ({"rollouts_per_prompt": 4, "prompts_per_step": 3}, 1, 12),  # three groups, one process
        ({"rollouts_per_prompt": 4, "prompts_per_step": 3}, 2, 6),  # split evenly over two processes
    ],
)
def test_prompts_per_step_sets_the_batch(make_spec, tmp_path, hyperparameters, gpu_count, per_device):
    spec, _ = load_spec(make_spec("pps", hyperparameters=hyperparameters, gpu_count=gpu_count))
    args = grpo.owned_args(spec, JobDir(tmp_path / "job"))
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (per_device, 1)
    completions = hyperparameters["rollouts_per_prompt"] * hyperparameters.get("prompts_per_step", 1)
    assert args["per_device_train_batch_size"] * gpu_count * args["gradient_accumulation_steps"] == completions


def test_trl_block_trains(make_job):
    job, spec = make_job("trlrun", hyperparameters={"max_steps": 2}, trl=TRL_BLOCK)
    assert "loss_type: dr_grpo" in job.spec.read_text()  # the resolved spec.yaml shows what was passed
    assert grpo.main(str(job.root)) == 0
    records = read_metrics(job.metrics)
    assert [r["step"] for r in records] == [1, 2]
    # num_iterations 2: the second step trains again on the first step's completions, so TRL logs no new reward
    # for it, and its policy now differs from the one that sampled them (clipping, with epsilon_high, can happen).
    assert "reward" in records[0]["values"] and "reward" not in records[1]["values"]
    assert {"loss", "clip_ratio/region_mean"} <= records[1]["values"].keys()
    assert [r["values"]["learning_rate"] for r in records] == [1e-3, 1e-3]  # constant
    # metrics.jsonl holds the history: the checkpoint's trainer_state.json keeps the latest record, not all again.
    state = json.loads((job.checkpoints / "checkpoint-2" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"]] == [2]


def test_prompts_per_step_trains_on_several_groups(make_job):
    job, _ = make_job("pps2", hyperparameters={"max_steps": 2, "prompts_per_step": 2}, checkpoint_every=2)
    assert grpo.main(str(job.root)) == 0
    records = read_metrics(job.metrics)
    assert [r["step"] for r in records] == [1, 2]  # still one line per optimizer step
    one, _ = make_job("pps1", hyperparameters={"max_steps": 2}, checkpoint_every=2)
    assert grpo.main(str(one.root)) == 0
    # Each step saw 2 groups of 4 completions: about twice the tokens of one group per step.
    tokens = [r["values"]["num_tokens"] for r in records]
    single = [r["values"]["num_tokens"] for r in read_metrics(one.metrics)]
    assert tokens[1] - tokens[0] > 1.5 * (single[1] - single[0])


@pytest.mark.parametrize(
    "tracking, message",
    [
        # Only transformers' integrations, by their names (comet's is comet_ml): the message lists them.
        ({"report_to": ["comet"]}, "tracking.report_to[0]: must be 'azure_ml', 'comet_ml', 'mlflow', 'neptune', "),
        # Any of them is taken, e.g. clearml, and named with what to install when it is missing.
        ({"report_to": ["clearml"]}, "clearml (pip install clearml)"),
        # A tracker that is not installed is named with what to install (wandb is not a test dependency).
        ({"report_to": ["wandb"]}, "wandb (pip install wandb)"),
        # Secrets never go in the spec: there is no field for one.
        ({"api_key": "x"}, "tracking.api_key"),
    ],
)
def test_tracking_rejected(make_spec, tracking, message):
    from grpoflow.core.spec import SpecError

    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(make_spec("trk", tracking=tracking))


def test_tensorboard_writes_the_reward_into_the_job_folder(make_job, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "unset")  # restored after the run set it to the job's folder
    job, _ = make_job(
        "tb", hyperparameters={"max_steps": 2}, tracking={"report_to": ["tensorboard"]}, evaluation={"every": 1}
    )
    assert grpo.main(str(job.root)) == 0
    assert list((job.root / "tracking").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(job.root / "tracking"))
    events.Reload()
    rewards = events.Scalars("train/reward")
    assert [e.step for e in rewards] == [1, 2]
    assert [e.value for e in rewards] == pytest.approx([r["values"]["reward"] for r in read_metrics(job.metrics)])
    # the held-out score during training (evaluation.every) is a tracker curve of its own
    held_out = events.Scalars("eval/exact_answer")
    assert [e.step for e in held_out] == [1, 2]
    assert [e.value for e in held_out] == pytest.approx(
        [r["values"]["eval/exact_answer"] for r in read_metrics(job.metrics)]
    )


def trackio_tables(tracking_dir: Path, project: str, run: str) -> list[list[dict]]:
    """The completions tables trackio holds for `run` (each a list of rows), as its own command line prints them."""
    done = subprocess.run(
        [sys.executable, "-m", "trackio.cli", "get", "metric", "--project", project, "--run", run,
         "--metric", "completions", "--json"],
        env={**os.environ, "TRACKIO_DIR": str(tracking_dir)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return [logged["value"]["_value"] for logged in json.loads(done.stdout)["values"]]


def test_trackio_gets_the_rows_of_rollouts(make_job, tmp_path):
    # tracking.report_to: [trackio] turns TRL's log_completions on: its table of each step reaches trackio (a local
    # tracker: a SQLite store, here in tmp_path) with the very rows rollouts/ keeps.
    # make install installs trackio (no skip where it is missing: the Makefile says why it comes without its deps)
    job, _ = make_job("trk", hyperparameters={"max_steps": 2}, tracking={"report_to": ["trackio"], "project": "p"})
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    done = subprocess.run(
        [sys.executable, "-m", "grpoflow.trainers.grpo", str(job.root)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # One table per step (TRL logs the last one again with its end-of-training record: the same rows).
    tables = {table[0]["step"]: table for table in trackio_tables(tmp_path / "trackio", "p", job.job_id)}
    tracked = [row for step in sorted(tables) for row in tables[step]]
    kept = [row for step in kept_steps(job.rollouts) for row in read_rows(step_file(job.rollouts, step))]
    fields = ("step", "prompt", "completion", "completion_tokens", "truncated")
    assert [[r[f] for f in fields] for r in tracked] == [[r[f] for f in fields] for r in kept]
    assert [r["advantage"] for r in tracked] == pytest.approx([r["advantage"] for r in kept])
    for name in ("exact_answer", "length_penalty"):
        assert [r[name] for r in tracked] == pytest.approx([r[f"rewards.{name}"] for r in kept])
    assert len(kept) == 2 * 4  # every completion of both steps
    # The child's log gets TRL's console sample of each step (num_completions_to_print: 2 of its rows).
    assert "Step 1" in done.stdout and "Step 2" in done.stdout


# --- checkpoints ---------------------------------------------------------------------------------------------------


def checkpoint(job: JobDir, step: int, state: str | None = None) -> Path:
    folder = job.checkpoints / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if state is None:
        state = json.dumps({"global_step": step})
    if state:
        (folder / "trainer_state.json").write_text(state)
    return folder


@pytest.mark.parametrize(
    "state, intact",
    [
        (None, True),  # trainer_state.json written last, with the folder's step: a finished save
        ("", False),  # killed before trainer_state.json was written
        ('{"global_step": 1', False),  # killed while writing it
        (json.dumps({"global_step": 4}), False),  # a step that is not the folder's (a stale file)
        (json.dumps({"best_metric": None}), False),  # no step at all
    ],
)
def test_intact_checkpoint(tmp_path, state, intact):
    assert intact_checkpoint(checkpoint(JobDir(tmp_path), 5, state)) is intact


def test_no_checkpoints_means_a_fresh_start(tmp_path):
    assert resume_checkpoint(JobDir(tmp_path / "job")) is None


def test_torn_checkpoint_is_skipped(tmp_path):
    job = JobDir(tmp_path / "job")
    for step in (5, 10):
        checkpoint(job, step)
    # A kill during the save of checkpoint-15: the model is there, trainer_state.json (written last) is truncated.
    torn = checkpoint(job, 15, '{"global_step": 1')
    (torn / "model.safetensors").write_bytes(b"\0" * 64)
    job.metrics.write_text("".join(json.dumps({"step": s, "values": {}}) + "\n" for s in range(1, 16)))

    assert resume_checkpoint(job) == str(job.checkpoints / "checkpoint-10")
    assert not torn.exists()
    assert [r["step"] for r in read_metrics(job.metrics)] == list(range(1, 11))  # steps 11-15 will be logged again


def test_only_torn_checkpoints_start_over(tmp_path):
    job = JobDir(tmp_path / "job")
    checkpoint(job, 5, "")
    job.metrics.write_text(json.dumps({"step": 1, "values": {}}) + "\n")
    assert resume_checkpoint(job) is None
    assert read_metrics(job.metrics) == [] and not (job.checkpoints / "checkpoint-5").exists()


def test_other_ranks_only_look(tmp_path):
    job = JobDir(tmp_path / "job")
    checkpoint(job, 5)
    torn = checkpoint(job, 10, "")
    job.metrics.write_text("".join(json.dumps({"step": s, "values": {}}) + "\n" for s in range(1, 11)))
    assert resume_checkpoint(job, tidy=False) == str(job.checkpoints / "checkpoint-5")
    assert torn.exists() and len(read_metrics(job.metrics)) == 10  # the main process tidies, once


# --- a real run on builtin:tiny ------------------------------------------------------------------------------------

STEP_KEYS = {"reward", "reward_std", "loss", "completions/mean_length", "entropy"}  # docs/design.md's metrics.jsonl


def weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def test_full_finetune_trains_saves_and_resumes(make_job):
    job, spec = make_job("full", hyperparameters={"max_steps": 2}, checkpoint_every=1)
    assert grpo.main(str(job.root)) == 0

    records = read_metrics(job.metrics)
    assert [r["step"] for r in records] == [1, 2]
    assert all(STEP_KEYS <= r["values"].keys() and "kl" not in r["values"] for r in records)  # kl_coef 0: no kl
    base, trained = weights(build_tiny()), weights(job.merged)
    assert any(not torch.equal(base[k], trained[k]) for k in base)  # training changed the parameters
    assert AutoModelForCausalLM.from_pretrained(job.merged).config.model_type == "qwen2"
    assert (job.merged / "tokenizer.json").exists()  # saved with its tokenizer
    result = json.loads(job.training_result.read_text())
    assert (result["artifact_dir"], result["global_step"], result["resumed_from"]) == ("merged", 2, None)
    assert result["evaluated_in_training"] and json.loads(job.evaluation.read_text())["n"] == 4
    check_rollouts(job, spec, records)  # rollouts/ and evaluation/: what the model wrote, as TRL scored it

    # Killed after the final checkpoint (before training.json): the retry trains nothing more, exactly max_steps.
    trained_before = weights(job.merged)
    job.training_result.unlink()
    assert grpo.main(str(job.root)) == 0
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]
    result = json.loads(job.training_result.read_text())
    assert (result["resumed_from"], result["global_step"], result["train_runtime"]) == ("checkpoint-2", 2, 0.0)
    assert all(torch.equal(trained_before[k], v) for k, v in weights(job.merged).items())  # the checkpoint's weights

    # A longer run of the same job resumes from the newest checkpoint: each step once.
    more = spec.model_copy(update={"hyperparameters": spec.hyperparameters.model_copy(update={"max_steps": 3})})
    job.spec.write_text(to_yaml(more))
    assert grpo.main(str(job.root)) == 0
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2, 3]
    result = json.loads(job.training_result.read_text())
    assert (result["resumed_from"], result["global_step"]) == ("checkpoint-2", 3)


def test_lora_with_kl_saves_the_adapter(make_job):
    job, _ = make_job("lora", hyperparameters={"max_steps": 2, "lora_rank": 4, "kl_coef": 0.1})
    assert grpo.main(str(job.root)) == 0
    assert all("kl" in r["values"] for r in read_metrics(job.metrics))  # kl exactly when kl_coef > 0
    config = json.loads((job.adapter / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(build_tiny())
    assert (job.adapter / "tokenizer.json").exists() and not job.merged.exists()  # the merge stage makes merged/
    result = json.loads(job.training_result.read_text())
    assert result["artifact_dir"] == "adapter" and "evaluation" not in result  # evaluated after the merge


@pytest.mark.skipif(torch.cuda.is_available(), reason="use_liger can run where CUDA is")
def test_a_setup_problem_exits_2_before_training(make_job, capsys):
    job, _ = make_job("liger", hyperparameters={"use_liger": True})
    assert grpo.cli([str(job.root)]) == 2  # the task reads 2 as "a retry cannot help"
    assert "grpoflow: use_liger=true needs a CUDA GPU" in capsys.readouterr().err
    assert not job.metrics.exists() and not job.training_result.exists()


def test_scoring_during_training_without_a_held_out_split_names_both_ways_to_one(make_job, capsys):
    from datasets import DatasetDict, load_from_disk

    job, _ = make_job("noeval", evaluation={"every": 1})
    # A job folder ingested without its held-out split.
    DatasetDict({"train": load_from_disk(str(job.dataset))["train"]}).save_to_disk(str(job.root / "train-only"))
    shutil.rmtree(job.dataset)
    (job.root / "train-only").rename(job.dataset)
    assert grpo.cli([str(job.root)]) == 2
    err = capsys.readouterr().err
    assert "evaluation.every: the dataset/ folder has no held-out split" in err
    assert "evaluation.holdout" in err and "evaluation.dataset" in err
    assert not job.metrics.exists()


# --- crash safety (slow) -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_and_resumed_matches_uninterrupted(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(40))
    spec, _ = load_spec(
        {
            "name": "det",
            "base_model": "builtin:tiny",
            "dataset": {"uri": str(data)},
            "rewards": [{"name": "exact_answer"}, {"name": "length_penalty", "kwargs": {"max_chars": 4}}],
            "hyperparameters": {"max_steps": 6, "rollouts_per_prompt": 4, "max_response_length": 8},
            "checkpoint_every": 3,
            # Held-out scores every 3 steps and the best checkpoint kept: the resumed run scores and selects the same.
            "evaluation": {"holdout": 8, "every": 3, "select": "best", "metric": VARIETY},
        }
    )

    def job(name: str) -> JobDir:
        j = JobDir(tmp_path / name)
        shutil.rmtree(j.root, ignore_errors=True)
        j.root.mkdir()
        j.spec.write_text(to_yaml(spec))
        ingest_dataset(spec.dataset.uri, j.dataset, holdout=spec.evaluation.holdout, seed=spec.hyperparameters.seed)
        return j

    def child(j: JobDir) -> subprocess.Popen:
        log = (j.root / "train.log").open("ab")
        return subprocess.Popen([sys.executable, "-m", "grpoflow.trainers.grpo", str(j.root)], stdout=log, stderr=log)

    # The uninterrupted run through the child's entry in this process (TRL imported once); the killed one as a child.
    straight = job("straight")
    assert grpo.cli([str(straight.root)]) == 0

    killed = job("killed")
    proc = child(killed)
    while not read_metrics(killed.metrics) or read_metrics(killed.metrics)[-1]["step"] < 4:  # past checkpoint-3
        assert proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert child(killed).wait() == 0

    a, b = read_metrics(straight.metrics), read_metrics(killed.metrics)
    assert [r["step"] for r in b] == list(range(1, 7))
    drop = {"step_time", "eval/seconds"}  # wall-clock, the only values allowed to differ
    assert [{k: v for k, v in r["values"].items() if k not in drop} for r in a] == [
        {k: v for k, v in r["values"].items() if k not in drop} for r in b
    ]
    assert [r["step"] for r in b if "eval/variety" in r["values"]] == [3, 6]
    # Each step's rollouts file once, row for row the uninterrupted run's; the held-out completions too.
    same_rollouts(straight, killed)
    check_rollouts(killed, spec, b)
    assert kept_steps(killed.evaluation_rollouts) == [0, 3, 6]
    wa, wb = load_file(Path(straight.merged) / "model.safetensors"), load_file(killed.merged / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    selected = [json.loads(j.training_result.read_text())["selected_step"] for j in (straight, killed)]
    assert selected[0] == selected[1]
    assert [json.loads(j.evaluation.read_text())["series"] for j in (straight, killed)][0] == json.loads(
        killed.evaluation.read_text()
    )["series"]
