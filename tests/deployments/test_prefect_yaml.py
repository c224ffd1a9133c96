"""deployments/prefect.yaml (and the project `grpoflow init` writes) against the design, without a server: names,
pools, schedules, the trigger's parameter templates (rendered by the server's own code), and every parameter
against its flow's schema."""

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest
import yaml
from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
from prefect.flows import load_flow_from_entrypoint
from prefect.server.events.actions import RunDeployment
from prefect.server.events.schemas.automations import EventTrigger
from prefect.server.events.schemas.events import ReceivedEvent
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

from grpoflow.core.spec import load_spec
from grpoflow.flows.deployments import PREFECT_FILE, PROJECT_DIR, load_pools, run_parameters
from grpoflow.flows.project import TEMPLATE, init_project
from grpoflow.trainers.rewards.builtin import REWARDS
from tests.prefect_form import form_parameters


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(PREFECT_FILE.read_text())


@pytest.fixture(scope="module")
def deployments(config) -> dict[str, dict]:
    """`flow-name/deployment-name` -> the deployment's entry, with its flow object under "flow"."""
    found = {}
    for entry in config["deployments"]:
        flow = load_flow_from_entrypoint(entry["entrypoint"])  # a module path: found in any install of grpoflow
        found[f"{flow.name}/{entry['name']}"] = {**entry, "flow": flow}
    return found


def schema_of(deployment: dict) -> dict:
    return parameter_schema(deployment["flow"]).model_dump_for_openapi()


def test_design_deployments(deployments):
    assert set(deployments) == {
        "grpo-pipeline/retrain",
        "grpo-pipeline/nightly",
        "grpo-pipeline/on-new-data",
        "watch-new-data/watch",
        "watch-new-data/look",  # one look now, beside the hourly watcher (README: look outside the schedule)
        # the same on Kubernetes, in the image (tests/deployments/test_k8s.py renders their Jobs)
        "grpo-pipeline/retrain-k8s",
        "grpo-pipeline/nightly-k8s",
        "grpo-pipeline/on-new-data-k8s",
        "grpo-sweep/sweep",  # one retrain run per combination of a grid (flows/sweep.py)
        "grpo-pipeline/resume",  # a crashed run's job resumed from its last checkpoint (flows/resume.py)
    }
    assert all(d["enforce_parameter_schema"] for d in deployments.values())


def test_pools_and_queues_exist(deployments):
    queues = {(p["name"], q["name"]) for p in load_pools() for q in p.get("queues", [])}
    for deployment in deployments.values():
        assert (deployment["work_pool"]["name"], deployment["work_pool"]["work_queue_name"]) in queues


def test_retrain_form_is_the_job_spec(deployments):
    schema = schema_of(deployments["grpo-pipeline/retrain"])
    assert schema["properties"]["spec"]["$ref"] == "#/definitions/JobSpec" and schema["required"] == ["spec"]
    job_spec = schema["definitions"]["JobSpec"]
    assert job_spec["additionalProperties"] is False  # a misspelt key is refused by the server too
    hyperparameters = schema["definitions"]["Hyperparameters"]["properties"]
    assert hyperparameters["rollouts_per_prompt"]["minimum"] == 2 and hyperparameters["kl_coef"]["description"]


def test_schedules(deployments):
    [nightly] = deployments["grpo-pipeline/nightly"]["schedules"]
    cron = CronSchedule(cron=nightly["cron"], timezone=nightly["timezone"])
    assert cron.cron == "0 2 * * *" and cron.timezone == "UTC"
    [watch] = deployments["watch-new-data/watch"]["schedules"]
    assert IntervalSchedule(interval=watch["interval"]).interval.total_seconds() == 3600
    watcher = deployments["watch-new-data/watch"]
    # One hourly run at a time, by its queue's limit (deployments/work-pools/pools.yaml): a deployment's
    # concurrency_limit holds a lease that a restarted server forgets, and Prefect then crashes the running watcher.
    assert "concurrency_limit" not in watcher and watcher["work_pool"]["work_queue_name"] == "watch"
    # Each hourly run keeps looking for 55 minutes (24 runs a day in the list), its state in the project folder.
    params = watcher["parameters"]
    assert params["watch_minutes"] == 55 and params["state_dir"] == ".grpoflow/watch-state"
    # A look outside the schedule is a deployment of its own: another queue, not to wait behind the hourly run, the
    # same state (and so the same lock), no schedule.
    look = deployments["watch-new-data/look"]
    assert "concurrency_limit" not in look and "schedules" not in look
    assert look["work_pool"]["work_queue_name"] == "default"
    shared = {k: v for k, v in params.items() if k not in ("watch_minutes", "poll_seconds")}
    assert look["parameters"] == {**shared, "watch_minutes": 0}


def test_shipped_specs_are_valid(deployments, tmp_path):
    for name in ("grpo-pipeline/nightly", "grpo-pipeline/on-new-data", "grpo-pipeline/nightly-k8s"):
        params = deployments[name]["parameters"]
        load_spec(PROJECT_DIR / (params.get("spec") or params["default_spec"]))
    # The retrain form's default: a working example spec, its paths relative to the project root.
    retrain = deployments["grpo-pipeline/retrain"]["parameters"]["spec"]
    assert (PROJECT_DIR / retrain["dataset"]["uri"]).is_file()
    (tmp_path / "retrain.yaml").write_text(yaml.safe_dump(retrain))
    load_spec(tmp_path / "retrain.yaml")


def test_deployment_parameters_match_the_flows(deployments):
    for deployment in deployments.values():
        jsonschema.validate(deployment["parameters"], schema_of(deployment))


def test_ui_runs_get_gpu_count(deployments):
    for name in ("grpo-pipeline/retrain", "grpo-pipeline/nightly", "grpo-pipeline/on-new-data"):
        assert deployments[name]["work_pool"]["job_variables"] == {"gpu_count": 1}
    for name in ("grpo-pipeline/retrain-k8s", "grpo-pipeline/nightly-k8s", "grpo-pipeline/on-new-data-k8s"):
        assert deployments[name]["work_pool"]["job_variables"] == {"gpu_count": 1, "image": "{{ build-image.image }}"}
    [k8s] = [p for p in load_pools() if p["type"] == "kubernetes"]
    assert "gpu_count" in k8s["base_job_template"]["variables"]["properties"]


def test_the_automation_is_named(deployments):
    [trigger] = deployments["grpo-pipeline/on-new-data"]["triggers"]
    model = DeploymentEventTrigger.model_validate({k: v for k, v in trigger.items() if k != "type"})
    assert model.name == "retrain-on-new-data" and "grpoflow.dataset.landed" in model.description


def test_the_form(deployments):
    schema = schema_of(deployments["grpo-pipeline/retrain"])
    name = schema["definitions"]["RewardSpec"]["properties"]["name"]
    [builtin] = [choice for choice in name["anyOf"] if "enum" in choice]
    assert set(builtin["enum"]) == set(REWARDS)
    assert {"type": "string", "minLength": 1} in [{k: v for k, v in c.items() if k != "title"} for c in name["anyOf"]]
    # No description names a file the user does not have, or a "<" the V1 UI would read as HTML.
    descriptions = re.findall(r'"description": "((?:[^"\\]|\\.)*)"', json.dumps(schema))
    assert descriptions and not [d for d in descriptions if re.search(r"<|DESIGN|shared/|\.py\b", d)]
    text = PREFECT_FILE.read_text()
    assert "DESIGN" not in text and "shared/" not in text


def prefect_file_of(which: str, tmp_path) -> Path:
    """The checkout's deployments/prefect.yaml, or the one `grpoflow init` writes into a new project."""
    if which == "checkout":
        return PREFECT_FILE
    init_project(tmp_path / "proj")
    return tmp_path / "proj" / "prefect.yaml"


@pytest.mark.parametrize("which", ["checkout", "init"])
def test_the_form_as_it_opens_is_accepted(which, tmp_path):
    """The Prefect UI's launch form fills in every default of the schema, at every depth, under the deployment's
    parameters; submitted unchanged, every deployment's form passes its flow's parameter validation (a field whose
    mere presence the spec rejects, such as max_prompt_length without use_unsloth, must have no default there)."""
    for entry in yaml.safe_load(prefect_file_of(which, tmp_path).read_text())["deployments"]:
        flow = load_flow_from_entrypoint(entry["entrypoint"])
        schema = parameter_schema(flow).model_dump_for_openapi()
        sent = form_parameters(schema, entry.get("parameters", {}))
        jsonschema.validate(sent, schema)
        validated = flow.validate_parameters(sent)
        if "spec" in schema["properties"] and "JobSpec" in json.dumps(schema["properties"]["spec"]):
            assert validated["spec"].hyperparameters.max_prompt_length == 1024, entry["name"]  # the spec's default
            assert (
                sent["spec"]["hyperparameters"]["max_steps"]
                == entry["parameters"]["spec"]["hyperparameters"]["max_steps"]
            )
            assert "max_prompt_length" not in sent["spec"]["hyperparameters"]


def test_init_writes_the_same_deployments(config, tmp_path):
    """The project `grpoflow init` writes has the same deployments, schedules, triggers and pools, on its own files:
    only the paths, the spec files and the inline specs differ."""
    ours = yaml.safe_load(prefect_file_of("init", tmp_path).read_text())
    assert {k: v for k, v in ours.items() if k not in ("name", "deployments")} == {
        k: v for k, v in config.items() if k not in ("name", "deployments")
    }
    strip = lambda d: {k: v for k, v in d.items() if k not in ("parameters", "description")}
    assert [strip(d) for d in ours["deployments"]] == [strip(d) for d in config["deployments"]]
    project_spec = yaml.safe_load((tmp_path / "proj" / "spec.yaml").read_text())
    for theirs, mine in zip(config["deployments"], ours["deployments"], strict=True):
        params, own = theirs.get("parameters", {}), mine.get("parameters", {})
        assert own.keys() == params.keys(), theirs["name"]
        for key, value in params.items():
            if isinstance(value, dict) and key == "spec":  # the form's default: the project's spec, same output
                assert own[key] == {**project_spec, "output_uri": value["output_uri"]}, theirs["name"]
            elif isinstance(value, str) and value.endswith(".yaml"):  # a spec file: the project's own
                assert (tmp_path / "proj" / own[key]).is_file(), (theirs["name"], own[key])
            else:
                assert own[key] == value, (theirs["name"], key)
    for path in (PREFECT_FILE.parent / "work-pools").iterdir():
        assert (TEMPLATE / "work-pools" / path.name).resolve() == path.resolve(), path.name  # linked, not copied


def test_server_accepts_what_submit_sends(deployments):
    """`grpoflow submit` sends the resolved spec; the server checks it with the schema (enforce_parameter_schema)."""
    schema = schema_of(deployments["grpo-pipeline/retrain"])
    parameters = run_parameters(load_spec(PROJECT_DIR / "examples" / "arithmetic.yaml")[0])
    jsonschema.validate(parameters, schema)
    parameters["spec"]["hyperparameters"]["rollout_per_prompt"] = 8  # misspelt
    with pytest.raises(jsonschema.ValidationError, match="rollout_per_prompt"):
        jsonschema.validate(parameters, schema)


def landed(payload: dict) -> ReceivedEvent:
    return ReceivedEvent(
        occurred=datetime.now(UTC),
        event="grpoflow.dataset.landed",
        resource={"prefect.resource.id": f"grpoflow.dataset.{payload['uri']}"},
        payload=payload,
        id=uuid.uuid4(),
    )


@pytest.mark.parametrize(
    "payload, expected",
    [
        # the watcher's payload, with the spec its deployment passes on
        (
            {"uri": "s3://data/in/a.jsonl", "size": 10, "etag": "e1", "spec": "s3://specs/big.yaml"},
            {"dataset_uri": "s3://data/in/a.jsonl", "spec": "s3://specs/big.yaml"},
        ),
        # no spec in the payload: None, so the deployment's default_spec is used
        ({"uri": "/data/in/b.jsonl"}, {"dataset_uri": "/data/in/b.jsonl", "spec": None}),
    ],
)
def test_trigger_parameters(deployments, payload, expected):
    deployment = deployments["grpo-pipeline/on-new-data"]
    [trigger] = deployment["triggers"]
    model = DeploymentEventTrigger.model_validate({k: v for k, v in trigger.items() if k != "type"})
    assert EventTrigger.model_validate(model.model_dump(exclude={"parameters", "job_variables"})).covers(
        landed(payload)
    )

    # What the server's run-deployment action does with the trigger's parameters when the event arrives.
    parameters = dict(trigger["parameters"])
    RunDeployment._upgrade_v1_templates(parameters)
    context = HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"event": landed(payload)})
    rendered = hydrate(parameters, context)
    assert rendered == expected
    jsonschema.validate({**deployment["parameters"], **rendered}, schema_of(deployment))


def crashed(flow_name: str) -> ReceivedEvent:
    """The event Prefect's server emits when a run of `flow_name` ends Crashed (its related resources as it sets
    them: the flow, by name, among them)."""
    run_id, flow_id = uuid.uuid4(), uuid.uuid4()
    return ReceivedEvent(
        occurred=datetime.now(UTC),
        event="prefect.flow-run.Crashed",
        resource={"prefect.resource.id": f"prefect.flow-run.{run_id}", "prefect.resource.name": "a-run"},
        related=[
            {
                "prefect.resource.id": f"prefect.flow.{flow_id}",
                "prefect.resource.role": "flow",
                "prefect.resource.name": flow_name,
            },
            {"prefect.resource.id": "prefect.tag.grpoflow", "prefect.resource.role": "tag"},
        ],  # fmt: skip
        id=uuid.uuid4(),
    )


def test_crashed_pipeline_runs_start_the_resume(deployments):
    """grpo-pipeline/resume's trigger covers a crashed grpo-pipeline run, not another flow's, and passes the run on."""
    deployment = deployments["grpo-pipeline/resume"]
    [trigger] = deployment["triggers"]
    model = DeploymentEventTrigger.model_validate({k: v for k, v in trigger.items() if k != "type"})
    covering = EventTrigger.model_validate(model.model_dump(exclude={"parameters", "job_variables"}))
    event = crashed("grpo-pipeline")
    assert covering.covers(event) and not covering.covers(crashed("grpo-sweep"))
    parameters = dict(trigger["parameters"])
    RunDeployment._upgrade_v1_templates(parameters)
    context = HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"event": event})
    rendered = hydrate(parameters, context)
    assert rendered == {"flow_run": event.resource.id}
    jsonschema.validate(rendered, schema_of(deployment))


def test_the_sweep_form(deployments):
    """The sweep's form: the job spec, the grid and the limits, each with its description; its default grid is a
    valid sweep of its default spec, run on the retrain deployment."""
    from grpoflow.flows.sweep import grid_overrides

    sweep = deployments["grpo-sweep/sweep"]
    properties = schema_of(sweep)["properties"]
    assert {"spec", "grid", "max_concurrent", "deployment"} <= properties.keys()
    for name in ("spec", "grid", "max_concurrent", "deployment"):
        assert properties[name].get("description"), name
    parameters = sweep["parameters"]
    assert len(grid_overrides(parameters["spec"], parameters["grid"])) == 2
    assert f"grpo-pipeline/{parameters['deployment']}" in deployments
    # It waits for its jobs off the training queue, which runs one job at a time: never a deadlock with its own jobs.
    assert (
        sweep["work_pool"]["work_queue_name"] != deployments["grpo-pipeline/retrain"]["work_pool"]["work_queue_name"]
    )
