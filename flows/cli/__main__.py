"""`python -m grpoflow.flows.cli`: the `grpoflow` command."""

from grpoflow.flows.cli.main import entry

entry()
