"""`grpoflow graders run` and `grpoflow k8s render`: a spec's graders tried on its dataset, its Kubernetes manifests.

grpoflow graders run examples/openai-rft/job.yaml --rows 20
grpoflow k8s render deployments/k8s-spec.yaml --image registry/grpoflow:1
"""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import yaml

from grpoflow.flows.cli.common import _hidden_output_uri, _positive, _spec_subcommand, load
from grpoflow.flows.errors import (
    EXIT_OK,
    UsageError,
)


def cmd_graders_run(args) -> int:
    from grpoflow.integrations.storage import storage_options
    from grpoflow.trainers.graders.run import score_completions, table

    spec = load(args)
    completions = Path(args.completions) if args.completions else None
    scores = score_completions(spec, completions, args.rows, storage_options(spec.dataset.uri))
    print(json.dumps(scores.as_json()) if args.json else table(scores))
    return EXIT_OK


def _add_graders_command(sub) -> None:
    """`graders run`: a spec's rewards on given completions, as training scores them (trainers/graders/run.py)."""
    run = _spec_subcommand(
        sub,
        ("graders", "score completions with a spec's rewards (OpenAI graders included)"),
        ("run", "score completions against the dataset's rows with every reward of the spec, as training would"),
    )
    run.add_argument(
        "--completions",
        metavar="FILE.jsonl",
        help='lines of {"row": i, "completion": ...}, i a 0-based dataset row (default: the dataset\'s completion '
        "column)",
    )
    run.add_argument("--rows", type=_positive, metavar="N", help="score only the first N completions")
    run.add_argument("--json", action="store_true", help='print {"scores": [{"row", "rewards", "total"}]}')
    _hidden_output_uri(run)
    run.set_defaults(func=cmd_graders_run)


def cmd_k8s_render(args) -> int:
    import secrets

    from grpoflow.cluster.kube import IMAGE_ENV
    from grpoflow.cluster.trainjob import rendered
    from grpoflow.core.spec import SpecError

    spec = load(args)
    if spec.distributed.num_machines < 2:
        raise SpecError(
            "distributed.num_machines: 1 trains in the flow run's own process and creates no Kubernetes object; "
            "render is for several machines (set distributed.num_machines >= 2)"
        )
    image = args.image or os.environ.get(IMAGE_ENV)
    if not image:
        raise UsageError(f"k8s render: give the training image with --image or {IMAGE_ENV}")
    job_id = f"{spec.name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"  # as the next run's would be
    print(yaml.safe_dump_all(rendered(spec, image, job_id), sort_keys=False), end="")
    return EXIT_OK


def _add_k8s_command(sub) -> None:
    """`k8s render`: the Kubernetes objects of a several-machine job, without a cluster (cluster/trainjob.py)."""
    render = _spec_subcommand(
        sub,
        ("k8s", "the Kubernetes objects of a several-machine job"),
        ("render", "print, as YAML documents, every Kubernetes object a several-machine job would create"),
    )
    render.add_argument("--image", help="the training image (default: GRPOFLOW_IMAGE)")
    _hidden_output_uri(render)
    render.set_defaults(func=cmd_k8s_render)
