"""What every `grpoflow` command shares: the output root, loading a spec (with the policy's limit warnings), the
preflight, and the parser every command's parser is (`_Parser`: a mistake is a `UsageError`, exit 2).
"""

import argparse
import os
import sys
from importlib.resources import files
from pathlib import Path

from grpoflow.flows.errors import (
    UsageError,
    exits_epilog,
)

# The demo's spec, data and reward module ship as package data: found from any install, not only a checkout.


# The demo's spec, data and reward module ship as package data: found from any install, not only a checkout.
EXAMPLES = Path(str(files("grpoflow.examples")))


DEMO_SPEC = EXAMPLES / "arithmetic.yaml"


def output_uri(args) -> str | None:
    """`--output-uri` or `GRPOFLOW_OUTPUT_URI` as given: a folder or `s3://bucket/prefix`."""
    return getattr(args, "output_uri", None) or os.environ.get("GRPOFLOW_OUTPUT_URI")


def output_root(args) -> Path | None:
    """The output root chosen by `--output-uri` or `GRPOFLOW_OUTPUT_URI`, as a local folder; None when neither is set.
    A remote root is read through a local copy of its jobs' top-level files (spec, metrics, events, model.json)."""
    from grpoflow.integrations.job_folders import local_root

    root = output_uri(args)
    return local_root(root) if root else None


def roots_to_search(args) -> list[str]:
    """Where to look for jobs: `--output-uri` alone when given, else `./runs` and the job index's roots."""
    from grpoflow.integrations.job_folders import search_roots

    return search_roots(output_uri(args))


def load(args, extra_overrides: list[str] = ()):
    from grpoflow.core.spec import load_spec

    overrides = [*extra_overrides, *(args.set or [])]
    root = output_uri(args)
    if root is not None:
        overrides.append(f"output_uri={root}")
    spec, warnings = load_spec(args.spec, overrides)
    for warning in warnings + limit_warnings(spec):
        print(f"warning: {warning}", file=sys.stderr)
    return spec


def limit_warnings(spec) -> list[str]:
    """Where `spec` asks for more than the policy's limits (which refuse it from a deployment; here it runs)."""
    from grpoflow.core.policy import PolicyError, limit_excess, load_policy

    try:
        loaded = load_policy()
    except PolicyError as e:
        return [str(e)]
    return [
        f"{where}: {what} (the policy's `limits.{key}`, {loaded.source}: a deployment would refuse this spec)"
        for where, what, key in limit_excess(spec, loaded.policy.limits)
    ]


def find_args_job(args, job_id: str):
    """The job folder of `job_id` and its location, under `--output-uri` when given
    (`grpoflow.integrations.job_folders`)."""
    from grpoflow.integrations.job_folders import find_job

    return find_job(job_id, output_uri(args))


def preflight(args, spec) -> None:
    """Runs the preflight checks (jobs/preflight.py: the model, its tokenizer, the dataset, the rewards' dry run;
    offline, no weights loaded) and raises `SpecError` (exit 2) listing every problem. `--no-preflight` skips them,
    for a spec whose paths and Hub cache are a worker's, not this machine's."""
    if getattr(args, "no_preflight", False):
        return
    from grpoflow.core.spec import SpecError
    from grpoflow.integrations.storage import storage_options
    from grpoflow.jobs.preflight import preflight as check

    warnings = []
    validation = spec.evaluation.dataset
    options = storage_options(spec.dataset.uri) or (storage_options(validation.uri) if validation else {})
    problems = check(spec, warnings, options)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if problems:
        raise SpecError(problems)


def check_this_machine(spec) -> None:
    """`run` trains on this machine: what the spec needs of it (a CUDA GPU and vllm for generation.engine vllm,
    DeepSpeed for zero2/zero3, Liger, Unsloth) is checked before anything starts (exit 2), as the training child
    would check it after the ingest. Specs that need none of these do not import torch here."""
    from grpoflow.core.errors import SetupError
    from grpoflow.core.spec import SpecError
    from grpoflow.trainers.model.load import check_accelerators, needs_cuda

    if needs_cuda(spec):
        try:
            check_accelerators(spec)
        except SetupError as e:
            raise SpecError([str(e)]) from None


def _step(text: str) -> int:
    """argparse type of --step: an integer >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number (an integer >= 0)")
    return int(text)


class _Parser(argparse.ArgumentParser):
    """Every grpoflow parser: a mistake is a `UsageError` (exit 2), and `--help` ends with the command's exit codes
    (`grpoflow.flows.errors.COMMAND_EXITS`, by the words after `grpoflow` in its prog)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # the codes one a line
        super().__init__(*args, **kwargs)
        if self.epilog is None:
            command = self.prog.split(" ", 1)[1] if " " in self.prog else None
            self.epilog = exits_epilog(command)

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _positive(text: str) -> int:
    """argparse type of --max-concurrent: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def _spec_arguments(parser) -> None:
    """The spec file and its `--set` overrides, as every command that reads a spec takes them."""
    parser.add_argument("spec", help="job spec YAML file")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec field (dotted path)")


def _spec_subcommand(sub, group: tuple[str, str], action: tuple[str, str]):
    """`grpoflow GROUP ACTION SPEC [--set ...]` (each a (name, help) pair): the action's parser, for its options."""
    parent = sub.add_parser(group[0], help=group[1])
    actions = parent.add_subparsers(dest="action", required=True, parser_class=_Parser)
    parser = actions.add_parser(action[0], help=action[1])
    _spec_arguments(parser)
    return parser


def _no_preflight_argument(parser) -> None:
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the preflight checks of the model, dataset and rewards (for paths that are the worker's)",
    )


def _job_id_argument(parser, **kwargs) -> None:
    """The JOB_ID positional of the commands that read a job back."""
    parser.add_argument("job_id", help="a job's id, as grpoflow jobs lists it", **kwargs)


def _hidden_output_uri(parser) -> None:
    """`--output-uri` after the command too (`grpoflow --output-uri DIR CMD` is the documented form)."""
    parser.add_argument("--output-uri", dest="output_uri", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
