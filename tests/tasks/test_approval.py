"""A person's approval (`grpoflow.tasks.approval`), through Prefect's API as its UI calls it: the Resume form asks for
an explicit decision, and a pause nobody answers ends as a decision (timeout) with no Failed state in the run's
history (an automation on Failed fired for runs that went on to complete)."""

import contextvars
import threading
import time

import pytest
from prefect import flow, get_client
from prefect.runtime import flow_run

from grpoflow.tasks.approval import Approval, wait_for_decision

pytestmark = pytest.mark.usefixtures("prefect_server")


def paused_run(flow_run_id, timeout: float = 60):
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while not (run := client.read_flow_run(flow_run_id)).state.is_paused():
            assert time.monotonic() < deadline, run.state
            time.sleep(0.1)
    return run


def person(flow_run_id, seen: dict) -> None:
    """What the UI's Resume does: reads the form's schema, then sends the values (the V2 UI starts them as `{}`)."""
    run = paused_run(flow_run_id)
    keyset = run.state.state_details.run_input_keyset
    with get_client(sync_client=True) as client:
        seen["schema"] = client.read_flow_run_input(flow_run_id, keyset["schema"])
        seen["untouched"] = client.resume_flow_run(flow_run_id, run_input={})  # Resume without choosing
        seen["still"] = client.read_flow_run(flow_run_id).state.type.value
        seen["chosen"] = client.resume_flow_run(flow_run_id, run_input={"approve": False, "note": "padded answers"})


@flow
def decides(seconds: float, answer: bool) -> dict:
    seen = {}
    if answer:  # from the flow's own context: the thread then talks to the test's server
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(person, flow_run.id, seen), daemon=True).start()
    decision = wait_for_decision(Approval.with_initial_data(description="Promote?"), seconds, "approval-t", 0.2)
    return {"decision": decision and decision.model_dump(), **seen}


def states(flow_run_id) -> list:
    with get_client(sync_client=True) as client:
        return client.read_flow_run_states(flow_run_id)


def test_the_resume_form_needs_an_explicit_decision():
    import json

    state = decides(60, True, return_state=True)
    result = state.result()
    schema = json.loads(result["schema"])
    # A select with nothing chosen (no default), not a switch that shows "off" before anyone touched it.
    assert schema["required"] == ["approve"] and schema["properties"]["approve"]["enum"] == [True, False]
    assert "default" not in schema["properties"]["approve"]
    # Resume pressed without a choice: Prefect's server refuses it, naming the field, and the run stays paused.
    assert result["untouched"].status.value == "REJECT" and "'approve' is a required property" in str(
        result["untouched"].details.reason
    )
    assert result["still"] == "PAUSED" and result["chosen"].status.value == "ACCEPT"
    assert result["decision"] == {"approve": False, "note": "padded answers"}
    assert [s.type.value for s in states(state.state_details.flow_run_id)].count("FAILED") == 0


def test_a_pause_nobody_answers_ends_as_a_decision_without_a_failed_state():
    state = decides(1, False, return_state=True)
    assert state.is_completed() and state.result()["decision"] is None
    history = sorted(states(state.state_details.flow_run_id), key=lambda s: s.timestamp)
    assert [s.type.value for s in history] == ["PENDING", "RUNNING", "PAUSED", "RUNNING", "COMPLETED"]
    paused, going_on = history[2], history[3]
    assert going_on.message == "no decision within 0.000277778 h: not promoted"
    # Prefect's own expiry of the pause (which fails the run) lies well after the run went on: it never comes first.
    assert (paused.state_details.pause_timeout - going_on.timestamp).total_seconds() > 500


def test_no_gate_is_not_said_just_before_a_person_is_asked(make_job):
    # "promotion gate: no gate", then "waiting for a person's approval": the approval is this job's gate.
    from grpoflow.tasks.gate import gate_task
    from tests.integrations.test_artifacts import flow_run_logs

    scores = {"metric": "exact_answer", "n": 4, "before": 0.25, "after": 0.5}
    said = {}
    for approval in (True, False):
        gate = {"approval": approval, "min_gain": None}  # nothing judged automatically
        job, spec = make_job(f"ask-{approval}".lower(), evaluation={"holdout": 0, "gate": gate})
        state = flow(lambda: gate_task(job, spec, scores))(return_state=True)  # noqa: B023  (called at once)
        said[approval] = [m for m in flow_run_logs(state.state_details.flow_run_id) if m.startswith("promotion gate")]
    assert said == {True: [], False: ["promotion gate: no gate"]}
