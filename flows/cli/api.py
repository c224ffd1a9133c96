"""`grpoflow api`: the jobs API (FastAPI on uvicorn) for the teams whose keys `grpoflow api keys add` made.

    grpoflow api keys add --team vision --name ci     # prints the key once; the keys file keeps its SHA-256
    grpoflow api --host 127.0.0.1 --port 8600          # serves /v1/training_jobs, /v1/files, /v1/fine_tuning/jobs

With PREFECT_API_URL set the API submits to that server's deployments; without, it starts a temporary Prefect server,
deploys the project (`--project`) to it and runs a process worker of its own (`deploy_here`), and stops both when it
stops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from grpoflow.core.apikeys import DEFAULT_KEYS_FILE
from grpoflow.flows.errors import EXIT_OK, Stopped, UsageError

# How `grpoflow api` hands its options to the app uvicorn builds: the API sits above the CLI's layer (flows/), so the
# CLI names it by its import string, as `uvicorn grpoflow.api.app:app_from_env --factory` would.
API_CONFIG_ENV = "GRPOFLOW_API_CONFIG"
APP_FACTORY = "grpoflow.api.app:app_from_env"


def cmd_api_keys_add(args) -> int:
    from grpoflow.core.apikeys import KeysError, add_key

    try:
        key = add_key(Path(args.keys), args.team, args.name or "")
    except KeysError as e:
        raise UsageError(str(e)) from None
    print(key)
    print(f"# team {args.team}: shown once; {args.keys} keeps only its SHA-256", file=sys.stderr)
    return EXIT_OK


def cmd_api(args) -> int:
    from grpoflow.integrations.prefect_server import connected, start_if_needed

    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: not a TCP port")
    keys = Path(args.keys).resolve()
    if not keys.is_file():
        raise UsageError(f"--keys {keys}: no keys file; make a key with `grpoflow api keys add --team NAME`")
    if "://" in args.output_uri_api:
        raise UsageError(f"--output-uri {args.output_uri_api}: a local folder (the API keeps its records there)")
    project = Path(args.project).resolve()
    if args.max_upload_mb < 1:
        raise UsageError(f"--max-upload-mb {args.max_upload_mb}: at least 1")
    config = {"keys": str(keys), "output_uri": args.output_uri_api, "deployment": args.deployment,
              "project": str(project), "max_upload_bytes": args.max_upload_mb * 2**20}  # fmt: skip
    os.environ[API_CONFIG_ENV] = json.dumps(config)
    server, workers = start_if_needed(), []
    try:
        with connected(server):
            if server is not None:  # no Prefect server configured: a temporary one, deployed to, with a worker
                workers = deploy_here(project)
            import uvicorn

            # uvicorn stops gracefully on SIGTERM, then raises it again for the handler it found: this one, so that
            # the worker and the server below are stopped too (the default handler would end the process at once).
            signal.signal(signal.SIGTERM, _stopped)
            uvicorn.run(APP_FACTORY, factory=True, host=args.host, port=args.port, log_level="warning")
    finally:
        try:
            for worker in workers:
                stop_worker(worker)
        finally:
            if server is not None:
                server.stop()
    return EXIT_OK


def _stopped(signum, frame):
    raise Stopped(signum)


def stop_worker(worker: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Stops a worker `deploy_here` started: SIGINT, on which Prefect's worker stops (on SIGTERM it only passes a
    SIGINT on), then SIGKILL if it is still there after `timeout_s`."""
    worker.send_signal(signal.SIGINT)
    try:
        worker.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def deploy_here(project: Path) -> list[subprocess.Popen]:
    """Deploys `project` to the temporary server (`grpoflow deployments apply`'s steps) and starts a process worker
    for each of its process pools; returns the workers, which die with this process."""
    import asyncio

    from grpoflow.flows.deployments import deploy_all, ensure_pools, load_pools
    from grpoflow.flows.project import project_files
    from grpoflow.integrations.prefect_server import _die_with_parent

    prefect_file, pools_file = project_files(project)
    pools = load_pools(pools_file)
    for line in asyncio.run(ensure_pools(pools)):
        print(f"grpoflow api: {line}", file=sys.stderr)
    deploy_all(prefect_file, project)
    command = [sys.executable, "-P", "-m", "prefect", "worker", "start", "--pool"]
    return [
        subprocess.Popen(
            [*command, pool["name"]],
            cwd=project,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's Ctrl-C reaches the API, which stops the worker itself
            preexec_fn=_die_with_parent,
        )
        for pool in pools
        if pool["type"] == "process"
    ]


def add_api_command(sub) -> None:
    api = sub.add_parser(
        "api",
        help="serve the jobs API: Veri's /v1/training_jobs and OpenAI's /v1/files and /v1/fine_tuning/jobs",
    )
    api.add_argument("--host", default="127.0.0.1", help="address to listen on")
    api.add_argument("--port", type=int, default=8600, help="port to listen on")
    api.add_argument("--keys", default=str(DEFAULT_KEYS_FILE), help="the keys file (`grpoflow api keys add`)")
    api.add_argument(
        "--output-uri",
        dest="output_uri_api",
        default="runs",
        help="where the teams' jobs (<output-uri>/<team>/) and uploaded files (<output-uri>/files/<team>/) go",
    )
    api.add_argument("--deployment", default="retrain", help="the grpo-pipeline deployment the teams' ones copy")
    api.add_argument("--project", default=".", help="the project folder deployed to a temporary server")
    api.add_argument("--max-upload-mb", type=int, default=512, metavar="MB",
                     help="the largest file POST /v1/files takes (default: 512)")  # fmt: skip
    api.set_defaults(func=cmd_api)
    groups = api.add_subparsers(dest="group", metavar="{keys}")
    keys = groups.add_parser("keys", help="the API's keys")
    actions = keys.add_subparsers(dest="action", required=True, metavar="{add}")
    add = actions.add_parser("add", help="make a key of a team: printed once, its SHA-256 stored")
    add.add_argument("--team", required=True, help="the team the key belongs to")
    add.add_argument("--name", help="a label for the key")
    add.add_argument("--keys", default=str(DEFAULT_KEYS_FILE), help="the keys file")
    add.set_defaults(func=cmd_api_keys_add)
