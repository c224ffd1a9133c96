"""The GRPO pipeline flow: ingest -> canary (GPU jobs) -> SFT warm-up (optional) -> GRPO -> merge -> evaluate and
report -> promotion gate -> publish -> register.

`STAGES` is the pipeline as data: each stage's Prefect task (`tasks/`, emitting its `grpoflow.*` event), the earlier
results it takes, and when it runs. The flow runs the table top to bottom, `completed_before` reads it to tell a
finished job, and each resumable task's `@resumable` record (what it writes, which stages it reads) is read from the
task itself. A new stage is its work module, its task, and one entry here.
`grpoflow.tasks.bookkeeping.JobEnding` ends the job (its last event, webhooks, uploads) however it ends. Run it with
`grpoflow run SPEC.yaml`, or as the `grpo-pipeline` deployment whose `spec` parameter the Prefect UI shows as a form.
"""

import logging
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefect import Task, flow, get_client, get_run_logger
from prefect.context import FlowRunContext
from prefect.exceptions import FailedRun, ParameterTypeError, TerminationSignal
from prefect.runtime import flow_run
from prefect.states import Completed, State

from grpoflow.core.errors import ChildEndedEarly, ChildFailed, RewardFailed, TrainingSetupError, TrainingStopped
from grpoflow.core.jobdir import JobDir, new_job_id
from grpoflow.core.spec import JobSpec, SpecError, load_spec
from grpoflow.flows.admission import admission_problems, team_spec
from grpoflow.flows.output import survive_closed_output
from grpoflow.flows.resume import max_resumes, resume_number
from grpoflow.integrations.events import emit
from grpoflow.integrations.job_folders import BadJobReference, job_location, resume_problem
from grpoflow.integrations.stages import REJECTED, StageRecord, end_cancelled, rejected
from grpoflow.jobs.canary import wanted as canary_wanted
from grpoflow.tasks.approval import await_approval
from grpoflow.tasks.bookkeeping import JobEnding, create_job_task
from grpoflow.tasks.canary import canary_task
from grpoflow.tasks.evaluate import evaluate_and_report, evaluate_task, suite_results
from grpoflow.tasks.gate import gate_task
from grpoflow.tasks.ingest import ingest_task
from grpoflow.tasks.merge import merge_task
from grpoflow.tasks.publish import publish_task
from grpoflow.tasks.register import register_task
from grpoflow.tasks.sft import sft_task
from grpoflow.tasks.train import train_task
from grpoflow.trainers.metrics import read_events


class NamedFailures(logging.Filter):
    """Leaves out the traceback of a stage failure whose message already says everything (a training child's end,
    with its log's lines and path): Prefect's engine logs the flow's exception with its traceback, which then shows
    only grpoflow's and Prefect's own frames, 30-90 lines on the terminal and in the UI, around a one-line reason.

    A form's refused parameters (`ParameterTypeError`: a spec the UI form let through that the spec's own rules
    refuse) are named the same way: the engine's line "Engine execution exited with unexpected exception" becomes
    the refusal itself, each problem on its line, without the ~20 lines of Prefect's frames.

    A run that ended on a failed state its flow returned (`rejected`'s `Rejected`, a sweep's failed jobs) is logged
    once, by the engine's "Finished in state Rejected('<the reason>')": a worker's engine then asks `run_flow` for
    the flow's result, which raises that state as `FailedRun` and logs it again as "Engine execution exited with
    unexpected exception" with ~40 lines of Prefect's frames, whatever the state's name. That line is left out.
    """

    NAMED = (TrainingSetupError, TrainingStopped, RewardFailed, ChildEndedEarly, ChildFailed, ParameterTypeError)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, FailedRun):
            return False
        if isinstance(error, self.NAMED):
            record.exc_info, record.exc_text = None, None
            if isinstance(error, ParameterTypeError):
                record.msg, record.args = "%s", (str(error),)
        return True


# The head of Prefect's line, up to the flow's name (repr'd); whatever follows it is left out.
REFUSED_PARAMETERS = re.compile(r"Parameter validation failed for flow (?:'[^']*'|\"[^\"]*\")")


class UnloggedParameters(logging.Filter):
    """Cuts Prefect's "Parameter validation failed for flow ...: [errors]\nParameters: {...}" line (`Flow.
    validate_parameters`, on the worker's terminal) to its head: it prints pydantic's errors with each refused
    input, then every parameter given, and a refused spec may hold a secret (a URL with credentials in a free-form
    field, which the parameter schema cannot check). The problems themselves, without the values, follow on the flow
    run's log ("Validation of flow parameters failed with error: ...", from `ParameterTypeError`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Parameter validation failed"):
            head = REFUSED_PARAMETERS.match(message)
            record.msg, record.args = "%s (the values given are not logged)", (head[0] if head else message[:27],)
        return True


logging.getLogger("prefect.flow_runs").addFilter(NamedFailures())
logging.getLogger("prefect.flows").addFilter(UnloggedParameters())
# A worker that dies closes the pipes it read this process's output from: the run goes on (flows/output.py).
survive_closed_output()


def _always(spec: JobSpec, done: dict) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline.

    Args:
        name (`str`): its name; later stages take its result by it.
        task (`prefect.Task` or `Callable`): called as `task(job, spec, **takes)`; a plain function runs in the flow
            itself (what Prefect allows only there, such as a pause).
        takes (`dict`): keyword argument -> the earlier stage whose result it gets (or a function of those results).
        when (`Callable`): whether it runs, given the spec and the results so far; a stage that does not run has the
            result None.
        record (`StageRecord`, *optional*): its resumable record, when its task's own function does not carry it.
        keeps_rejected (`bool`): a job this stage rejects keeps its folder, marked rejected, for the user to read why
            (the canary's canary.json and logs/canary.log); any other rejected input removes a new job's folder.
    """

    name: str
    task: Task | Callable
    takes: dict[str, str | Callable[[dict], object]] = field(default_factory=dict)
    when: Callable[[JobSpec, dict], bool] = _always
    record: StageRecord | None = None
    keeps_rejected: bool = False

    def resumable(self) -> StageRecord | None:
        """What the stage writes and reads, from its `@resumable` declaration (None for a stage that always runs)."""
        return self.record or getattr(getattr(self.task, "fn", None), "resumable", None)

    def arguments(self, done: dict) -> dict:
        return {k: v(done) if callable(v) else done[v] for k, v in self.takes.items()}


def _seconds_so_far(done: dict) -> float:
    return time.monotonic() - done["started"]


def _promoted(spec: JobSpec, done: dict) -> bool:
    """Passed the gate, and approved when a person's approval was asked."""
    return done["gate"]["promote"] and (done.get("approval") is None or done["approval"]["approve"])


STAGES = (
    # --- ingest the dataset and dry-run the rewards on it (a rejection costs no model load)
    Stage("ingest", ingest_task),
    # --- the canary: one full-length GRPO step on the pool's own devices (does it fit, how long will it take); before
    # SFT, which changes no shape it tries (its step loads the base model), so a job it refuses spends no SFT time
    Stage("canary", canary_task, when=lambda spec, done: canary_wanted(spec), keeps_rejected=True),
    # --- SFT format warm-up
    Stage("sft", sft_task, when=lambda spec, done: spec.sft.enabled),
    # --- GRPO training (child process, resumes from checkpoints on retry)
    Stage("train", train_task),
    # --- merge the adapter (LoRA jobs) and describe the artifact
    Stage("merge", merge_task),
    # --- held-out evaluation and report
    Stage(
        "evaluate",
        evaluate_task,
        takes={"sft": "sft", "training": "train", "wall_seconds": _seconds_so_far},
        record=evaluate_and_report.resumable,
    ),
    # --- promotion gate (evaluation.gate): a model that fails it is neither published nor deployed
    Stage("gate", gate_task, takes={"evaluation": "evaluate"}),
    # --- a person's approval (evaluation.gate.approval): the flow run pauses for it, in the flow (not a task)
    Stage(
        "approval",
        await_approval,
        takes={"decision": "gate", "evaluation": "evaluate"},
        when=lambda spec, done: spec.evaluation.gate.approval and _promoted(spec, done),
    ),
    # --- publish to the Hugging Face Hub
    Stage("publish", publish_task, when=lambda spec, done: bool(spec.publish) and _promoted(spec, done)),
    # --- register in the serving registry (served from merged/, LoRA or not)
    Stage("register", register_task, when=lambda spec, done: bool(spec.deploy) and _promoted(spec, done)),
)


def spec_name(spec: JobSpec | dict) -> str:
    """The name of `spec`, a JobSpec or a deployment's JSON not validated yet (see `checked_spec`), for a run's name
    before the spec is checked: `rejected-spec` where it has none."""
    name = spec.name if isinstance(spec, JobSpec) else spec.get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) and name else "rejected-spec"


def checked_spec(spec: JobSpec | dict) -> JobSpec | State:
    """`spec` as a JobSpec, or the run's `Rejected` state naming its problems (logged on the run's log).

    A flow that takes a spec skips Prefect's parameter check (`validate_parameters=False`): a spec the deployment's
    schema let through but JobSpec refuses (a cross-field rule) would fail that check, ending the run Failed with no
    task run. A deployment's run then gets the spec as its JSON, checked here; a caller's JobSpec is returned as is.
    """
    if isinstance(spec, JobSpec):
        return spec
    try:
        return load_spec(spec)[0]
    except SpecError as e:
        get_run_logger().error("%s", e)
        return rejected(str(e))


def job_run_name() -> str:
    """The flow run's name: its job id, as the flow derives it below (or the resumed job's); an automatic resume
    keeps the name `grpo-pipeline/resume` gave it (`<job id>-resume-<n>`)."""
    parameters = FlowRunContext.get().parameters
    if (job_id := parameters.get("job_id")) and resume_number(flow_run.name, job_id):
        return flow_run.name
    return job_id or new_job_id(spec_name(parameters["spec"]), flow_run.id, flow_run.scheduled_start_time)


def name_flow_run(job_id: str) -> None:
    """Names this flow run after its job, whichever flow runs the pipeline: `grpo_pipeline`'s own runs are named so
    from the start (`job_run_name`); a run of `grpo_pipeline_from_file` (nightly, on-new-data) learns its job id only
    once the spec is loaded, and would keep Prefect's random name (`private-pelican`) otherwise. An automatic
    resume's name (`<job id>-resume-<n>`) stays."""
    if flow_run.id is None or flow_run.name == job_id or resume_number(flow_run.name, job_id):
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=job_id)


# validate_parameters=False: the flow checks the spec itself and ends Rejected (`checked_spec`).
@flow(name="grpo-pipeline", flow_run_name=job_run_name, validate_parameters=False)
def grpo_pipeline(spec: JobSpec, job_id: str | None = None, team: str | None = None) -> dict:
    """Fine-tunes `spec.base_model` with GRPO on `spec.dataset`; returns the job id, folder and evaluation.

    Args:
        spec (`JobSpec`): the job spec; validated before anything runs.
        job_id (`str`, *optional*): resume this existing job (its spec.yaml must be `spec`) instead of starting one.
        team (`str`, *optional*): the team the run belongs to, which the operator sets on the deployment; its jobs
            live in a folder of its own under the output URI, and a run may not name another team than its
            deployment's.
    """
    return run_pipeline(spec, job_id, team)


# What a new job's id (and so its run's name) says after the spec's name when new data started its run (the
# on-new-data deployment: `grpoflow.flows.triggered`): `<name>-new-data-<UTC time>-<6 hex>`.
NEW_DATA = "new-data"


def run_pipeline(
    spec: JobSpec | dict, job_id: str | None = None, team: str | None = None, started_by: str | None = None
) -> dict | State:
    """`grpo_pipeline`'s work, in the flow run that calls it (its arguments, and `started_by`).

    Args:
        started_by (`str`, *optional*): what started the run (`NEW_DATA`); a new job's id carries it after the spec's
            name, so the run list, named after job ids, says it.
    """
    started = time.monotonic()
    spec = checked_spec(spec)  # a deployment's run: the spec as its JSON
    if not isinstance(spec, JobSpec):
        return spec
    if problems := admission_problems(spec, team):  # before anything imports the spec's modules or reads its paths
        get_run_logger().error("spec rejected:\n%s", "\n".join(problems))
        return rejected("; ".join(problems))
    spec = team_spec(spec, team)
    if job_id is not None and (problem := resumable(spec, job_id)):  # the UI form's job_id: another spec's job
        return rejected(problem)

    # --- job folder (the same one on every retry of this flow run)
    name = f"{spec.name}-{started_by}" if started_by else spec.name
    created = create_job_task(
        spec, job_id or new_job_id(name, flow_run.id, flow_run.scheduled_start_time), return_state=True
    )
    if created.name == REJECTED:  # another live run holds this job's folder
        return rejected(created.message)
    job = created.result()
    name_flow_run(job.job_id)
    get_run_logger().info("job %s in %s", job.job_id, job.root)
    if n := resume_number(flow_run.name, job.job_id):  # started by grpo-pipeline/resume after a crash
        announce_resume(job, n)
    with JobEnding(job, spec, resumed=job_id is not None) as end:
        done = {"started": started}
        for stage in STAGES:
            if not stage.when(spec, done):
                done[stage.name] = None
                continue
            if not isinstance(stage.task, Task):  # a step of the flow itself (a pause)
                done[stage.name] = stage.task(job, spec, **stage.arguments(done))
                continue
            state = stage.task(job, spec, **stage.arguments(done), return_state=True)
            if state.name == REJECTED:  # a spec, dataset or reward mistake: the job ends rejected, not failed
                return end.rejected(state.message, keep=stage.keeps_rejected)
            if state.is_cancelled():  # the flow run was cancelled while the stage worked (the UI's Cancel)
                end.cancelled(state.message)
                end_cancelled(state.message)  # now, not after the worker has imported the flow again (end_cancelled)
                # On to Prefect's own end of a cancelled run (no traceback logged).
                raise TerminationSignal(signal.SIGTERM)
            done[stage.name] = state.result()  # a failed stage raises here, and the job ends failed

        # --- upload the job folder (remote output_uri) and announce the result
        result = {"job_id": job.job_id, "output_dir": job_location(job, spec), "status": "completed"}
        evaluation = done["evaluate"]
        suites = suite_results(job)
        end.completed(
            {**result, "evaluation": evaluation, "suites": suites, "artifact_type": done["merge"]["artifact_type"]}
        )
    return Completed(message=end.message, data={**result, "evaluation": evaluation, "dataset": done["ingest"]})


def announce_resume(job: JobDir, n: int) -> None:
    """Emits `grpoflow.job.resumed`: this run is the `n`-th automatic resume of `job` after a crash."""
    steps = [int(p.name.split("-")[1]) for p in job.checkpoints.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    checkpoint = f"checkpoint-{max(steps)}" if steps else None
    emit(job, "grpoflow.job.resumed", {"resume": n, "max_resumes": max_resumes(), "checkpoint": checkpoint})
    get_run_logger().warning(
        "job %s: resumed after a crash (%d of %d automatic resumes), from %s",
        job.job_id, n, max_resumes(), checkpoint or "its start",
    )  # fmt: skip


def resumable(spec: JobSpec, job_id: str) -> str | None:
    """Why the job `job_id` may not be resumed with `spec` (`resume_problem`: no such job, or it ran another spec),
    else None (a retry of this flow run finds the spec.yaml it wrote: the same spec)."""
    try:
        return resume_problem(spec, job_id, "job_id")
    except BadJobReference as e:
        return str(e)


def completed_before(job: JobDir, spec: JobSpec) -> bool:
    """Whether `job` completed and a resume would redo none of its resumable stages (`grpoflow run --resume` then says
    so and starts no flow run, so nothing is announced twice)."""
    ends = [
        r["event"] for r in read_events(job.events) if r["event"] in ("grpoflow.job.completed", "grpoflow.job.failed")
    ]
    if not ends or ends[-1] != "grpoflow.job.completed":
        return False
    # The resumable stages run whatever the earlier results (their `when` reads only the spec).
    resumable = [stage.resumable() for stage in STAGES if stage.resumable() and stage.when(spec, {})]
    return all(record.is_done(job, spec) for record in resumable)
