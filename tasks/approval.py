"""The person's approval (`evaluation.gate.approval`): after the evaluation and the automatic gate, the flow run
pauses, waiting for a run input of two fields, `approve` and `note`, which the Prefect UI shows as a form on the paused
run (Resume). `approve` has no default: the form's select starts empty, and a form sent without a choice is refused
(by the UI, and by Prefect's server, which validates every resume). The report, the held-out scores and a few held-out
completions of the GRPO result are artifacts of the run by then. Approved: publish and deploy go on as configured;
rejected, or no decision within `approval_timeout_hours`: `grpoflow.model.rejected` (reason `rejected` or `timeout`,
with the note), delivered to the webhooks too, and the run completes without publishing or deploying.

It runs in the flow itself, not as a task: Prefect pauses flow runs. By hand (what the UI's form sends):

    from prefect.flow_runs import resume_flow_run
    resume_flow_run(FLOW_RUN_ID, run_input={"approve": True, "note": "looks good"})
"""

import time
from typing import Literal

from prefect import get_client, get_run_logger
from prefect.input import RunInput, keyset_from_paused_state, read_flow_run_input
from prefect.runtime import flow_run
from prefect.states import Paused, Running
from pydantic import Field

from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.artifacts import samples_artifact, score_summary
from grpoflow.integrations.events import emit

POLL_S = 10.0  # how often the paused run looks for the decision (Prefect's pause_flow_run's own default)
# Prefect's server fails a run still paused this long after the decision's deadline: only one whose process died.
EXPIRY_GRACE_S = 600


class Approval(RunInput):
    """A person's decision on the GRPO result."""

    # true or false, no default: the UI shows a select to choose from (a switch would show "off" before any choice).
    approve: Literal[True, False] = Field(
        description="Publish and deploy this model (as the job spec configures)? true: yes; false: no."
    )
    note: str = Field("", description="Why: kept in gate.json, and sent with grpoflow.model.rejected.")


def await_approval(job: JobDir, spec: JobSpec, decision: dict, evaluation: dict | None) -> dict:
    """Pauses the flow run until a person approves or rejects the GRPO result, or the timeout passes; returns the
    outcome (`approve`, `note`, `reason`: approved, rejected or timeout), written to the job's `gate.json` too."""
    gate, logger = spec.evaluation.gate, get_run_logger()
    samples_artifact(job, spec, evaluation)
    hours = gate.approval_timeout_hours
    logger.info(
        "waiting for a person's approval (%s): resume this flow run in the Prefect UI with approve and a note, "
        "within %g h",
        score_summary(evaluation),
        hours,
    )
    asked = Approval.with_initial_data(description=_description(job, spec, evaluation, hours))
    answer = wait_for_decision(asked, hours * 3600, f"approval-{job.job_id}", POLL_S)
    if answer is None:
        outcome = {"approve": False, "note": "", "reason": "timeout"}
    else:
        reason = "approved" if answer.approve else "rejected"
        outcome = {"approve": answer.approve, "note": answer.note, "reason": reason}
    gate_record = {**decision, "promote": outcome["approve"], "approval": outcome}
    if not outcome["approve"]:  # what `grpoflow run` and the run's final state say
        gate_record["reason"] = (
            f"no decision within {hours:g} h"
            if outcome["reason"] == "timeout"
            else "rejected by a person" + (f": {outcome['note']}" if outcome["note"] else "")
        )
    write_json_atomic(job.root / "gate.json", gate_record)
    if outcome["approve"]:
        logger.info("approved%s", f": {outcome['note']}" if outcome["note"] else "")
    else:
        logger.warning("not promoted (no publish, no deploy): %s %s", outcome["reason"], outcome["note"])
        emit(job, "grpoflow.model.rejected", {**decision, "promote": False, **outcome})
    return outcome


def wait_for_decision(asked: type[RunInput], seconds: float, key: str, poll_s: float = POLL_S) -> RunInput | None:
    """Pauses this flow run until a person sends `asked` (the UI's Resume form) and returns it; after `seconds`
    without one, sets the run Running again and returns None.

    Prefect's own `pause_flow_run(timeout=)` ends an unanswered pause by failing the run (its server's
    pause-expiration service, or its rules, which then refuse any state but Failed), so an automation on Failed fired
    for a run that went on to complete. Here the server's expiry is `EXPIRY_GRACE_S` after this deadline, and the
    run's states go Paused -> Running with no Failed between.

    Args:
        asked (`type[RunInput]`): the form; its schema and description are what the UI shows.
        seconds (`float`): how long to wait for a decision.
        key (`str`): the pause's key (a run that retries pauses once per key: its earlier answer is returned).
        poll_s (`float`, *optional*, defaults to `POLL_S`): how often to look for the decision.
    """
    paused = Paused(timeout_seconds=round(seconds) + EXPIRY_GRACE_S, pause_key=key)
    keyset = keyset_from_paused_state(paused)
    paused.state_details.run_input_keyset = keyset
    deadline = time.monotonic() + seconds
    with get_client(sync_client=True) as client:
        if not client.set_flow_run_state(flow_run.id, paused).state.is_paused():  # this key's pause fired before
            return _decision(asked, keyset)
        asked.save(keyset)
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(poll_s, left))
            if client.read_flow_run(flow_run.id).state.is_running():
                return _decision(asked, keyset)
        hours = seconds / 3600
        client.set_flow_run_state(flow_run.id, Running(message=f"no decision within {hours:g} h: not promoted"))
    return _decision(asked, keyset)  # None, unless a person's answer came in the last instant


def _decision(asked: type[RunInput], keyset: dict) -> RunInput | None:
    """The answer a person sent to the pause of `keyset`, or None."""
    value = read_flow_run_input(keyset["response"], flow_run_id=flow_run.id)
    return None if value is None else asked(**value)


def _description(job: JobDir, spec: JobSpec, evaluation: dict | None, hours: float) -> str:
    """The Resume form's text (markdown): the job, its score, where to look, and what approving does."""
    then = [f"publish to `{spec.publish.repo_id}`"] if spec.publish else []
    then += [f"deploy as `{spec.deploy.name}`"] if spec.deploy else []
    effect = " and ".join(then) if then else "record the decision (this spec neither publishes nor deploys)"
    return (
        f"**Promote job `{job.job_id}`?** Held-out {score_summary(evaluation)}. The report, the evaluation and a few "
        f"held-out completions are in this run's Artifacts. Approving will {effect}; without a decision within "
        f"{hours:g} h the model is not promoted."
    )
