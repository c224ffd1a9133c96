"""`grpoflow`: validate a job spec, run the pipeline, and read jobs, metrics and models back.

    grpoflow validate examples/smoke-test.yaml --set hyperparameters.max_steps=5
    grpoflow run examples/arithmetic.yaml --json
    grpoflow demo
    grpoflow jobs
    grpoflow metrics JOB_ID --keys reward,reward_std --json
    grpoflow model JOB_ID --json
    grpoflow rollouts JOB_ID --last --worst 5
    grpoflow compare JOB_ID JOB_ID --json
    grpoflow webhooks retry JOB_ID
    grpoflow sweep examples/arithmetic.yaml --grid trl.loss_type=grpo,dr_grpo --max-concurrent 1
    grpoflow graders run examples/openai-rft/job.yaml --rows 20
    grpoflow policy check spec.yaml
    grpoflow k8s render deployments/k8s-spec.yaml --image registry/grpoflow:1 \\
        --set distributed.num_machines=2 --set distributed.shared_volume=grpoflow-rwx

One module a command group: `run` (validate, canary, run, demo, init), `jobs` (jobs, metrics, model, rollouts,
compare, webhooks), `server` (deployments apply, submit, sweep), `models` (publish, serving, serve, and the old
spellings deploy and deployments list), `tools` (graders, k8s), `policy`; `common` holds what they share and `main`
the parser and the exit codes. Each command imports inside itself what only it uses (Prefect, the spec's models and
through them torch, the job folders):
`grpoflow --help` and every other command load none of it.

Exit codes, one meaning each (`grpoflow.flows.errors`: `MEANINGS` and every command's own words, its `--help`): 0
done, 1 what the command ran failed, 2 bad input (a spec, dataset or argument to fix, a training setup problem, an
unknown job id, a job another run holds), 4 a run the health monitor stopped (diverged).
"""

from grpoflow.flows.cli.common import EXAMPLES
from grpoflow.flows.cli.main import build_parser, entry, main
from grpoflow.flows.errors import UsageError

__all__ = ["EXAMPLES", "UsageError", "build_parser", "entry", "main"]
