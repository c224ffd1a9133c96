"""What a flow checks of a deployment run before anything of its spec runs: the operator's policy
(`grpoflow.core.policy`), the run's own job variables, and its team.

A run's job variables could switch a worker's settings (`env`) or its command; grpoflow's work-pool templates expose
neither, and a run that sets any job variable the policy's `run_job_variables` does not list ends `Rejected` here
(`gpu_count` equal to the spec's is what `grpoflow submit` sets, and always allowed). A run's team is its deployment's
`team` parameter, set by the operator in prefect.yaml: a run that names another team than its deployment's is refused,
so no one reaches another team's folders by editing a parameter. A team's jobs live under `<output_uri>/<team>/`.
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_client
from prefect.runtime import flow_run

from grpoflow.core.policy import PolicyError, load_policy
from grpoflow.core.spec import JobSpec
from grpoflow.core.trust import deployment_problems, from_command_line
from grpoflow.core.uris import file_path
from grpoflow.integrations.storage import is_remote, join
from grpoflow.jobs.registry import owner_problem
from grpoflow.trainers.graders.python import sandbox_refusals


def admission_problems(spec: JobSpec, team: str | None = None) -> list[str]:
    """Everything that refuses this flow run's `spec` (empty for the user's own command line), in one pass."""
    if from_command_line():
        return []
    problems = deployment_problems(spec, team=team) + sandbox_refusals(spec)
    run = _this_run()
    if run is not None:
        problems += job_variable_problems(run.job_variables or {}, spec) + _team_problems(run, team)
    if spec.deploy and not is_remote(spec.output_uri):
        problem = owner_problem(Path(file_path(team_output_uri(spec.output_uri, team))), spec.deploy.name, spec.name)
        problems += [problem] if problem else []
    return problems


def job_variable_problems(job_variables: dict, spec: JobSpec) -> list[str]:
    """The run's own job variables the policy does not let a single run set."""
    try:
        allowed = load_policy().policy.run_job_variables
    except PolicyError as e:
        return [str(e)]
    return [
        f"job variable {name!r}: this run sets it, and the policy lets a run set only "
        f"{', '.join(allowed) or 'none'} (`run_job_variables` in the policy; the deployment's own are the operator's)"
        for name, value in job_variables.items()
        if name not in allowed and not (name == "gpu_count" and value == spec.gpu_count)
    ]


def team_output_uri(output_uri: str, team: str | None) -> str:
    """Where a team's jobs live: `<output_uri>/<team>`, or `output_uri` for a run of no team."""
    return join(output_uri, team) if team else output_uri


def team_spec(spec: JobSpec, team: str | None) -> JobSpec:
    """`spec` with its output_uri under the team's folder."""
    return spec.model_copy(update={"output_uri": team_output_uri(spec.output_uri, team)}) if team else spec


def _this_run():
    """The deployment's run this flow runs in (the root of a subflow's), as the server holds it; None for a flow
    called in-process."""
    run_id = flow_run.root_flow_run_id or flow_run.id
    if run_id is None:
        return None
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    return run if run.deployment_id is not None else None


def _team_problems(run, team: str | None) -> list[str]:
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(run.deployment_id)
    own = (deployment.parameters or {}).get("team")
    if team == own:
        return []
    return [f"team: this run names {team!r}, its deployment {deployment.name!r} is team {own!r}; a run keeps its "
            "deployment's team"]  # fmt: skip
