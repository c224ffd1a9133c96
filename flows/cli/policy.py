"""`grpoflow policy show` and `grpoflow policy check SPEC`: the operator's policy in force, and what it refuses a spec
that a deployment run would be given (`grpoflow.core.policy`).

    grpoflow policy show [--json]
    grpoflow policy check examples/arithmetic.yaml [--team NAME]   # exit 0: allowed; 2: refused, one line a field
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from grpoflow.flows.errors import Rejected


def cmd_policy_show(args) -> int:
    from grpoflow.core.policy import VETTED_TRL_KEYS, load_policy
    from grpoflow.trainers.graders.sandbox import memory_cap

    loaded = load_policy(Path(args.project))
    shown = {"source": loaded.source, **loaded.policy.model_dump(), "sandbox_memory": memory_cap()}
    if args.json:
        print(json.dumps({**shown, "vetted_trl_keys": list(VETTED_TRL_KEYS)}, indent=2))
        return 0
    print(f"# the policy in force: {shown.pop('source')}")
    cap = shown.pop("sandbox_memory")
    print(yaml.safe_dump(shown, sort_keys=False), end="")
    print(f"# sandbox memory: {_cap_text(cap)}")
    return 0


def _cap_text(cap: dict) -> str:
    if cap.get("mode") == "cgroup":
        return f"{cap['total_mb']} MiB for each sandbox as a whole ({cap['why']})"
    return (
        f"{cap['per_process_mb']} MiB a process, up to {cap['total_mb']} MiB for a sandbox of many processes "
        f"({cap.get('why') or 'no writable cgroup v2 here'})"
    )


def cmd_policy_check(args) -> int:
    from grpoflow.core.policy import deployment_check
    from grpoflow.core.spec import load_spec
    from grpoflow.trainers.graders.python import sandbox_refusals

    spec, _ = load_spec(args.spec)
    problems = deployment_check(spec, Path(args.project), args.team) + sandbox_refusals(spec)
    if problems:
        raise Rejected("a deployment run of this spec would be refused:\n" + "\n".join(problems))
    print(f"{args.spec}: a deployment run of it is allowed by the policy")
    return 0


def add_policy_command(sub) -> None:
    policy = sub.add_parser("policy", help="the operator's policy for specs from deployments: show it, check a spec")
    actions = policy.add_subparsers(dest="action", required=True, metavar="{show,check}")
    show = actions.add_parser("show", help="the policy in force and where it came from")
    show.add_argument("--json", action="store_true", help="print JSON, with the vetted trl: keys")
    show.set_defaults(func=cmd_policy_show)
    check = actions.add_parser(
        "check", help="what a deployment run of SPEC would be refused (exit 2), one line a field"
    )
    check.add_argument("spec", help="a job spec file")
    check.add_argument("--team", help="check it as this team's run")
    check.set_defaults(func=cmd_policy_check)
    for parser in (show, check):
        parser.add_argument("--project", default=".", help="the project folder whose .grpoflow/policy.yaml applies")
