"""Job bookkeeping tasks: create the job folder (id, resolved spec.yaml), end the job (`JobEnding`: its last event,
the webhook flush, the uploads), and upload the folder when `output_uri` is remote (`s3://...`: the job runs in a
local staging folder, see `grpoflow.integrations.storage`)."""

import json
import logging
import shutil
from uuid import UUID

from prefect import get_client, get_run_logger, task
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound, TerminationSignal
from prefect.runtime import flow_run
from prefect.states import Cancelled, Crashed, State

from grpoflow.core.jobdir import JobDir, new_job_id, remember, write_text_atomic
from grpoflow.core.spec import JobSpec, to_yaml
from grpoflow.integrations import webhooks
from grpoflow.integrations.artifacts import completed_message
from grpoflow.integrations.events import emit
from grpoflow.integrations.job_folders import download_job, job_dir, job_location, upload_job
from grpoflow.integrations.leases import LeaseHeld, S3Lease
from grpoflow.integrations.stages import rejected
from grpoflow.integrations.storage import is_remote, join
from grpoflow.jobs.lock import JobLock, JobLocked, _alive, _me
from grpoflow.jobs.report import note_undelivered
from grpoflow.tasks import RETRY_DELAY_S

logger = logging.getLogger(__name__)
# The most a job's end waits for its webhook deliveries (a bounded wait: the last events, e.g. job.completed, would
# otherwise be lost when the process exits; a dead endpoint costs at most this).
WEBHOOK_FLUSH_S = 10.0
# Which flow run runs the job, and in which process (`record_flow_run`).
FLOW_RUN_FILE = "flow_run.json"
_this_process_runs: dict[str, str] = {}  # flow run id -> job id


@task(name="create-job")
def create_job_task(spec: JobSpec, job_id: str | None = None) -> JobDir | State:
    """Creates `<output_uri>/<job_id>/` with the resolved spec, locks it, and emits `grpoflow.job.started`.

    An existing folder is reused only when `job_id` is given (a resumed job); a new id never collides. A resumed job
    with a remote output_uri whose staging folder is gone (another machine) is downloaded first; the webhook
    deliveries an earlier run left undelivered are sent again, before job.started (`webhooks.resend`). A folder
    another live run holds (`grpoflow.jobs.lock`) ends the task `Rejected`, naming that run; nothing is
    written or announced.
    """
    job = job_dir(spec.output_uri, job_id or new_job_id(spec.name))
    try:
        lock_remote(job, spec)  # first: two machines resuming one S3 job
    except LeaseHeld as e:
        return rejected(str(e))
    if job_id is not None and is_remote(spec.output_uri) and not job.root.exists():
        download_job(job, job_location(job, spec))
    job.root.mkdir(parents=True, exist_ok=True)
    try:
        JobLock(job.root).acquire()  # released by JobEnding, however the job ends
    except JobLocked as e:
        unlock_remote(job)
        return rejected(str(e))
    mark_stale_flow_run(job)  # the earlier run of a resumed job, killed while its flow run showed Running
    record_flow_run(job)
    write_text_atomic(job.spec, to_yaml(spec))
    remember(job.job_id, job_location(job, spec))  # `grpoflow metrics JOB_ID` then finds it from any folder
    webhooks.resend(job)  # a new job has none; queued first, each endpoint still gets the events in their order
    emit(
        job,
        "grpoflow.job.started",
        {"name": spec.name, "base_model": spec.base_model, "output_dir": job_location(job, spec)},
    )
    return job


# A remote job's lease (`grpoflow.integrations.leases`), renewed every quarter of this while its run lasts: a run on a
# lost machine holds the job for at most this long.
JOB_LEASE_TTL_S = 600.0
JOB_LEASE = ".lease.json"  # at <output_uri>/<job_id>/; hidden names are neither uploaded nor downloaded
_leases: dict[str, S3Lease] = {}  # job id -> the lease this process holds


def lock_remote(job: JobDir, spec: JobSpec) -> None:
    """With a remote output_uri, takes the job's lease on the store itself, which every machine sees (the local
    `.lock` only guards the staging folder of this one); raises `LeaseHeld` naming the live holder."""
    if not is_remote(spec.output_uri) or job.job_id in _leases:
        return
    lease = S3Lease(join(spec.output_uri, job.job_id, JOB_LEASE), JOB_LEASE_TTL_S)
    lease.acquire(what=f"job {job.job_id}")
    lease.heartbeat()
    _leases[job.job_id] = lease


def unlock_remote(job: JobDir) -> None:
    if (lease := _leases.pop(job.job_id, None)) is not None:
        lease.release()


def record_flow_run(job: JobDir) -> None:
    """Writes `<job>/flow_run.json`: this flow run's id and the process running it (pid, host, start time), so that
    a resume after a SIGKILL can tell Prefect that run crashed (`mark_stale_flow_run`)."""
    if flow_run.id is None:
        return
    write_text_atomic(job.root / FLOW_RUN_FILE, json.dumps({"flow_run_id": str(flow_run.id), **_me()}))
    _this_process_runs[str(flow_run.id)] = job.job_id


def mark_stale_flow_run(job: JobDir) -> None:
    """Sets the job's earlier flow run Crashed when Prefect still shows it Running or Pending although its process
    is gone (a SIGKILL of `grpoflow run`, a lost machine): nothing else ever would."""
    try:
        record = json.loads((job.root / FLOW_RUN_FILE).read_text())
        run_id = UUID(record["flow_run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if str(run_id) == str(flow_run.id) or _alive(record):
        return
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(run_id)
        except ObjectNotFound:  # another Prefect server's run (an ephemeral one, since gone)
            return
        if run.state is None or run.state.type not in (StateType.RUNNING, StateType.PENDING):
            return
        message = f"its process (pid {record.get('pid')} on {record.get('host')}) is gone; job {job.job_id} resumed"
        client.set_flow_run_state(run_id, Crashed(message=message), force=True)
    get_run_logger().warning("flow run %s of job %s marked Crashed: %s", run_id, job.job_id, message)


def cancel_interrupted_runs(message: str) -> list[str]:
    """Marks the flow runs this process started and a signal ended (the engine reports them Crashed) Cancelled,
    with `message`; a flow run in any other state is left as it is. Returns the job ids of the runs marked."""
    marked = []
    with get_client(sync_client=True) as client:
        for run_id, job_id in _this_process_runs.items():
            state = client.read_flow_run(UUID(run_id)).state
            if state is not None and state.is_crashed():
                client.set_flow_run_state(UUID(run_id), Cancelled(message=message), force=True)
                marked.append(job_id)
    return marked


def discard_job(job: JobDir) -> None:
    """Removes a job folder whose input was rejected: a rejected job leaves nothing half-written behind."""
    shutil.rmtree(job.root, ignore_errors=True)


# What the job's end writes after the folder was uploaded: uploaded once more.
ANNOUNCED = ("events.jsonl", "webhooks.jsonl", webhooks.OUTBOX, "report.md")


@task(name="upload-job", retries=3, retry_delay_seconds=2 * RETRY_DELAY_S)
def upload_job_task(job: JobDir, spec: JobSpec, names: tuple[str, ...] = ()) -> str | None:
    """`upload_job` as a retried task (logged, visible in the run's graph); see `upload_job`."""
    location = upload_job(job, spec, names)
    if location:
        get_run_logger().info("job folder uploaded to %s", location)
    return location


def upload_failed_job(job: JobDir, spec: JobSpec) -> None:
    """Uploads what a failed job left (logs, metrics, events) for inspection; a failure here is only logged."""
    try:
        upload_job(job, spec)
    except Exception:
        logger.exception("could not upload the failed job %s to %s", job.job_id, spec.output_uri)


class JobEnding:
    """How a job ends, in one place: `with JobEnding(job, spec, resumed) as end:` around the stages.

    `end.completed(result)` uploads the folder (remote output_uri), emits `grpoflow.job.completed` and returns the
    result (the flow run's final state message in `end.message`); `end.rejected(message, keep)` emits
    `grpoflow.job.failed` (reason `rejected`), removes the folder of a new job (unless `keep`) and returns the
    `Rejected` state; `end.cancelled(message)` ends it cancelled (a stage stopped by a cancel, its task Cancelled); an
    exception leaving the block (a failed stage, a cancelled flow run, Ctrl-C) emits `grpoflow.job.failed`, uploads
    what the job left and propagates. Each waits for the webhook deliveries, then lists those still undelivered in
    `report.md`.
    """

    def __init__(self, job: JobDir, spec: JobSpec, resumed: bool):
        self.job, self.spec, self.resumed, self.ended = job, spec, resumed, False
        self.message = None

    def __enter__(self) -> "JobEnding":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is not None and not self.ended:
            # A cancelled flow run (Prefect UI, SIGTERM) or Ctrl-C: the training child is stopped, checkpoints kept.
            reason = "cancelled" if isinstance(error, TerminationSignal | KeyboardInterrupt) else type(error).__name__
            self._announce("grpoflow.job.failed", {"reason": reason, "error": str(error)[-2000:]})
            upload_failed_job(self.job, self.spec)
        JobLock(self.job.root).release()
        unlock_remote(self.job)
        return False

    def rejected(self, message: str, keep: bool = False) -> State:
        """Ends the job rejected; `keep`: its folder stays, as the rejecting stage left it (the canary's verdict and
        log, for the user to read why), uploaded with a remote output_uri. A new job's folder is otherwise removed."""
        self._announce("grpoflow.job.failed", {"reason": "rejected", "error": message})
        if keep:
            upload_failed_job(self.job, self.spec)
        elif not self.resumed:  # never delete an earlier job's checkpoints over a rejected input
            discard_job(self.job)
        return rejected(message)

    def cancelled(self, message: str) -> None:
        """The flow run was cancelled while a stage worked (the stage's task ended Cancelled): the job ends failed
        (reason `cancelled`), its folder and checkpoints kept for a resume."""
        self._announce("grpoflow.job.failed", {"reason": "cancelled", "error": message})
        upload_failed_job(self.job, self.spec)

    def completed(self, result: dict) -> dict:
        # The flow run's final state says how it went (`end.message`): the held-out score and the health verdict.
        self.message = completed_message(self.job, self.spec, result.get("evaluation"))
        # Uploaded before job.completed announces the folder, then once more for the events that announced it; a
        # local output_uri has nothing to upload (no task runs in the run's graph that did nothing).
        remote = is_remote(self.spec.output_uri)
        if remote:
            upload_job_task(self.job, self.spec)
        self._announce("grpoflow.job.completed", result)
        if remote:
            upload_job_task(self.job, self.spec, names=ANNOUNCED)
        return result

    def _announce(self, event: str, payload: dict) -> None:
        self.ended = True
        emit(self.job, event, payload)
        webhooks.flush(timeout=WEBHOOK_FLUSH_S)
        note_undelivered(self.job, webhooks.undelivered(self.job))  # `grpoflow webhooks retry` sends them
