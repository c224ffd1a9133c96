"""The `grpoflow` parser from every command group's, and `main`: a command's exception mapped to its exit code."""

import argparse
import json
import os
import select
import signal
import sys
import time

from grpoflow.core.trust import command_line
from grpoflow.flows.cli.api import add_api_command
from grpoflow.flows.cli.common import (
    _hidden_output_uri,
    _job_id_argument,
    _no_preflight_argument,
    _Parser,
    _spec_arguments,
)
from grpoflow.flows.cli.jobs import (
    SWEEP_COMPARE,
    _add_compare_command,
    _add_rollouts_command,
    _add_webhooks_command,
    cmd_jobs,
    cmd_metrics,
    cmd_model,
)
from grpoflow.flows.cli.models import _add_model_commands
from grpoflow.flows.cli.policy import add_policy_command
from grpoflow.flows.cli.run import cmd_canary, cmd_demo, cmd_init, cmd_run, cmd_validate
from grpoflow.flows.cli.server import _add_server_commands, _add_sweep_command
from grpoflow.flows.cli.tools import _add_graders_command, _add_k8s_command
from grpoflow.flows.errors import (
    EXIT_REJECTED,
    UsageError,
    exit_code,
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="grpoflow", description="GRPO fine-tuning pipelines on Prefect.")
    parser.add_argument("--output-uri", help="output root for jobs (default: the spec's output_uri, else ./runs)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def spec_command(name, help_text):
        p = sub.add_parser(name, help=help_text)
        _spec_arguments(p)
        p.add_argument("--json", action="store_true", help="print JSON")
        return p

    validate = spec_command("validate", "check a spec and print it with every default filled")
    _no_preflight_argument(validate)
    validate.set_defaults(func=cmd_validate)
    canary = spec_command("canary", "one training step at full length here: does the job fit, how long will it take")
    canary.set_defaults(func=cmd_canary)
    run = spec_command("run", "run the whole pipeline")
    run.add_argument("--resume", metavar="JOB_ID", help="continue an existing job folder")
    run.set_defaults(func=cmd_run)
    demo = sub.add_parser("demo", help="run the shipped arithmetic example offline on CPU")
    demo.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a field of the shipped spec (dotted path)"
    )
    demo.add_argument("--json", action="store_true", help='print {"job_id", "output_dir", "status"}')
    demo.set_defaults(func=cmd_demo)
    init = sub.add_parser("init", help="write a project of your own: prefect.yaml, a spec, a reward module, data/")
    init.add_argument("dir", help="the project folder to create (new or empty)")
    init.set_defaults(func=cmd_init)
    jobs = sub.add_parser("jobs", help="list jobs under the output root")
    jobs.add_argument(
        "--json", action="store_true", help='print {"jobs": [{"job_id", "status", "steps", "stopped_by"}]}'
    )
    jobs.set_defaults(func=cmd_jobs)
    metrics = sub.add_parser(
        "metrics",
        help="a job's metric series",
        description="A table of the main series per step: reward, reward_std, each reward's mean, kl, loss, "
        "completion length (length), share of completions cut (clipped), held-out score (eval/<metric>).",
    )
    _job_id_argument(metrics)
    metrics.add_argument(
        "--keys", help="comma-separated metric names as metrics.jsonl has them, e.g. reward,rewards/exact_answer/mean"
    )
    metrics.add_argument("--all", action="store_true", help="every series the job logged (~45 columns)")
    metrics.add_argument("--json", action="store_true", help='print {"metrics": [{"step", "values"}]}')
    metrics.set_defaults(func=cmd_metrics)
    model = sub.add_parser("model", help="a job's trained artifact (model.json)")
    _job_id_argument(model)
    model.add_argument("--json", action="store_true", help="print JSON (default: YAML)")
    model.set_defaults(func=cmd_model)
    _add_webhooks_command(sub)
    _add_server_commands(sub)
    _add_model_commands(sub)
    _add_sweep_command(sub)
    _add_graders_command(sub)
    _add_k8s_command(sub)
    _add_rollouts_command(sub)
    _add_compare_command(sub)
    add_policy_command(sub)
    add_api_command(sub)
    for p in (run, demo, jobs, metrics, model, sub.choices["validate"]):
        _hidden_output_uri(p)
    return parser


def main(argv=None) -> int:
    started, args = time.time(), None
    try:
        args = build_parser().parse_args(two_word_commands(sys.argv[1:] if argv is None else argv))
        args.started = started
        with command_line():  # the user's own command: its specs may name any module (core/trust.py)
            return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C before `run` handles it (loading the spec, the preflight), or another command
        print("grpoflow: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Exception as e:
        code = exit_code(e)
        if code is None:  # a bug: its traceback
            raise
        if str(e):  # a parser's mistake names its command already (`grpoflow validate: ...`)
            named = isinstance(e, UsageError) and str(e).startswith("grpoflow")
            print(str(e) if named else f"grpoflow: {e}", file=sys.stderr)
        if code == EXIT_REJECTED and getattr(args, "json", False):  # a script reading stdout gets an answer too
            print(json.dumps({"status": "rejected", "problems": getattr(e, "problems", None) or [str(e)]}))
        return code


def two_word_commands(argv: list) -> list:
    """`argv` with `sweep compare` as the one command it is (argparse reads `sweep compare` as `sweep` of a spec file
    named compare, unless there is such a file)."""
    argv = [str(a) for a in argv]
    at = argv.index("sweep") if "sweep" in argv else -1
    if at >= 0 and argv[at + 1 : at + 2] == ["compare"] and not os.path.isfile("compare"):
        return [*argv[:at], SWEEP_COMPARE, *argv[at + 2 :]]
    return argv


def _stdout_gone() -> bool:
    """Whether stdout is a pipe (or terminal) whose reader went away, as `grpoflow jobs | head -3` leaves it; not a
    broken pipe of another kind (a socket, a child's stdin), which stays a traceback."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def entry() -> None:
    """The `grpoflow` command: `main()`, its return value the exit code."""
    try:
        code = main()
        if sys.stdout is not None:  # None when started with stdout closed (`>&-`)
            sys.stdout.flush()  # here, not at exit, so that a reader gone away is caught below
    except BrokenPipeError:
        if not _stdout_gone():
            raise
        # Python's advice (the signal module's "Note on SIGPIPE"): stdout to devnull, so the flush at exit cannot fail
        # again, and exit quietly; 128 + SIGPIPE, the code of a program SIGPIPE ended (`yes | head`).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    sys.exit(code)
