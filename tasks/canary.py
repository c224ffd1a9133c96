"""Canary task: one GRPO step at full length on the work pool's own devices before training (grpoflow.jobs.canary).

It runs on the same infrastructure as the training stage (the flow run's worker: the same image, GPUs and
`distributed` settings; on several machines the same TrainJob shape, whose nodes first meet in one collective:
grpoflow.cluster.canary), writes `canary.json` and a markdown artifact, and says its projection of the training
hours in the run's log. A failed verdict (the step does not fit, a known-bad stack, a child that cannot start, a rank
that cannot join) ends the job `Rejected` before SFT and GRPO start, naming what to change; it is not retried. The
refused job keeps its folder, marked rejected (its last event `grpoflow.job.failed`, reason `rejected`), with
`canary.json` and `logs/canary.log` for the user to read why; a run of the fixed spec is a new job.
"""

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from grpoflow.cluster.canary import on_machines
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.artifacts import artifact_key
from grpoflow.integrations.stages import cancellable, rejected, retry_unless_final
from grpoflow.jobs.canary import CANARY_FILE, run_canary, summary_line
from grpoflow.tasks import RETRY_DELAY_S


def canary_markdown(result: dict, line: str) -> str:
    """canary.json as the Prefect UI shows it: the verdict, then each figure on its row."""
    rows = [f"| {key} | {value} |" for key, value in result.items() if key not in ("versions", "reason")]
    versions = ", ".join(f"{name} {v}" for name, v in result["versions"].items())
    return "\n".join([f"**{line}**", "", "| figure | value |", "| --- | --- |", *rows, "", f"Versions: {versions}"])


@task(name="canary", retries=1, retry_delay_seconds=RETRY_DELAY_S, retry_condition_fn=retry_unless_final)
@cancellable
def canary_task(job: JobDir, spec: JobSpec):
    """Runs the canary on the ingested dataset; returns canary.json's object, or a Rejected state when it failed."""
    several = spec.distributed.num_machines > 1  # a TrainJob's nodes run it, in a folder of the shared job folder
    runner, scratch = (on_machines(job), job.root) if several else (None, None)
    result = run_canary(
        spec, job.dataset, out=job.root / CANARY_FILE, run_step=runner, scratch=scratch, log=job.logs / "canary.log"
    )
    line = summary_line(result, spec)
    try:
        create_markdown_artifact(
            canary_markdown(result, line), key=artifact_key(spec, "canary"), description=f"canary of {job.job_id}"
        )
    except Exception as e:  # the API down: a warning, the verdict stands
        get_run_logger().warning("could not create the canary artifact: %s", e)
    if result["status"] != "passed":
        get_run_logger().error(line)
        return rejected(line)
    get_run_logger().info(line)
    return result
