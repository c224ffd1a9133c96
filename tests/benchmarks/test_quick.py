"""Smoke test of every benchmark: each script's `--quick` mode runs as a child process and writes the JSON it should.

They never assert a time (on a shared machine a time means little): only that the scripts run and report every
figure, so that `make bench` cannot rot. The ones that train (marked `bench`, about 200 CPU seconds together) run
first in `make bench`, not in `make test`: the suite keeps to its time (docs/development.md). The GPU script's smoke
stays in `make test`, since a session on a lent GPU runs it (scripts/gpu_check.sh) and has no time to find it broken.
"""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.common import REPO_ROOT, bench_env
from benchmarks.run import summary_rows

pytestmark = pytest.mark.slow

SIDE_FIGURES = {"steps_per_s", "cpu_steps_per_s", "tokens_per_s", "train_runtime_s"}


def case(name: str, extra: list[str], keys: set[str], trains: bool = True):
    """One benchmark's smoke: (benchmark, extra arguments, top-level keys its JSON must hold); one that trains is
    marked `bench`, run by `make bench` (not by `make test`)."""
    return pytest.param(name, extra, keys, id=f"{name}-quick", marks=[pytest.mark.bench] if trains else [])


CASES = [
    case("trainer_vs_trl", [], {"in_process", "child_processes", "startup", "target_met", "target_ratio"}),
    case("skip_zero_variance", [], {"workloads", "steps", "repeats"}),
    case("pipeline_overhead", [], {"sides", "runs", "target_overhead_s"}),
    case("ingest_scale", [], {"formats", "rows", "targets"}, trains=False),
    case("cost_growth", [], {"cells", "fit_K_x_L", "fit_L_and_K_x_L", "fit_generated_tokens"}, trains=False),
    case("generation", [], {"sides", "paged_speed_vs_transformers", "faster", "default_engine", "target_met"}),
    case("held_out", [], {"runs", "summary", "seeds", "specs"}),
    case("graders", [], {"summary", "repeats", "graders_spec"}, trains=False),
    case("sandbox", [], {"ms_per_call", "sandbox_extra_ms", "repeats"}, trains=False),
    case("rollouts", [], {"workloads", "steps", "repeats"}),
    case("canary", [], {"shapes", "steps", "median_projection_ratio", "median_canary_seconds", "target_met"}),
    # --smoke runs the GPU script's whole path on a CPU (a tiny-width model; QLoRA is skipped there, and says so).
    case(
        "gpu", ["--smoke"], {"modes", "generation", "skipped", "model_shape", "cpu_check", "target_met"}, trains=False
    ),
]


def run_quick(name: str, extra: list[str], tmp_path) -> dict:
    path = tmp_path / f"{name}.json"
    command = [sys.executable, "-m", f"benchmarks.{name}", "--quick", "--json", str(path), *extra]
    proc = subprocess.run(command, cwd=REPO_ROOT, env=bench_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| " in proc.stdout  # the markdown table
    return json.loads(path.read_text())


# An id "gpu" would give the test the keyword `gpu`, which conftest skips without CUDA: this case must run anywhere.
@pytest.mark.parametrize("name, extra, keys", CASES)
def test_quick_mode_writes_every_figure(name, extra, keys, tmp_path):
    data = run_quick(name, extra, tmp_path)
    assert data["benchmark"] == name and data["quick"] is True
    assert keys <= data.keys()
    assert "|" in data["table"] and data["machine"]["cpu_count"]
    assert summary_rows(name, data)  # what `make bench` prints from it
    check = globals()[f"check_{name}"]
    check(data)


def check_rollouts(data):
    for w in data["workloads"].values():
        kept, none = w["every_1"], w["every_0"]
        steps = w["runs"]["every 1"][0]["steps"]
        assert kept["files"] == steps and none["files"] == 0  # a file per step, and none with every: 0
        assert 0 < kept["in_loop_share"] < 1 and kept["writer_ms_per_file"] is not None
        assert w["ratios"]["cpu_steps_per_s"]["ratio"] > 0


def check_canary(data):
    [shape] = data["shapes"].values()  # --quick: one shape
    assert shape["canary"]["status"] == "passed" and shape["train_runtime_s"] > 0 and shape["projected_s"] > 0
    assert shape["projection_ratio"] == pytest.approx(shape["projected_s"] / shape["train_runtime_s"], rel=0.01)
    assert shape["canary_seconds"] > shape["canary"]["step_seconds"] > 0  # the canary's cost holds its step
    # --quick: one pair against the full-length run, whose completions are all at max_response_length, as the
    # canary's; and one against the run as it is.
    assert shape["projection_ratios"] == [shape["projection_ratio"]] and shape["full_length_share"] == 1.0
    assert shape["as_is_projection_ratio"] > 0 and 0 < shape["mean_length_share"] <= 1


def check_sandbox(data):
    assert set(data["ms_per_call"]) == {
        f"{side}, {n}" for side in ("sandboxed", "bare") for n in ("1 completion", "64 completions")
    }
    assert all(ms > 0 for ms in data["ms_per_call"].values()) and set(data["sandbox_extra_ms"]) == {"1", "64"}


def check_graders(data):
    s = data["summary"]
    assert s["rows"] == 100 and s["graders"] == 6 and s["rows_per_s"] > 0
    assert s["max_score_difference"] == 0  # graders run scores exactly as the libraries do


def check_generation(data):
    assert set(data["sides"]) == {"transformers", "paged"}
    for side in data["sides"].values():
        assert side["step_time_s"] > 0 and side["completion_tokens_per_s"] > 0
    assert data["faster"] in data["sides"] and data["default_engine"] == "transformers"


def check_trainer_vs_trl(data):
    sides = data["in_process"]["sides"]
    default, trl_same = "grpoflow (spec defaults)", "trl (checkpoints as grpoflow's default)"
    assert set(sides) == {"trl", trl_same, default, "grpoflow (no checkpoint within the run)"}
    for name, side in sides.items():
        assert SIDE_FIGURES | {"checkpoint_share", "logging_share", "own_share"} <= side.keys()
        assert side["checkpoint_share"] + side["logging_share"] < side["own_share"] < 1
        if not name.startswith("trl"):
            assert {"steps_per_s_ratio", "cpu_steps_per_s_ratio", "same_weights_as_trl"} <= side.keys()
    like_for_like = sides[default]["vs_trl_same_checkpoints"]
    assert like_for_like["cpu_steps_per_s_ratio"] > 0 and like_for_like["same_weights"] is True
    # Every run saves at least its final checkpoint; grpoflow's mid-run ones weigh more than TRL's default run's.
    assert 0 < sides["trl"]["checkpoint_share"] < sides[default]["checkpoint_share"] < 1
    shares = data["where_time_goes"]
    assert set(shares) == set(sides)
    # Judged by the within-run shares, like for like: the defaults against TRL with their checkpoint schedule.
    assert data["judged_by"] == "where_time_goes"
    assert (
        shares[default]["baseline"] == trl_same
        and shares["grpoflow (no checkpoint within the run)"]["baseline"] == "trl"
    )
    assert data["target_met"][f"{default} vs {trl_same}"] == (shares[default]["implied"] >= data["target_ratio"])
    # Where a step's CPU goes, part by part, on every side: generation, the rewards and the loss's forward pass are
    # timed, and no timed part nests in another (counted twice, they would leave nothing for the backward pass and
    # the optimizer, "the rest").
    for ms in data["step_parts_ms"].values():
        assert ms["generation"] > 0 and ms["loss (forward)"] > 0 and ms["rewards"] > 0 and ms["other callbacks"] > 0
        assert 0 < ms["the rest"] < ms["all of Trainer.train"]
    # The rollouts' writer thread's CPU is timed (quick runs write every file in the loop: a checkpoint every step).
    writer = {name: ms["rollouts writer (thread)"] for name, ms in data["step_parts_ms"].items()}
    assert writer["trl"] == 0 and writer[default] >= 0
    # Judged like for like; the defaults against the script (which writes no checkpoint) reported only.
    assert set(data["target_met"]) == {"grpoflow (no checkpoint within the run)", f"{default} vs {trl_same}"}
    assert {"startup_s", "peak_rss_mb"} <= data["child_processes"]["sides"]["grpoflow"].keys()


def check_skip_zero_variance(data):
    assert len(data["workloads"]) == 4
    for workload in data["workloads"].values():
        assert {
            "skip_vs_trl",
            "skip_vs_grpoflow",
            "skip_vs_grpoflow_range",
            "skipped_share",
            "training_share_f",
            "target_met",
        } <= workload.keys()
        assert set(workload["sides"]) == {"trl", "grpoflow", "grpoflow+skip"}
        # The skip judged against grpoflow without it; where nothing is skippable, by its check's share of the step,
        # which the runs with the skip on timed (and only they).
        assert 0 < workload["sides"]["grpoflow+skip"]["skip_check_share"] < 1
        assert workload["sides"]["grpoflow"]["skip_check_share"] == 0
        if workload["zero_variance_share_of_prompts"] == 0:
            assert workload["judged"] == "skip_check_share" and workload["target"] == 0.01
            assert workload["target_met"] == (workload["skip_check_share"] <= 0.01)
        else:
            assert workload["target_met"] == (workload["skip_vs_grpoflow"] >= workload["target"])


def check_pipeline_overhead(data):
    side = data["sides"]["ephemeral Prefect"]
    keys = {"wall_s", "sft_child_s", "train_child_s", "evaluation_in_child_s", "overhead_s", "stages_s", "target_met"}
    assert keys <= side.keys()
    # The demo spec is a full fine-tune: its GRPO child scored the held-out prompts, and that counts as overhead.
    assert side["evaluation_in_child_s"] > 0
    assert data["first_run_fresh_prefect_home"]["overhead_s"] > 0


def check_ingest_scale(data):
    assert set(data["formats"]) == {"jsonl", "parquet"}
    for fmt in data["formats"].values():
        assert {"rows_per_s", "peak_rss_mb", "import_rss_mb"} <= fmt["grpoflow"].keys() & fmt["pandas"].keys()
        assert {"vs_pandas", "target_met"} <= fmt.keys()


def check_cost_growth(data):
    assert [(c["K"], c["L"]) for c in data["cells"]] == [(2, 4), (2, 8), (4, 4), (4, 8)]
    assert "r2" in data["fit_K_x_L"]


def check_gpu(data):
    cuda = torch.cuda.is_available()
    assert set(data["modes"]) == ({"full", "lora", "qlora"} if cuda else {"full", "lora"})
    assert cuda or data["skipped"] == {"qlora": "needs CUDA (bitsandbytes' 4-bit kernels)"}
    for mode in data["modes"].values():
        assert {"steps_per_s", "tokens_per_s", "peak_gpu_mb"} <= mode["sides"]["grpoflow"].keys()
        assert mode["sides"]["grpoflow"]["steps_per_s_ratio"] > 0 and mode["sides"]["grpoflow"]["same_weights_as_trl"]
    engines = data["generation"]["engines"]
    assert set(engines) == {"transformers", "paged"} and all(e["tokens_per_s"] > 0 for e in engines.values())
    assert data["generation"]["paged_vs_transformers"] > 0
    assert data["cpu_check"] is not cuda and isinstance(data["target_met"], bool)


@pytest.mark.parametrize("repeats", ["0", "-1", "two"])
def test_pipeline_overhead_rejects_a_repeat_count_that_is_not_a_run(repeats, capsys):
    from benchmarks import pipeline_overhead

    with pytest.raises(SystemExit) as exited:  # argparse: exit 2, before any run starts
        pipeline_overhead.main(["--repeats", repeats])
    assert exited.value.code == 2
    assert f"{repeats!r} is not a whole number of runs, 1 or more" in capsys.readouterr().err


def check_held_out(data):
    assert [r["kind"] for r in data["runs"]] == ["gamed", "honest"]
    for run in data["runs"]:
        assert [p["step"] for p in run["series"]] == [0, 2, 4] and run["evaluations"] == 2
        # 0: no checkpoint beat the starting model, which is then kept (select: best weighs step 0)
        assert run["kept_step"] in (0, 2, 4) and run["eval_s_each"] > 0
        # No regression: the kept model never scores below the start; where nothing beat it, the start is kept, the
        # no_improvement alert fires and the default gate withholds the publish.
        assert run["kept"] >= run["before"]
        nothing_beat = run["kept_step"] == 0
        assert ("no_improvement" in run["alerts"]) == nothing_beat == run["publish_withheld"]
