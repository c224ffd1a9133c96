"""`grpoflow deployments apply`, `submit` and `sweep`: grpoflow on a Prefect server.

grpoflow deployments apply
grpoflow submit spec.yaml --wait
grpoflow sweep examples/arithmetic.yaml --grid trl.loss_type=grpo,dr_grpo --max-concurrent 1
"""

import json
import signal
import sys
from pathlib import Path

from grpoflow.flows.cli.common import (
    _hidden_output_uri,
    _no_preflight_argument,
    _Parser,
    _positive,
    _spec_arguments,
    check_this_machine,
    load,
    preflight,
)
from grpoflow.flows.cli.models import cmd_deployments_list
from grpoflow.flows.cli.run import _STOPPED_BY, _restore_signals, _stop_on_signals, refuse_approval
from grpoflow.flows.errors import (
    EXIT_OK,
    Diverged,
    Failed,
    Rejected,
    Stopped,
    UsageError,
)


def cmd_deployments_apply(args) -> int:
    import asyncio

    from grpoflow.flows.deployments import (
        api_url,
        deploy_all,
        describe_deployments,
        ensure_pools,
        load_pools,
        server_calls,
        start_watchers,
    )
    from grpoflow.flows.project import project_files

    project = Path(args.project).resolve()
    prefect_file, pools_file = project_files(project)
    url = api_url()
    with server_calls(url):
        for line in asyncio.run(ensure_pools(load_pools(pools_file))):
            print(line)
        deploy_all(prefect_file, project)
        for line in asyncio.run(describe_deployments(prefect_file)):
            print(line)
        for line in asyncio.run(start_watchers(prefect_file)):
            print(line)
    print(f"deployed to {url}; start a worker with: prefect worker start --pool grpo-gpu")
    return EXIT_OK


def cmd_submit(args) -> int:
    import asyncio

    from grpoflow.flows.deployments import api_url, deployment_name, flow_run_url, server_calls, submit, wait_for

    spec = load(args)  # a rejected spec stops here: nothing is sent
    server = api_url()  # no server to send to is said first, before the preflight reads the model and the dataset
    preflight(args, spec)
    with server_calls(server):
        flow_run = asyncio.run(submit(spec, args.deployment))
    url = flow_run_url(flow_run)
    if not args.json:
        print(f"submitted {spec.name} to {deployment_name(args.deployment)}: flow run {flow_run.name}")
        print(url)
    if args.wait:
        with server_calls(server):
            flow_run = asyncio.run(wait_for(flow_run.id))
    state = flow_run.state.name if flow_run.state else "Scheduled"
    if args.json:
        out = {"flow_run_id": str(flow_run.id), "flow_run_name": flow_run.name, "url": url, "state": state}
        print(json.dumps(out))
    elif args.wait:
        message = flow_run.state.message
        print(f"flow run {flow_run.name}: {state}" + (f" ({message})" if message else ""))
    if args.wait and not flow_run.state.is_completed():
        raise run_ending(flow_run.state)  # the line above said how it ended
    return EXIT_OK


def run_ending(state) -> Exception:
    """What a flow run that did not complete ends the command with, as `grpoflow run` would for the same end: Rejected
    (exit 2) for a rejected spec or a training setup problem, Diverged (4) for the health monitor's stop, else Failed
    (1). A server's run holds its exception only as the state's message, which Prefect begins with the class name."""
    from grpoflow.integrations.stages import REJECTED

    message = state.message or ""
    if state.name == REJECTED or message.startswith("Flow run encountered an exception: TrainingSetupError: "):
        return Rejected("")
    if message.startswith("Flow run encountered an exception: TrainingStopped: "):
        return Diverged("")
    return Failed("")


def cmd_sweep(args) -> int:
    """`grpoflow sweep SPEC --grid k=v1,v2 ...`: every combination validated (and preflighted) first, then one job
    per combination (flows/sweep.py), then the comparison report. Exit 0 all completed, 1 some failed, 2 rejected."""
    from grpoflow.core.spec import SpecError
    from grpoflow.flows.sweep import combination_name, combination_spec, grid_overrides, new_sweep_id, parse_grid

    grid = parse_grid(args.grid or [])
    spec = load(args)
    if not args.deployment:  # the jobs run here, on this command's Prefect server
        from grpoflow.integrations import prefect_server as server

        if server.needed():
            refuse_approval(spec)
    combinations = grid_overrides(spec, grid)
    if args.deployment:
        from grpoflow.flows.deployments import ServerNotSet, api_url

        try:
            api_url()  # jobs on a server's deployment need that server: a temporary one would end with this command
        except ServerNotSet as e:
            raise UsageError(f"--deployment: {e}") from None
    for values in combinations:  # what `run` checks, for each job, before anything starts
        job_spec = combination_spec(spec, values)
        try:
            preflight(args, job_spec)
            check_this_machine(job_spec)
        except SpecError as e:
            raise SpecError([f"combination {combination_name(values)}: {p}" for p in e.problems]) from None
    print(f"sweep of {len(combinations)} jobs, at most {args.max_concurrent} at once", file=sys.stderr)
    from grpoflow.integrations import prefect_server as server

    sweep_id, previous, temporary = new_sweep_id(spec.name), _stop_on_signals(), None
    try:
        temporary = server.start_if_needed()
        from grpoflow.flows.sweep import grpo_sweep

        with server.connected(temporary):
            state = grpo_sweep(spec, grid, args.max_concurrent, args.deployment, sweep_id=sweep_id, return_state=True)
    except KeyboardInterrupt:
        if not _STOPPED_BY:
            raise
        print(f"grpoflow: sweep stopped by {signal.Signals(_STOPPED_BY[0]).name}", file=sys.stderr)
        raise Stopped(_STOPPED_BY[0]) from None
    finally:
        if temporary is not None:
            temporary.stop()
        _restore_signals(previous)
    return _sweep_result(args, spec, sweep_id, state)


def _sweep_result(args, spec, sweep_id: str, state) -> int:
    """Prints the sweep's report (`--json`: sweep.json with its folder); raises when the sweep did not complete."""
    from grpoflow.flows.sweep import report_dir, table_rows
    from grpoflow.integrations.stages import REJECTED
    from grpoflow.integrations.storage import filesystem, join

    if state.name == REJECTED:
        raise Rejected(f"rejected: {state.message}")
    folder = report_dir(spec.output_uri, sweep_id)
    fs, path = filesystem(join(folder, "sweep.json"))
    if not fs.exists(path):  # the sweep itself broke before its report
        raise Failed(f"sweep failed: {state.message}")
    with fs.open(path, "rb") as f:
        summary = json.loads(f.read())
    if args.json:
        print(
            json.dumps({**summary, "report_dir": folder, "status": "completed" if state.is_completed() else "failed"})
        )
    else:
        best = summary["best"]
        for row, line in zip(summary["jobs"], table_rows(summary["jobs"], None), strict=True):
            mark = "  * best" if best and row["job_id"] == best else ""
            values = ", ".join(f"{k}={v}" for k, v in row["values"].items())
            print(f"{values}: {line['status']}  {line['job']}  held-out {line['held-out before → after']}{mark}")
        print(f"sweep {sweep_id} {state.message}")
        print(f"report: {join(folder, 'sweep.md')}")
    if not state.is_completed():
        raise Failed("")  # the report above says which jobs failed
    return EXIT_OK


def _add_server_commands(sub) -> None:
    """`deployments apply` and `submit`: grpoflow on a Prefect server (flows/deployments.py)."""
    deployments = sub.add_parser(
        "deployments", help="deploy grpoflow's flows to the Prefect server at PREFECT_API_URL (Prefect deployments)"
    )
    actions = deployments.add_subparsers(dest="action", required=True, parser_class=_Parser)
    apply = actions.add_parser(
        "apply", help="create the work pools when missing and deploy the project's prefect.yaml (`grpoflow init`)"
    )
    apply.add_argument("--project", default=".", metavar="DIR", help="the project folder (default: this one)")
    apply.set_defaults(func=cmd_deployments_apply)
    listing = actions.add_parser("list", help="old spelling of `grpoflow serving list` (the serving registry)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    _hidden_output_uri(listing)
    listing.set_defaults(func=cmd_deployments_list)
    submit = sub.add_parser("submit", help="validate a spec here, then start a deployment's run with it")
    _spec_arguments(submit)
    submit.add_argument("--deployment", default="retrain", help="a deployment of grpo-pipeline (default: retrain)")
    submit.add_argument("--wait", action="store_true", help="wait for the run to end; exit 1 unless it completed")
    submit.add_argument("--json", action="store_true", help="print JSON")
    _no_preflight_argument(submit)
    _hidden_output_uri(submit)
    submit.set_defaults(func=cmd_submit)


def _add_sweep_command(sub) -> None:
    """`sweep`: one job per combination of grid values, then a comparison report (flows/sweep.py)."""
    sweep = sub.add_parser("sweep", help="run one job per combination of --grid values, then compare them")
    _spec_arguments(sweep)
    sweep.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        help="a spec field (dotted path, as --set) and the values to try; each combination of grids is one job",
    )
    sweep.add_argument("--max-concurrent", type=_positive, default=1, metavar="N", help="jobs at once (default: 1)")
    sweep.add_argument(
        "--deployment",
        help="run each job as a flow run of this grpo-pipeline deployment (e.g. retrain) on PREFECT_API_URL's "
        "server, instead of here",
    )
    sweep.add_argument("--json", action="store_true", help="print the report as JSON")
    _no_preflight_argument(sweep)
    _hidden_output_uri(sweep)
    sweep.set_defaults(func=cmd_sweep)
