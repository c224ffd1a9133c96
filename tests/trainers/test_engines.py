"""The rollout engine (`generation:`) and the sharding strategy (`distributed:`): what reaches TRL and accelerate,
what is refused on a machine that cannot run it, and real runs: paged generation here, the sharded strategies on two
GPUs (`gpu`-marked). FSDP2 cannot run on CPU processes: accelerate 1.15 turns an FSDP config on CPU into plain data
parallel (MULTI_CPU; accelerate/state.py enables FSDP for accelerator types only), which grpoflow refuses (exit 2)
rather than train unsharded."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from grpoflow.core.errors import RewardFailed, SetupError, TrainingSetupError
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec
from grpoflow.jobs.launch import accelerate_command, child_command
from grpoflow.jobs.vllm_server import server_command, split_gpus, starts_server, vllm_server
from grpoflow.trainers import grpo
from grpoflow.trainers.child import VLLM_SERVER_URL_ENV, record_exit
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.load import check_accelerators

real_child_command = child_command  # before a test replaces grpoflow.jobs.launch.child_command
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without CUDA")


@pytest.mark.parametrize(
    ("generation", "expected"),
    [
        ({}, {"use_vllm": False, "use_transformers_continuous_batching": False}),
        ({"engine": "paged"}, {"use_vllm": False, "use_transformers_continuous_batching": True}),
        (
            {"engine": "vllm", "gpu_memory_utilization": 0.5},
            {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5},
        ),
        (
            {"engine": "vllm", "vllm_mode": "server", "vllm_server_url": "http://10.0.0.5:8000"},
            {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://10.0.0.5:8000"},
        ),
    ],
)
def test_generation_reaches_grpo_config(make_spec, tmp_path, generation, expected):
    spec, _ = load_spec(make_spec("gen", generation=generation))
    config = grpo.grpo_config(spec, JobDir(tmp_path / "job"))
    assert {k: getattr(config, k) for k in expected} == expected


@no_cuda
def test_the_paged_cache_is_sized_for_a_step_without_a_gpu(make_spec, tmp_path):
    """Unsized, transformers takes half the machine's RAM for the paged engine's cache and allocates it at every
    step's generation (builtin:tiny: ~11 s a step on 2 cores, ~1 s sized): one step's completions, each of
    ceil((max_prompt_length + max_response_length) / 256) pages. A trl: block's own config replaces it whole."""
    hp = {"rollouts_per_prompt": 4, "prompts_per_step": 2, "max_response_length": 300}
    spec, _ = load_spec(make_spec("paged", generation={"engine": "paged"}, hyperparameters=hp))
    config = grpo.grpo_config(spec, JobDir(tmp_path / "job"))
    assert config.transformers_continuous_batching_config["num_blocks"] == 8 * 6  # (1024 + 300) / 256 -> 6 pages
    mine = {"num_blocks": 4, "max_batch_tokens": 128}
    spec, _ = load_spec(
        make_spec("paged", generation={"engine": "paged"}, trl={"transformers_continuous_batching_config": mine})
    )
    assert grpo.grpo_config(spec, JobDir(tmp_path / "job")).transformers_continuous_batching_config == mine
    hp["max_response_length"] = 40_000  # 8 x 161 pages: past MAX_PAGED_BLOCKS, transformers sizes it to memory
    spec, _ = load_spec(make_spec("paged", generation={"engine": "paged"}, hyperparameters=hp))
    assert grpo.grpo_config(spec, JobDir(tmp_path / "job")).transformers_continuous_batching_config is None
    spec, _ = load_spec(make_spec("padded"))  # the transformers engine: no paged cache
    assert grpo.grpo_config(spec, JobDir(tmp_path / "job")).transformers_continuous_batching_config is None


def test_a_server_of_the_jobs_own_is_passed_by_the_task(make_spec, tmp_path, monkeypatch):
    spec, _ = load_spec(make_spec("srv", generation={"engine": "vllm", "vllm_mode": "server"}))
    monkeypatch.setenv(VLLM_SERVER_URL_ENV, "http://127.0.0.1:41234")
    assert grpo.grpo_config(spec, JobDir(tmp_path / "job")).vllm_server_base_url == "http://127.0.0.1:41234"


def test_a_server_mode_child_without_its_url_says_so(make_spec, tmp_path, monkeypatch):
    spec, _ = load_spec(make_spec("srv", generation={"engine": "vllm", "vllm_mode": "server"}))
    monkeypatch.delenv(VLLM_SERVER_URL_ENV, raising=False)
    with pytest.raises(SetupError, match=r"generation.vllm_mode: server without vllm_server_url"):
        grpo.generation_args(spec)


def test_vllm_server_sets_gpus_aside(make_spec):
    spec, _ = load_spec(
        make_spec(
            "srv",
            gpu_count=2,
            generation={"engine": "vllm", "vllm_mode": "server", "tensor_parallel_size": 2},
        )
    )
    assert starts_server(spec)
    assert split_gpus(spec, ["0", "1", "2", "3", "4"]) == (["0", "1"], ["2", "3"])
    with pytest.raises(TrainingSetupError, match=r"gpu_count \+ tensor_parallel_size = 2 \+ 2 GPUs are needed, 3"):
        split_gpus(spec, ["0", "1", "2"])
    command = server_command(spec, "/models/start", 8123)
    assert command[1:3] == ["-m", "trl.scripts.vllm_serve"]
    assert command[3:] == [
        "--model",
        "/models/start",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor_parallel_size",
        "2",
        "--gpu_memory_utilization",
        "0.3",
    ]


def test_no_server_unless_asked(make_spec, tmp_path):
    for generation in (
        {},
        {"engine": "vllm"},
        {"engine": "vllm", "vllm_mode": "server", "vllm_server_url": "http://h"},
    ):
        spec, _ = load_spec(make_spec("x", generation=generation))
        assert not starts_server(spec)
        with vllm_server(spec, JobDir(tmp_path / "job")) as env:
            assert env == {}


def test_child_command_per_strategy():
    import trl

    job = JobDir(Path("/runs/j"))
    launch = [accelerate_command(), "launch"]
    assert child_command("grpoflow.trainers.grpo", job, 1) == [
        sys.executable,
        "-m",
        "grpoflow.trainers.grpo",
        "/runs/j",
    ]
    command = child_command("grpoflow.trainers.grpo", job, 2, "ddp")
    assert command == [
        *launch,
        "--multi_gpu",
        "--main_process_port",
        command[4],
        "--num_processes",
        "2",
        "-m",
        "grpoflow.trainers.grpo",
        "/runs/j",
    ]
    config = Path(trl.__file__).parent / "accelerate_configs" / "fsdp2.yaml"
    assert config.is_file()
    command = child_command("grpoflow.trainers.grpo", job, 4, "fsdp2")
    assert command == [
        *launch,
        "--config_file",
        str(config),
        "--mixed_precision",
        "no",
        "--main_process_port",
        command[7],
        "--num_processes",
        "4",
        "-m",
        "grpoflow.trainers.grpo",
        "/runs/j",
    ]


@pytest.mark.skipif(__import__("importlib").util.find_spec("deepspeed") is not None, reason="deepspeed installed")
def test_zero_without_deepspeed_is_refused_before_launch():
    with pytest.raises(TrainingSetupError, match=r"distributed.strategy: zero3 needs the deepspeed package"):
        child_command("grpoflow.trainers.grpo", JobDir(Path("/runs/j")), 2, "zero3")


@no_cuda
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"generation": {"engine": "vllm"}},
            "generation.engine: vllm needs a CUDA GPU and none is visible; use engine: transformers or paged to run "
            "here",
        ),
        (
            {"distributed": {"strategy": "zero2"}, "gpu_count": 2},
            "distributed.strategy: zero2 needs a CUDA GPU and none is visible; use ddp to run here",
        ),
        (
            {"distributed": {"strategy": "fsdp2"}, "gpu_count": 2},
            "distributed.strategy: fsdp2 needs CUDA GPUs and none is visible (accelerate runs several CPU processes "
            "as plain data parallel, never sharded); use ddp to run here",
        ),
    ],
)
def test_engines_without_cuda_are_a_setup_error(make_spec, changes, message):
    spec, _ = load_spec(make_spec("acc", **changes))
    with pytest.raises(SetupError) as caught:
        check_accelerators(spec)
    assert str(caught.value) == message


@no_cuda
def test_grpoflow_run_refuses_vllm_here_before_anything_starts(make_spec, tmp_path, capsys):
    from grpoflow.flows.cli import main

    path = make_spec("vllm", generation={"engine": "vllm"})
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "generation.engine: vllm needs a CUDA GPU" in err
    assert not (tmp_path / "runs").exists()  # no job folder: nothing started


# --- a stop on purpose under accelerate launch is still a stop on purpose ------------------------------------------

STOPPING_CHILD = """
import sys
from pathlib import Path
from grpoflow.core.jobdir import JobDir
from grpoflow.trainers.child import record_exit
code, message = int(sys.argv[2]), sys.argv[3]
print(f"grpoflow: {message}", file=sys.stderr)
sys.exit(record_exit(JobDir(Path(sys.argv[1])), code, message))
"""


@pytest.mark.parametrize(
    ("code", "error", "message"),
    [
        (2, TrainingSetupError, "grpoflow: distributed.strategy: zero3 needs a CUDA GPU"),
        (3, RewardFailed, "reward 'mine' raised ValueError at step 3"),
    ],
)
def test_a_ranks_stop_on_purpose_is_not_retried(tmp_path, monkeypatch, code, error, message):
    # `accelerate launch` ends with its own exit code 1 when a rank exits 2 or 3 (1 reads as a crash, retried);
    # the child's exit record keeps the rank's code.
    from grpoflow.jobs import launch

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "stopping_child.py").write_text(STOPPING_CHILD)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'mods'}:{Path(grpo.__file__).parent.parent}")
    monkeypatch.setattr(
        launch, "child_command", lambda *a: [*real_child_command(*a), str(code), message.removeprefix("grpoflow: ")]
    )
    job = JobDir(tmp_path / "job")
    job.root.mkdir()
    record_exit(job, 3 if code == 2 else 2, "an earlier attempt's record")  # run_child clears it first
    with pytest.raises(error, match=message):
        launch.run_child("stopping_child", job, 2, "child.log")
    assert f"exitcode  : {code}" in (job.logs / "child.log").read_text()  # the launcher saw the rank's code ...
    assert json.loads((job.root / launch.EXIT_RECORD).read_text())["code"] == code  # ... the record kept it


# --- real runs on this machine ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_paged_engine_trains(make_job, capsys):
    job, _ = make_job(
        "paged", hyperparameters={"max_steps": 2}, generation={"engine": "paged"}, evaluation={"holdout": 0}
    )
    assert grpo.main(str(job.root)) == 0
    assert "generation engine: paged" in capsys.readouterr().out
    records = read_metrics(job.metrics)
    assert [r["step"] for r in records] == [1, 2]
    assert all(0 < r["values"]["completions/mean_length"] <= 6 for r in records)  # max_response_length 6


def tensor_shapes(folder: Path) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118


def accelerator(kind: str, processes: int = 2, fsdp2: bool = False, zero_stage: int = 0):
    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=zero_stage))
    return SimpleNamespace(
        distributed_type=SimpleNamespace(name=kind), num_processes=processes, is_fsdp2=fsdp2, state=state
    )


@pytest.mark.parametrize(
    ("running", "applied"),
    [
        (accelerator("NO", 1), "none"),
        (accelerator("MULTI_CPU"), "ddp"),
        (accelerator("MULTI_GPU", 8), "ddp"),
        (accelerator("FSDP", fsdp2=True), "fsdp2"),
        (accelerator("FSDP"), "fsdp1"),
        (accelerator("DEEPSPEED", zero_stage=3), "zero3"),
    ],
)
def test_applied_strategy_reads_the_accelerator(running, applied):
    assert grpo.applied_strategy(running) == applied


def test_a_strategy_that_did_not_take_effect_stops_the_run(make_spec):
    # What accelerate does with an FSDP config on CPU processes: plain data parallel. Never trained silently.
    spec, _ = load_spec(make_spec("fsdp", gpu_count=2, distributed={"strategy": "fsdp2"}))
    trainer = SimpleNamespace(accelerator=accelerator("MULTI_CPU"))
    with pytest.raises(SetupError, match=r"distributed.strategy: fsdp2 was asked for but accelerate runs ddp"):
        grpo.check_strategy(trainer, spec)
    trainer = SimpleNamespace(accelerator=accelerator("FSDP", fsdp2=True))
    assert grpo.check_strategy(trainer, spec).startswith("distributed: fsdp2 over 2 process(es)")


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["fsdp2", "zero2", "zero3"])
def test_sharded_strategies_save_the_full_model(make_job, strategy):
    # Two GPUs: each strategy trains, logs each step once, and saves the whole model, unsharded.
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    if strategy.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs deepspeed")
    from grpoflow.jobs.launch import run_child
    from grpoflow.trainers.model.tiny import resolve_model_path

    job, _ = make_job(
        strategy,
        gpu_count=2,
        distributed={"strategy": strategy},
        hyperparameters={"max_steps": 2, "rollouts_per_prompt": 2},
    )
    run_child("grpoflow.trainers.grpo", job, 2, "train.log", result=job.training_result, strategy=strategy)
    assert f"grpoflow: distributed: {strategy} over 2 process(es)" in (job.logs / "train.log").read_text()
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]
    assert tensor_shapes(job.merged) == tensor_shapes(Path(resolve_model_path("builtin:tiny")))


@pytest.mark.parametrize(
    ("visible", "gpu_count", "fails"),
    [("0,1,2,3", 4, False), ("0", 4, True), ("", 4, False), ("-1", 2, False), ("0,1", 1, False)],
)
def test_gpu_count_against_the_visible_gpus(monkeypatch, visible, gpu_count, fails):
    # A UI-started Kubernetes run whose pod got the job variable's 1 GPU for a 4-GPU spec is refused once, named;
    # no GPU at all is a CPU run (several gloo processes), as in these tests.
    from grpoflow.jobs.launch import check_gpu_count
    from grpoflow.trainers.child import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if fails:
        with pytest.raises(TrainingSetupError, match=r"gpu_count: the job trains on 4 GPUs but this machine shows 1"):
            check_gpu_count(gpu_count, visible_gpus())
    else:
        check_gpu_count(gpu_count, visible_gpus())
