"""`grpoflow publish`, `serving` and `serve`: a job's model pushed to the Hub, registered in the serving registry and
served. The old spellings (`deploy`, `deploy --rollback`, `deployments list`) keep working and name the new ones.

grpoflow serving register JOB_ID --name arithmetic
grpoflow serving list
grpoflow serving rollback arithmetic
grpoflow serve arithmetic --port 8000
"""

import argparse
import json
import re
import sys
from pathlib import Path

from grpoflow.flows.cli.common import (
    _hidden_output_uri,
    _job_id_argument,
    _Parser,
    find_args_job,
    output_root,
    output_uri,
    roots_to_search,
)
from grpoflow.flows.errors import (
    EXIT_OK,
    Failed,
    UsageError,
)


def cmd_publish(args) -> int:
    from grpoflow.core.spec import PublishSpec
    from grpoflow.tasks.publish import publish_and_record

    job, _ = find_args_job(args, args.job_id)
    try:
        target = PublishSpec(repo_id=args.repo_id, artifact=args.artifact, private=not args.public)
    except ValueError as e:  # pydantic names the rule the repo id breaks
        raise UsageError(f"--repo-id {args.repo_id!r}: {e.errors()[0]['msg']}") from None
    result = publish_and_record(job, target)
    change = "new commit" if result["changed"] else "unchanged"
    print(json.dumps(result) if args.json else f"{result['url']} ({change})")
    return EXIT_OK


def cmd_serving_register(args) -> int:
    from grpoflow.core.spec import load_spec
    from grpoflow.integrations import webhooks
    from grpoflow.integrations.events import emit
    from grpoflow.jobs.registry import register
    from grpoflow.tasks.register import registered_payload

    job, _ = find_args_job(args, args.job_id)
    spec, _ = load_spec(job.spec)
    name = args.name or (spec.deploy.name if spec.deploy else spec.name)
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name):
        raise UsageError(f"--name {name!r}: use lowercase letters, digits, '-', '_' or '.', at most 63 characters")
    record = register(job, name)
    emit(job, "grpoflow.deployment.registered", registered_payload(record))  # the serving registry's event
    webhooks.flush()  # the deliveries run in a thread that ends with this process
    where = f"{record['artifact_path']} (version {record['version']})"
    print(json.dumps(record) if args.json else f"serving {name} {record['status']}: {where}")
    return EXIT_OK


def registry_roots(args) -> list[Path]:
    """The output roots whose serving registry (`deployments/`) to read: `--output-uri` alone when given, else `./runs`
    and the job index's local roots (`roots_to_search`), since `grpoflow serving register` registers a job beside its
    own folder."""
    from grpoflow.integrations.storage import is_remote

    if output_uri(args) is not None:
        return [output_root(args).resolve()]
    return [Path(root) for root in roots_to_search(args) if not is_remote(root)]


def serving_root(args, name: str) -> Path:
    """The one output root (`registry_roots`) whose serving registry holds `name`; a `UsageError` (exit 2, a name to
    fix as an unknown job id is) naming the roots looked in when none does, or those that do when several do."""
    from grpoflow.jobs.registry import registry_dir

    roots = registry_roots(args)
    holding = [root for root in roots if (registry_dir(root) / f"{name}.json").is_file()]
    if len(holding) > 1:
        where = ", ".join(map(str, holding))
        raise UsageError(f"serving name {name!r} is registered under {where}: pick one with --output-uri")
    if not holding:
        known = sorted({p.stem for root in roots for p in registry_dir(root).glob("*.json")})
        where = ", ".join(str(registry_dir(root)) for root in roots)
        raise UsageError(f"unknown serving name {name!r} under {where}; registered: {', '.join(known) or 'none'}")
    return holding[0]


def _version_line(version: dict, current: int | None) -> str:
    score = "not scored" if version.get("score") is None else f"{version.get('metric')} {version['score']:.3f}"
    mark = "*" if version["version"] == current else " "
    return f"{mark} v{version['version']:<3} {version['job_id']:<50} {score:<24} {version['status']:<11} " + (
        version.get("registered") or ""
    )


def cmd_serving_rollback(args) -> int:
    from grpoflow.jobs.registry import rollback

    restored, replaced = rollback(serving_root(args, args.name), args.name)
    if args.json:
        print(json.dumps({"name": args.name, "current": restored, "replaced": replaced}))
    else:
        print(f"serving {args.name} rolled back to version {restored['version']} (job {restored['job_id']}),")
        print(f"replacing version {replaced['version']} (job {replaced['job_id']})")
    return EXIT_OK


def cmd_serving_list(args, key: str = "serving") -> int:
    from grpoflow.jobs.registry import list_serving_records, registry_dir

    explicit, roots = output_uri(args) is not None, registry_roots(args)
    # Each record names its root when several were searched, as `grpoflow jobs` does.
    records = [
        {**r, **({} if explicit else {"root": str(root)})} for root in roots for r in list_serving_records(root)
    ]
    if args.json:
        print(json.dumps({key: records}))
        return EXIT_OK
    if not records:
        print(f"nothing registered for serving under {', '.join(str(registry_dir(root)) for root in roots)}")
    for record in records:
        where = f"  {record['root']}" if "root" in record else ""
        print(f"{record['name']}  (current: {'v' + str(record['current']) if record['current'] else 'none'}){where}")
        for version in record["versions"]:
            print("  " + _version_line(version, record["current"]))
    return EXIT_OK


# --- the old spellings, which users' scripts call: each works as before and says its new spelling on stderr


def _renamed(old: str, new: str) -> None:
    print(f"grpoflow: `grpoflow {old}` is now `grpoflow {new}` (the serving registry's commands)", file=sys.stderr)


def cmd_deploy(args) -> int:
    """`grpoflow deploy JOB_ID [--name N]` and `deploy --rollback NAME`: `serving register` and `serving rollback`."""
    if args.rollback:
        _renamed("deploy --rollback NAME", "serving rollback NAME")
        if args.job_id:
            raise UsageError("deploy: give a JOB_ID to register or --rollback NAME, not both")
        args.name = args.rollback
        return cmd_serving_rollback(args)
    _renamed("deploy JOB_ID", "serving register JOB_ID")
    if not args.job_id:
        raise UsageError("deploy: give the JOB_ID to register (or --rollback NAME)")
    return cmd_serving_register(args)


def cmd_deployments_list(args) -> int:
    """`grpoflow deployments list`: `serving list`, its JSON under `deployments` as before."""
    _renamed("deployments list", "serving list")
    return cmd_serving_list(args, key="deployments")


def cmd_serve(args) -> int:
    from grpoflow.jobs.registry import read_serving_record
    from grpoflow.trainers.model.serve import serve

    record = read_serving_record(serving_root(args, args.name), args.name)
    if record["status"] != "ready":
        raise Failed(f"serving name {args.name} is {record['status']}, not ready")
    serve(record["artifact_path"], args.name, args.host, args.port)
    return EXIT_OK


def _port(text: str) -> int:
    """argparse type of --port: a TCP port, 1 to 65535 (checked before any model is loaded)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return port


def _add_model_commands(sub) -> None:
    """`publish`, `serving` and `serve`: push a job's model to the Hub (jobs/publish.py), register its merged weights
    in the serving registry and serve them (jobs/registry.py); and `deploy`, the old spelling of `serving`."""
    serving = sub.add_parser("serving", help="the serving registry: names, each a job's merged weights, versioned")
    actions = serving.add_subparsers(dest="action", required=True, parser_class=_Parser)
    register = actions.add_parser("register", help="register a job's merged weights for serving under a name")
    _job_id_argument(register)
    register.add_argument("--name", help="the name to serve it under (default: the spec's deploy.name, else its name)")
    register.add_argument("--json", action="store_true", help="print the registered version's record as JSON")
    register.set_defaults(func=cmd_serving_register)
    listing = actions.add_parser("list", help="every name in the serving registry with its versions (* current)")
    listing.add_argument("--json", action="store_true", help='print {"serving": [...]}, a record a name')
    listing.set_defaults(func=cmd_serving_list)
    rollback = actions.add_parser("rollback", help="make a name's previous ready version current again")
    rollback.add_argument("name", help="a name in the serving registry (see grpoflow serving list)")
    rollback.add_argument("--json", action="store_true", help="print the restored and replaced versions as JSON")
    rollback.set_defaults(func=cmd_serving_rollback)
    deploy = sub.add_parser("deploy", help="old spelling of `serving register` and `serving rollback`")
    _job_id_argument(deploy, nargs="?")
    deploy.add_argument("--rollback", metavar="NAME", help="old spelling of `serving rollback NAME`")
    deploy.add_argument("--name", help="the name to serve it under (default: the spec's deploy.name, else its name)")
    deploy.add_argument("--json", action="store_true", help="print the registered version's record as JSON")
    deploy.set_defaults(func=cmd_deploy)
    publish = sub.add_parser("publish", help="push a job's merged weights or adapter to the Hugging Face Hub")
    _job_id_argument(publish)
    publish.add_argument("--repo-id", required=True, help="owner/name on the Hub")
    publish.add_argument(
        "--artifact", choices=["merged", "adapter"], default="merged", help="what to push (default: merged)"
    )
    publish.add_argument("--public", action="store_true", help="create the repo public (default: private)")
    publish.add_argument("--json", action="store_true", help="print the result (repo, URL, commit) as JSON")
    publish.set_defaults(func=cmd_publish)
    serve = sub.add_parser("serve", help="serve a name of the serving registry over an OpenAI-compatible HTTP API")
    serve.add_argument("name", help="a name in the serving registry (see grpoflow serving list)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=_port, default=8000, help="TCP port (default: 8000)")
    serve.set_defaults(func=cmd_serve)
    for p in (register, listing, rollback, deploy, publish, serve):
        _hidden_output_uri(p)
