"""Stage records (`integrations/stages.py`): a stage is skipped only when its spec and its upstream outputs are
unchanged.

`resumable` wraps plain functions here (no Prefect needed): each fake stage writes its output file and counts its
runs, so a test sees exactly which stages a resume runs again.
"""

import errno
import shutil

import pytest

from grpoflow.core.errors import TrainingSetupError, TrainingStopped
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec
from grpoflow.integrations.stages import output_digest, read_record, resumable, retry_unless_final, stage_key

SPEC = {
    "name": "stages",
    "base_model": "builtin:tiny",
    "dataset": {"uri": "data.jsonl"},
    "rewards": [{"name": "exact_answer"}],
    "sft": {"enabled": True},
}


@pytest.fixture
def job(tmp_path) -> JobDir:
    return JobDir(tmp_path / "job")


@pytest.fixture
def spec():
    return load_spec(SPEC)[0]


def fake_stages(runs: list[str], lora: bool = False) -> dict:
    """Stand-ins for the five stages, declared as the real tasks declare theirs; like the real ones deterministic:
    what each writes follows from what it read (`content` plays the part of randomness)."""
    from grpoflow.tasks.train import trained

    declared = {}

    def writer(stage, files, reads=(), digest=()):
        @resumable(stage, outputs=tuple(files), reads=reads, digest=digest)
        def run(job, spec, content="v1"):
            runs.append(stage)
            read = [
                p.read_text()
                for up in reads
                for name in read_record(job, up)["paths"]
                for p in _files(job.root / name)
            ]
            for name in files:
                path = job.root / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"{stage} {content} {hash(tuple(read))}")
            return {"stage": stage}

        declared[stage] = run

    writer("ingest", ["dataset/dataset_dict.json"])
    writer("sft", ["sft/config.json", "sft/model.safetensors"], reads=("ingest",))
    # merged/ is GRPO's output in a full fine-tune, the merge's in a LoRA job.
    trained_files = ["training.json", "adapter/adapter_config.json" if lora else "merged/config.json"]
    writer("train", trained_files, reads=("ingest", "sft"), digest=trained)
    writer("merge", ["model.json", "merged/config.json"] if lora else ["model.json"], reads=("train",))
    writer("evaluate", ["report.md", "evaluation.json"], reads=("ingest", "sft", "merge"))
    return declared


def _files(top):
    return sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top] if top.is_file() else []


def run_all(stages, job, spec, **kwargs):
    for run in stages.values():
        run(job, spec, **kwargs)


@pytest.mark.parametrize("lora", [False, True])
def test_a_resume_with_nothing_changed_runs_nothing(job, spec, lora):
    runs = []
    stages = fake_stages(runs, lora)
    run_all(stages, job, spec)
    run_all(stages, job, spec)
    assert runs == ["ingest", "sft", "train", "merge", "evaluate"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # A downstream output lost: only that stage runs again.
        (lambda job: (job.root / "report.md").unlink(), ["evaluate"]),
        # The SFT weights replaced by other weights (its record still matches, its outputs exist): everything that
        # read them runs again, the SFT itself does not.
        (lambda job: (job.root / "sft/model.safetensors").write_text("other weights"), ["train", "merge", "evaluate"]),
        # sft/ deleted: the SFT runs again; its new output is the same as before byte for byte, so nothing built on
        # it is stale.
        (lambda job: shutil.rmtree(job.sft), ["sft"]),
        # The training summary replaced: merge and evaluation run again, ingest and SFT do not.
        (lambda job: job.training_result.write_text("{}"), ["merge", "evaluate"]),
        # The dataset replaced: every stage after the ingest.
        (lambda job: (job.dataset / "dataset_dict.json").write_text("other"), ["sft", "train", "merge", "evaluate"]),
    ],
)
def test_a_changed_upstream_output_reruns_what_read_it(job, spec, change, expected):
    runs = []
    stages = fake_stages(runs)
    run_all(stages, job, spec)
    runs.clear()
    change(job)
    run_all(stages, job, spec)
    assert runs == expected


def test_a_rerun_upstream_with_new_output_reruns_downstream(job, spec):
    runs = []
    stages = fake_stages(runs)
    run_all(stages, job, spec)
    runs.clear()
    shutil.rmtree(job.sft)
    stages["sft"](job, spec, content="v2")  # the SFT ran again and produced other weights
    for name in ("train", "merge", "evaluate"):
        stages[name](job, spec)
    assert runs == ["sft", "train", "merge", "evaluate"]


def test_digest_follows_content_not_timestamps(job, spec):
    runs = []
    stages = fake_stages(runs)
    run_all(stages, job, spec)
    before = output_digest(job, "sft")
    weights = job.root / "sft/model.safetensors"
    weights.write_text(weights.read_text())  # same bytes, new mtime (a copy from S3 to another machine)
    assert output_digest(job, "sft") == before
    key = stage_key(spec, "train", {up: output_digest(job, up) for up in ("ingest", "sft")})
    assert read_record(job, "train")["key"] == key


def test_datasets_cache_files_are_no_change(job, spec):
    runs = []
    stages = fake_stages(runs)
    run_all(stages, job, spec)
    runs.clear()
    # What `datasets` leaves beside a saved split when the SFT or GRPO child maps it.
    (job.dataset / "train").mkdir(exist_ok=True)
    (job.dataset / "train" / "cache-4b1f7c2a.arrow").write_bytes(b"mapped rows")
    run_all(stages, job, spec)
    assert runs == []


def test_a_changed_spec_reruns_everything(job, spec):
    runs = []
    stages = fake_stages(runs)
    run_all(stages, job, spec)
    runs.clear()
    other = load_spec({**SPEC, "hyperparameters": {"learning_rate": 1e-5}})[0]
    run_all(stages, job, other)
    assert runs == ["ingest", "sft", "train", "merge", "evaluate"]


def test_a_rejection_is_not_recorded(job, spec):
    from grpoflow.integrations.stages import rejected

    @resumable("ingest", outputs=("dataset/dataset_dict.json",))
    def reject(job, spec):
        return rejected("dataset not found: data.jsonl")

    state = reject(job, spec)
    assert state.name == "Rejected" and state.is_failed() and state.message == "dataset not found: data.jsonl"
    assert read_record(job, "ingest") is None


class _State:
    def __init__(self, name, error=None):
        self.name, self.error = name, error

    def result(self):
        if self.error:
            raise self.error


@pytest.mark.parametrize(
    ("state", "retried"),
    [
        (_State("Rejected"), False),  # the user's input: a retry meets the same mistake
        (
            _State("Failed", _setup := TrainingSetupError("no CUDA")),
            False,
        ),
        (_State("Failed", TrainingStopped("health")), False),
        (_State("Failed", RuntimeError("training child exited with code -9")), True),  # a crash: resumed by a retry
        (_State("Failed", OSError("connection reset")), True),
        # a full disk or a read-only job folder: the next attempt's first write fails the same way
        (_State("Failed", OSError(errno.ENOSPC, "No space left on device", "/runs/j/report.md")), False),
        (_State("Failed", OSError(errno.EROFS, "Read-only file system", "/runs/j/events.jsonl")), False),
    ],
)
def test_retry_condition(state, retried):
    assert retry_unless_final(None, None, state) is retried
