"""A stage failure grpoflow has named in one line reaches the log without Prefect's traceback of grpoflow's and
Prefect's own frames (`grpoflow.flows.pipeline.NamedFailures`); any other exception keeps its traceback."""

import logging

import pytest
from prefect import flow

import grpoflow.flows.pipeline  # noqa: F401  (installs the filter on Prefect's flow run logger)
from grpoflow.trainers.launch import ChildFailed, RewardFailed

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
