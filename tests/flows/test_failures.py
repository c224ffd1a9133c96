"""A stage failure grpoflow has named in one line reaches the log without Prefect's traceback of grpoflow's and
Prefect's own frames (`grpoflow.flows.pipeline.NamedFailures`); any other exception keeps its traceback."""

import logging

import pytest
from prefect import flow
from prefect.exceptions import ParameterTypeError

import grpoflow.flows.pipeline  # noqa: F401  (installs the filter on Prefect's flow run logger)
from grpoflow.core.errors import ChildFailed, RewardFailed

pytestmark = pytest.mark.usefixtures("prefect_server")


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize(
    "error, traceback",
    [
        (RewardFailed("reward 'r' raised ValueError: x at training step 4 (traceback in logs/train.log)"), False),
        (ChildFailed("training child was killed by SIGKILL. Last lines of its log: ..."), False),
        (ValueError("a bug of grpoflow's, or of the user's flow"), True),
    ],
)
def test_the_engines_failure_line_has_a_traceback_only_where_it_helps(error, traceback):
    @flow
    def failing():
        raise error

    handler, logger = Records(), logging.getLogger("prefect.flow_runs")
    logger.addHandler(handler)
    try:
        failing(return_state=True)
    finally:
        logger.removeHandler(handler)
    [line] = [r for r in handler.records if "Encountered exception during execution" in r.getMessage()]
    assert str(error) in line.getMessage() and line.levelno == logging.ERROR
    assert (line.exc_info is not None) == traceback


@pytest.mark.filterwarnings("ignore:Logger 'prefect.flow_runs' attempted to send logs")
def test_refused_parameters_are_named_without_a_traceback():
    """A run whose spec the form let through but the spec's rules refuse: the engine's error line, as a worker's
    run logs it, is the refusal (each problem on its line), without Prefect's frames; the secret is not in it."""
    from prefect.flow_engine import run_flow

    from grpoflow.core.spec import JobSpec

    @flow
    def takes_a_spec(spec: JobSpec):
        return spec.name

    spec = {"name": "j", "base_model": "builtin:tiny", "dataset": {"uri": "d.jsonl"}}
    spec["output_uri"] = "s3://AKIAEXAMPLE:hunter2secret@bucket/runs"
    handler, logger = Records(), logging.getLogger("prefect.flow_runs")
    logger.addHandler(handler)
    try:
        with pytest.raises(ParameterTypeError):
            run_flow(takes_a_spec, parameters={"spec": spec}, error_logger=logger)
    finally:
        logger.removeHandler(handler)
    [line] = [r for r in handler.records if r.levelno == logging.ERROR and "invalid parameters" in r.getMessage()]
    assert "spec.output_uri: holds credentials" in line.getMessage() and line.exc_info is None
    assert not [r for r in handler.records if "hunter2secret" in r.getMessage() or r.exc_info]


@pytest.mark.filterwarnings("ignore:Logger 'prefect.flow_runs' attempted to send logs")
def test_a_rejected_run_is_logged_without_a_traceback():
    """A run that ends on the Rejected state its flow returns, as a worker runs it: the reason on its log, in the
    engine's "Finished in state Rejected(...)" line, and no traceback of Prefect's frames after it (`run_flow` raises
    the returned state as `FailedRun`, logged "Engine execution exited with unexpected exception")."""
    from prefect.exceptions import FailedRun
    from prefect.flow_engine import run_flow

    from grpoflow.flows.pipeline import grpo_pipeline

    reward = {"name": "exact_answer"}
    spec = {"name": "j", "base_model": "builtin:tiny", "dataset": {"uri": "d.jsonl"}, "rewards": [reward, reward]}
    handler, logger = Records(), logging.getLogger("prefect.flow_runs")
    logger.addHandler(handler)
    try:
        with pytest.raises(FailedRun):
            run_flow(grpo_pipeline, parameters={"spec": spec}, error_logger=logger)
    finally:
        logger.removeHandler(handler)
    [finished] = [r.getMessage() for r in handler.records if r.getMessage().startswith("Finished in state")]
    assert finished.startswith("Finished in state Rejected(") and "duplicate reward name 'exact_answer'" in finished
    assert [r.getMessage() for r in handler.records if r.exc_info or "Engine execution" in r.getMessage()] == []
