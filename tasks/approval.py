"""The person's approval (`evaluation.gate.approval`): after the evaluation and the automatic gate, the flow run
pauses with Prefect's own pause, waiting for a run input of two fields, `approve` and `note`, which the Prefect UI
shows as a form on the paused run (Resume). The report, the held-out scores and a few held-out completions of the
GRPO result are artifacts of the run by then. Approved: publish and deploy go on as configured; rejected, or no
decision within `approval_timeout_hours`: `grpoflow.model.rejected` (reason `rejected` or `timeout`, with the note),
delivered to the webhooks too, and the run completes without publishing or deploying.

It runs in the flow itself, not as a task: Prefect pauses flow runs. By hand (what the UI's form sends):

    from prefect.flow_runs import resume_flow_run
    resume_flow_run(FLOW_RUN_ID, run_input={"approve": True, "note": "looks good"})
"""

from prefect import get_client, get_run_logger
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from prefect.states import Running
from pydantic import Field

from grpoflow.integrations.artifacts import samples_artifact, score_summary
from grpoflow.integrations.events import emit
from grpoflow.trainers.jobdir import JobDir, write_json_atomic
from grpoflow.trainers.spec import JobSpec


class Approval(RunInput):
    """A person's decision on the GRPO result."""

    approve: bool = Field(False, description="Publish and deploy this model (as the job spec configures)?")
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
    try:
        answer = pause_flow_run(wait_for_input=asked, timeout=round(hours * 3600), key=f"approval-{job.job_id}")
        outcome = {
            "approve": answer.approve,
            "note": answer.note,
            "reason": "approved" if answer.approve else "rejected",
        }
    except FlowPauseTimeout:
        outcome = {"approve": False, "note": "", "reason": "timeout"}
        running_again(f"no decision within {hours:g} h: the model is not promoted")
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


def running_again(message: str) -> None:
    """Sets this flow run Running again after its pause timed out, since it goes on without the decision. Prefect
    leaves a timed-out pause Paused (its pause-expiration service fails it within seconds) and its rules refuse any
    later state but Failed ("The flow was completed and never resumed"), so the state is forced; whether the service
    failed the run first or not, the run then ends as its stages do."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run.id, Running(message=message), force=True)


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
