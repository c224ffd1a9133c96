"""Promotion gate task: judges the held-out evaluation by the spec's `evaluation.gate` (`grpoflow.jobs.registry.
gate_decision`), writes the decision to the job's `gate.json`, and emits `grpoflow.model.rejected` for a model that
fails it (`reason`: what failed, e.g. `no_improvement`; `message`: the sentence gate.json keeps as its `reason`): the
pipeline then skips publish and deploy and still completes."""

from prefect import get_run_logger, task

from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.events import emit
from grpoflow.jobs.registry import gate_decision, served_score


@task(name="promotion-gate", retries=0)
def gate_task(job: JobDir, spec: JobSpec, evaluation: dict | None) -> dict:
    """Decides whether the GRPO result is promoted (published, deployed); returns the decision (`promote`, `reason`,
    the scores). The deployed score is the one `spec.deploy.name` serves now, read only when `beat_deployed` asks.

    Args:
        job (`JobDir`), spec (`JobSpec`): the job.
        evaluation (`dict`, *optional*): the evaluation task's result (evaluation.json).
    """
    gate = spec.evaluation.gate
    deployed = served_score(job.root.parent, spec.deploy.name) if gate.beat_deployed and spec.deploy else None
    decision = gate_decision(evaluation, gate, deployed)
    write_json_atomic(job.root / "gate.json", decision)
    if decision["promote"]:
        # Not "no gate" just before the run asks a person to approve: the approval is this job's gate.
        if decision["min_gain"] is not None or decision["beat_deployed"] or not gate.approval:
            get_run_logger().info("promotion gate: %s", decision["reason"])
    else:
        get_run_logger().warning("not promoted (no publish, no deploy): %s", decision["reason"])
        # The event's reason is a kind, as an approval's (rejected, timeout); gate.json's is the sentence.
        emit(job, "grpoflow.model.rejected", {**decision, "reason": decision["kind"], "message": decision["reason"]})
    return decision
