"""The ingest task: a good dataset is saved and announced; a bad dataset or reward ends `Rejected`, at once (no
retry), with a message that names the column or reward; a completed ingest is not redone."""

import pytest
from prefect import flow
from prefect.client.orchestration import get_client

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.integrations.stages import REJECTED
from grpoflow.tasks.ingest import ingest_task
from grpoflow.trainers.dataset import load_ingested
from grpoflow.trainers.metrics import read_events
from tests.conftest import write_jsonl

pytestmark = pytest.mark.usefixtures("prefect_server")


def new_job(tmp_path, spec) -> JobDir:
    job = JobDir(tmp_path / "runs" / "ing-20261130-000000-abcdef")
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    return job


def ingest(job, spec):
    """The ingest task's final state, from a flow run of its own (a rejected task would fail a flow returning it)."""
    states = []
    flow(lambda: states.append(ingest_task(job, spec, return_state=True)))()
    return states[0]


def run_count(state) -> int:
    with get_client(sync_client=True) as client:
        return client.read_task_run(state.state_details.task_run_id).run_count


def test_a_good_dataset_is_saved_and_announced(tmp_path, make_spec):
    spec, _ = load_spec(make_spec("ing"))
    job = new_job(tmp_path, spec)
    state = ingest(job, spec)
    info = state.result()
    assert (info["num_train"], info["num_eval"], info["prompt_format"]) == (20, 4, "text")  # 24 rows, holdout 4
    saved = load_ingested(job.dataset)
    assert (saved["train"].num_rows, saved["eval"].num_rows) == (20, 4)
    assert {"prompt", "answer"} <= set(saved["train"].column_names)
    [event] = read_events(job.events)
    assert event["event"] == "grpoflow.dataset.ingested" and event["payload"] == info


@pytest.mark.parametrize(
    "rows, changes, message",
    [
        # exact_answer reads the `answer` column, which this dataset lacks.
        (
            [{"prompt": f"What is {i}+1?"} for i in range(8)],
            {},
            "column 'answer' (needed by reward 'exact_answer') not found",
        ),
        # The spec names a prompt column the data does not have.
        (
            [{"prompt": "What is 1+1?", "answer": "2"}] * 8,
            {"dataset": {"prompt_column": "question"}},
            "question",
        ),
        # A reward that raises on the dataset's rows: its name and error, before any model is loaded.
        (
            [{"prompt": "What is 1+1?", "answer": "2"}] * 8,
            {"rewards": [{"name": "mine", "function": "tests.bad_inputs.rewards.raises:raises_reward"}]},
            "reward 'mine' raised KeyError: 'solution' on dataset row 0",
        ),
    ],
)
def test_a_bad_input_is_rejected_without_a_retry(tmp_path, make_spec, rows, changes, message):
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    changes = {**changes, "dataset": {"uri": str(data), **changes.get("dataset", {})}}
    spec, _ = load_spec(make_spec("ing", evaluation={"holdout": 0}, **changes))
    job = new_job(tmp_path, spec)
    state = ingest(job, spec)
    assert state.is_failed() and state.name == REJECTED
    assert message in state.message
    assert run_count(state) == 1  # the task allows 2 retries; a rejection takes none
    assert not job.events.exists()  # nothing announced
    assert not (job.root / "stages" / "ingest.json").exists()  # nor recorded as done: a resumed job checks again


def test_a_completed_ingest_is_skipped(tmp_path, make_spec):
    spec, _ = load_spec(make_spec("ing"))
    job = new_job(tmp_path, spec)
    first = ingest(job, spec).result()
    saved = {p: p.stat().st_mtime_ns for p in job.dataset.rglob("*")}
    assert ingest(job, spec).result() == first
    assert {p: p.stat().st_mtime_ns for p in job.dataset.rglob("*")} == saved  # not written again
    assert len(read_events(job.events)) == 1  # nor announced again


def test_a_validation_set_is_the_eval_split_and_a_new_one_is_a_new_ingest(tmp_path, make_spec):
    """evaluation.dataset: every training row trained on, the validation rows the eval split; the same spec again is
    skipped, another validation set is ingested again; one lacking the metric's column is rejected, naming it."""
    rows = [{"question": f"What is {i}*2?", "answer": str(i * 2)} for i in range(3)]
    # make_spec holds 4 prompts out; holdout 0 said outright is what unset means with a validation set
    validation = write_jsonl(tmp_path / "validation.jsonl", rows)
    spec, _ = load_spec(
        make_spec("ing", evaluation={"holdout": 0, "dataset": {"uri": str(validation), "prompt_column": "question"}})
    )
    job = new_job(tmp_path, spec)
    info = ingest(job, spec).result()
    assert (info["num_train"], info["num_eval"]) == (24, 3)
    assert load_ingested(job.dataset)["eval"]["prompt"] == [row["question"] for row in rows]
    assert ingest(job, spec).result() == info and len(read_events(job.events)) == 1  # done: skipped

    other = write_jsonl(tmp_path / "other.jsonl", rows[:2])
    spec, _ = load_spec(
        make_spec("ing", evaluation={"holdout": 0, "dataset": {"uri": str(other), "prompt_column": "question"}})
    )
    assert ingest(job, spec).result()["num_eval"] == 2 and len(read_events(job.events)) == 2

    no_answer = write_jsonl(tmp_path / "no-answer.jsonl", [{"prompt": "What is 1*2?"}])
    spec, _ = load_spec(make_spec("ing", evaluation={"holdout": 0, "dataset": {"uri": str(no_answer)}}))
    state = ingest(job, spec)
    assert state.is_failed() and state.name == REJECTED
    assert "evaluation.dataset: dataset " in state.message and "evaluation.metric 'exact_answer'" in state.message
