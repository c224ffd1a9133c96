"""The approval pause's timeout (`grpoflow.tasks.approval`): a flow run that goes on after its pause timed out ends
in its own state, whether or not Prefect's pause-expiration service failed it first."""

import pytest
from prefect import flow
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run

from grpoflow.tasks.approval import running_again


@flow
def decides_alone(recover: bool) -> str:
    try:
        pause_flow_run(timeout=1)
    except FlowPauseTimeout:
        if recover:
            running_again("no decision within 1 s")
    return "went on"


@pytest.mark.usefixtures("prefect_server")
def test_a_run_goes_on_after_its_pause_timed_out():
    # Prefect refuses to leave an expired pause for anything but Failed: without running_again the run ends Failed
    # ("The flow was completed and never resumed"), unless the pause-expiration service (every 5 s) happened to fail
    # it first, which is why the approval timeout test of tests/flows/test_deployments.py failed only now and then.
    # (Checked by hand with recover=False; not asserted here, as that race would make the assertion flaky.)
    state = decides_alone(True, return_state=True)
    assert state.is_completed() and state.result() == "went on"
