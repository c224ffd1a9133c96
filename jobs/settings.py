"""Every `GRPOFLOW_*` environment setting the code reads: the one written copy of what each does and its default.

The docs' settings page is generated from `SETTINGS` (docs/gen_reference.py), and tests/test_docs.py fails when the
product code names a `GRPOFLOW_*` variable this table lacks, or the table keeps one the code no longer names. The
modules that read a setting keep its name as a constant of their own (`IMAGE_ENV`, `STAGING_ENV`, ...); this module
only describes them (it imports nothing; the docs and their tests read it).

    python -m grpoflow.jobs.settings    # prints the table as markdown
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One environment setting.

    Args:
        default (`str`): what applies when it is unset, in words (a value, or what happens).
        does (`str`): what it changes, and who reads it.
        internal (`bool`, *optional*, defaults to `False`): grpoflow sets it for processes it starts; a user never
            needs to.
    """

    default: str
    does: str
    internal: bool = False


SETTINGS = {
    # --- where things go
    "GRPOFLOW_OUTPUT_URI": Setting(
        "the spec's output_uri (`runs`)",
        "Output root of every command, as `--output-uri`: a local folder or `s3://bucket/prefix`.",
    ),
    "GRPOFLOW_JOB_INDEX": Setting(
        "`~/.grpoflow/jobs`",
        "Folder of the job index: one file per job naming where its folder is, so `grpoflow metrics JOB_ID` (and "
        "`model`, `publish`, `deploy`) find a job from any folder.",
    ),
    "GRPOFLOW_CACHE": Setting(
        "`~/.cache/grpoflow`",
        "Cache folder of the built-in models (`builtin:tiny`) and of `.gguf` files converted to model folders "
        "(`gguf/`).",
    ),
    "GRPOFLOW_STAGING_DIR": Setting(
        "`~/.grpoflow/staging`",
        "Local folder where a job whose output_uri is remote runs before it is uploaded; with "
        "distributed.num_machines > 1, the shared volume's mount path on every node.",
    ),
    "GRPOFLOW_STORAGE_BLOCK": Setting(
        "unset: s3fs reads the AWS_* variables",
        "Name of a Prefect `RemoteFileSystem` block whose settings are the fsspec options (endpoint, credentials) "
        "of remote URIs; passed on to Kubernetes training pods.",
    ),
    "GRPOFLOW_WATCH_STATE_DIR": Setting(
        "`~/.grpoflow/watch-state`",
        "Where the data watcher (`watch-new-data`) records the object versions it has announced, so that none is "
        "announced twice.",
    ),
    # --- what a spec may run (the work pool's environment)
    "GRPOFLOW_POLICY": Setting(
        "unset: the project's .grpoflow/policy.yaml, else the built-in defaults",
        "The operator's policy file: what a spec from a deployment may name (code, paths, stores, hosts, key "
        "variables, models, trl: keys), its limits, teams and the job variables a run may set "
        "(docs/guides/security.md). Set it in the worker's environment or the pool's template, where no run can "
        "change it; `grpoflow policy show` prints what is in force.",
    ),
    "GRPOFLOW_REWARD_MODULES": Setting(
        "no longer read",
        "Replaced by the policy's `from_deployments.modules`; a refusal it would have allowed says so.",
    ),
    "GRPOFLOW_ALLOW_SPEC_CODE": Setting(
        "no longer read",
        "Replaced by the policy's `from_deployments.python_graders` (`sandboxed` or `off`): spec code from a "
        "deployment never runs outside the sandbox.",
    ),
    "GRPOFLOW_DEPLOYED_PATHS": Setting(
        "no longer read", "Replaced by the policy's `from_deployments.paths`; a refusal it would have allowed says so."
    ),
    "GRPOFLOW_ALLOW_LINK_LOCAL_URLS": Setting(
        "unset: refused",
        "`1` allows endpoints on link-local and cloud-metadata addresses (webhooks, judges, a vLLM server), which a "
        "spec could otherwise use to reach the machine's own credentials.",
    ),
    "GRPOFLOW_SANDBOX_MEMORY_MB": Setting(
        "2048",
        "Memory of a sandbox as a whole where a cgroup memory controller is writable, and of each of its processes "
        "(address space), in MiB; a grader's `memory_mb` may only lower it.",
    ),
    "GRPOFLOW_SANDBOX_MAX_PROCESSES": Setting("16", "Processes and threads a sandbox may hold at once."),
    "GRPOFLOW_SANDBOX_DISK_MB": Setting(
        "256", "Size of the sandbox's private tmpfs and the largest file it may write, in MiB."
    ),
    "GRPOFLOW_SANDBOX_CPU_SECONDS": Setting("600", "CPU seconds of each sandboxed process."),
    # --- outbound HTTP (judges, graders, webhooks)
    "GRPOFLOW_HTTP_DEADLINE_S": Setting(
        "unset: each request's own timeout",
        "A ceiling on every outbound request's total seconds (LLM judges, model graders, webhooks).",
    ),
    "GRPOFLOW_HTTP_MAX_RESPONSE_MB": Setting(
        "10", "The largest reply an outbound request reads, in MB (10**6 bytes); a larger one is an error."
    ),
    # --- crashed runs
    "GRPOFLOW_AUTO_RESUME": Setting(
        "2",
        "How many times grpo-pipeline/resume resumes one job whose deployment run ended Crashed (its process or "
        "machine lost), each from the job's last checkpoint; 0: never. Read by the worker running that deployment.",
    ),
    # --- timing
    "GRPOFLOW_RETRY_DELAY_S": Setting("5", "Seconds a pipeline task waits before a retry."),
    "GRPOFLOW_REWARD_DRY_RUN_TIMEOUT": Setting(
        "10",
        "Seconds one reward call may take in the dry run before training (a number > 0); during training "
        "health.reward_timeout_s applies.",
    ),
    "GRPOFLOW_K8S_START_TIMEOUT_S": Setting(
        "1800",
        "With distributed.num_machines > 1: how long the TrainJob's pods may wait to run once admitted (image pull, "
        "GPU nodes scaling up).",
    ),
    "GRPOFLOW_CANARY_JOIN_TIMEOUT_S": Setting(
        "300",
        "With distributed.num_machines > 1: seconds the canary's ranks wait for each other to join (pods of one "
        "TrainJob may start minutes apart); a rank missing then fails the canary, named.",
    ),
    # --- Kubernetes and images
    "GRPOFLOW_IMAGE": Setting(
        "unset: the -k8s deployments are not deployed",
        "The image repository: `grpoflow deployments apply` builds and pushes the training image there for the "
        "Kubernetes deployments; `grpoflow k8s render` and multi-node TrainJobs run it.",
    ),
    "GRPOFLOW_K8S_NAMESPACE": Setting(
        "the service account's namespace, else `default`", "Namespace of the multi-node TrainJobs."
    ),
    "GRPOFLOW_K8S_SERVICE_ACCOUNT": Setting(
        "the flow run pod's", "Service account of the multi-node TrainJobs' pods."
    ),
    "GRPOFLOW_S3_SECRET": Setting(
        "`grpoflow-s3`", "Kubernetes Secret holding the S3 credentials mounted into multi-node training pods."
    ),
    "GRPOFLOW_VERSION": Setting(
        "the image's build argument (the grpoflow release)",
        "The grpoflow version `scripts/install.sh` installs in a project's image (`--build-arg GRPOFLOW_VERSION=`).",
    ),
    "GRPOFLOW_WEBHOOK_SECRET": Setting(
        "none",
        "The usual name of a webhook's signing secret: `webhooks[].secret_env` names the variable (any name); "
        "without it in the environment, the Prefect Secret block `grpoflow-webhook-secret` is read.",
    ),
    # --- set by grpoflow for the processes it starts
    "GRPOFLOW_PROJECT_DIR": Setting(
        "set by `grpoflow deployments apply`",
        "The project folder, in the environment of the `prefect deploy` it runs (prefect.yaml may use "
        "`{{ $GRPOFLOW_PROJECT_DIR }}`).",
        internal=True,
    ),
    "GRPOFLOW_RUN_STARTED": Setting(
        "set by `grpoflow run`",
        "Unix time the command started, so the report's wall time counts from the command, not the flow run.",
        internal=True,
    ),
    "GRPOFLOW_API_CONFIG": Setting(
        "unset",
        "What `grpoflow api` was started with (JSON: the keys file, output root, deployment, project), read by the "
        "app uvicorn builds (`grpoflow.api.app:app_from_env`).",
        internal=True,
    ),
    "GRPOFLOW_SPEC_ORIGIN": Setting(
        "set for the training children",
        "`command_line` or `deployment`: where the job's spec came from, which decides the code it may run.",
        internal=True,
    ),
    "GRPOFLOW_CANARY": Setting(
        "set by the canary stage", "Its GRPO child runs one measured step and saves nothing.", internal=True
    ),
    "GRPOFLOW_VLLM_SERVER_URL": Setting(
        "set by the training task",
        "URL of the vLLM server it started (generation.vllm_mode: server), for the GRPO child; a child started by "
        "hand needs it, or generation.vllm_server_url.",
        internal=True,
    ),
    "GRPOFLOW_CHILD_STANDIN": Setting(
        "unset",
        "Tests only: a module that replaces the training children (tests/standin_child.py).",
        internal=True,
    ),
}


def settings_table() -> str:
    """The settings as a markdown table (name | default | what it does), those a user sets first.

    Returns:
        `str`: the table the docs' settings page holds.
    """
    from grpoflow.core.spec.markdown import cell, table

    ordered = sorted(SETTINGS.items(), key=lambda item: item[1].internal)
    rows = [
        [f"`{name}`", cell(s.default), cell(s.does + (" (set by grpoflow)" if s.internal else ""))]
        for name, s in ordered
    ]
    return table(["setting", "default", "what it does"], rows)


if __name__ == "__main__":
    print(settings_table())
