"""The job spec's pydantic models: a grpoflow job, its sections and its GRPO hyperparameters, with their field types.

Each field's `description` is the one written copy of what it means and its rule: the Prefect form shows it, and the
docs' spec reference page is generated from it (`python -m grpoflow.core.spec`). `JobSpec` runs the cross-field
rules (`core/spec/rules.py`) once its fields are valid, then fills the defaults that depend on other fields.
"""

import importlib.util
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from grpoflow.core.catalog import BUILTIN_REWARDS, GRADER_TYPES
from grpoflow.core.spec.fields import (
    REFUSED_IN_FORM,
    EnvName,
    FunctionRef,
    Int,
    K8sName,
    OptionalUrl,
    RepoId,
    Section,
    Slug,
    Url,
    not_link_local,
)
from grpoflow.core.spec.gate import GateSpec
from grpoflow.core.spec.hyperparameters import Hyperparameters
from grpoflow.core.spec.rules import (
    function_name,
    metric_by_name,
    model_name,
    rule_problems,
)
from grpoflow.core.spec.suites import SuiteSpec
from grpoflow.core.spec.trl_fields import trl_fields
from grpoflow.core.uris import (
    OBJECT_STORES,
    file_path,
    outside_stores,
    unopenable,
    url_credentials,
)


class DatasetSpec(Section):
    """Where the prompts come from."""

    uri: Url = Field(
        # Without angle brackets: the V1 UI reads them as HTML and shows nothing between them.
        min_length=1,
        description="Local path (a data file, or a folder written by datasets' save_to_disk), file://, s3://..., or "
        "hf://datasets/OWNER/NAME, optionally /SPLIT.",
    )
    prompt_column: str = Field("prompt", description="Column holding a string prompt or a list of chat messages.")
    split: str | None = Field(
        None, description="Dataset split, for hf:// URIs and save_to_disk folders of a DatasetDict (default train)."
    )
    max_row_bytes: Int = Field(
        1_000_000,
        ge=1,
        description="Longest line a JSON Lines or CSV file may have, in bytes; a longer one rejects the dataset "
        "(found by streaming the file, before any of it is parsed).",
    )


# A reward entry with no function, model or grader is a built-in: its name must be one, which the deployments'
# parameter schema checks too, so that Prefect's server refuses a typo'd name when the run is created (it validates a
# run's parameters against the schema, `enforce_parameter_schema`) instead of a run that waits its turn and fails. No
# "required" in it: the server drops every "required" of the schema before it validates.
BUILT_IN_ENTRY = {
    "if": {"properties": {key: {"type": "null"} for key in ("function", "model", "grader")}},
    "then": {"properties": {"name": {"enum": sorted(BUILTIN_REWARDS)}}},
}


class RewardSpec(Section):
    """One reward; the spec's rewards are summed with their weights."""

    # The Prefect form's label (the metric's choice shows it), and the built-in names refused at run creation.
    model_config = ConfigDict(title="Reward entry", json_schema_extra=BUILT_IN_ENTRY)

    name: str | None = Field(
        None,
        min_length=1,
        description="A built-in reward's name; with function or model, the reward's label (default: the function's "
        "name, or the last part of the model's path). Each reward logs rewards/NAME/mean.",
        # The form offers the built-ins, and still takes any label for a custom function.
        json_schema_extra={
            "anyOf": [
                {"title": "Built-in reward", "type": "string", "enum": sorted(BUILTIN_REWARDS)},
                {"title": "Label of a custom function", "type": "string", "minLength": 1},
                {"type": "null"},
            ]
        },
    )
    function: FunctionRef | None = Field(None, description="A custom reward, as 'package.module:callable'.")
    model: OptionalUrl = Field(
        None,
        min_length=1,
        description="A sequence-classification reward model (TRL's model-id reward): a local folder or a Hub id "
        "already in the local Hugging Face cache, whose config.json architecture is ...ForSequenceClassification. "
        "Its score (logits[:, 0]) of prompt + completion is the reward; not with function or kwargs.",
    )
    grader: dict[str, Any] | None = Field(
        None,
        description="An OpenAI grader object, as OpenAI's fine-tuning API takes it (type: "
        f"{', '.join(GRADER_TYPES[:-1])} or {GRADER_TYPES[-1]}; templates {{{{ item.COLUMN }}}} and "
        "{{ sample.output_text }}); its name is the reward's name. Not with function or model.",
    )
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    kwargs: dict[str, Any] = Field(
        {},
        description="Arguments for parameterised rewards. llm_judge takes base_url, model, rubric (a template with "
        "{completion}, {prompt} and dataset columns), api_key_env (the NAME of the variable holding the key), "
        "score_regex, max_score, concurrency, timeout, retries, temperature, max_tokens (backoff: accepted, "
        "ignored). A model grader (and cosine) takes base_url, api_key_env, model (or embedding_model), "
        "concurrency, timeout, retries; a python grader timeout and memory_mb.",
    )

    @model_validator(mode="after")
    def _name_from_function(self) -> "RewardSpec":
        # Giving neither name nor function is a rule violation (rules.py), reported with the spec's other problems.
        if self.name is None and isinstance(self.grader, dict) and isinstance(self.grader.get("name"), str):
            self.name = self.grader["name"]
        elif self.name is None and self.function is not None:
            self.name = function_name(self.function)
        elif self.name is None and self.model is not None:
            self.name = model_name(self.model)
        return self


class SFTSpec(Section):
    """The optional supervised format warm-up before GRPO."""

    enabled: bool = Field(False, description="Run the SFT warm-up.")
    completion_column: str = Field(
        "completion",
        description="Column holding the target completions: text, or with tools/environment the rollout after the "
        "prompt as messages (assistant turns with tool_calls, the tool answers between them, a final answer).",
    )
    max_steps: Int = Field(200, ge=1, description="SFT training steps.")
    learning_rate: float = Field(
        2e-5, gt=0, description="SFT learning rate (TRL's default; a tiny model from scratch wants far more, ~3e-3)."
    )
    batch_size: Int = Field(8, ge=1, description="SFT per-device batch size.")


class BudgetSpec(Section):
    """What a job may spend."""

    max_training_hours: float | None = Field(
        None,
        gt=0,
        description="Wall-clock cap on GRPO training (resumed attempts add up). At the cap training stops at a "
        "checkpoint; the merge, evaluation and report run on that model, and the job says the budget ended it. "
        "Null: no cap.",
    )


class CanarySpec(Section):
    """One GRPO step at full length on the job's own devices before training: does it fit, how long will it take."""

    enabled: Literal["auto"] | bool = Field(
        "auto",
        description="auto: run the canary stage when the job asks for a GPU (gpu_count >= 1 on a machine with CUDA) "
        "or several machines; true: always (CPU included); false: never.",
    )
    device_memory_gb: float | None = Field(
        None,
        gt=0,
        description="The memory the job's step must fit in, in GB. Null: the device's own (CUDA: the smallest visible "
        "GPU's total memory; CPU: the memory available now).",
    )


class RolloutsSpec(Section):
    """The rollouts kept in the job folder (rollouts/step-NNNNNN.parquet): each completion of a kept GRPO step with
    its prompt, every reward's score, the advantage, its length and whether it was cut."""

    every: Int = Field(1, ge=0, description="Keep the rollouts of every Nth GRPO step (1: every step); 0 keeps none.")
    groups_per_step: Int | None = Field(
        None,
        ge=1,
        description="Groups (prompts) kept of each kept step: the first N; null keeps every group of the step.",
    )


class HealthSpec(Section):
    """The health monitor's thresholds that a job may tune (the others are fixed: grpoflow.trainers.health)."""

    no_signal_window: Int = Field(
        20,
        ge=2,
        description="Steps over which the 'no learning signal' alert is judged: it fires when over this many steps "
        "nearly every group scored all its completions alike, or the rewards scored none of them.",
    )
    no_signal_fraction: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Share of groups with zero reward variance (TRL's frac_reward_zero_std) over no_signal_window "
        "steps at which GRPO is called to have no learning signal (its advantages, hence gradients, are 0).",
    )
    reward_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Seconds one reward call may take during training; a call that takes longer stops the run "
        "with a message naming the reward and the step, like a reward that raises (neither is retried).",
    )
    stall_factor: float = Field(
        10.0,
        gt=1,
        description="Stall watchdog: no new training step for this many times the median step time (at least "
        "stall_min_seconds) raises a 'stall' alert; twice as long stops the run. Armed from the first step.",
    )
    stall_min_seconds: float = Field(
        120.0,
        gt=0,
        description="The least wait for a new step before the stall watchdog alerts (it stops at twice the wait), "
        "so a slow step or a checkpoint save on a fast run does not trip it.",
    )
    held_out_min_drop: float = Field(
        0.1,
        ge=0,
        description="The 'held-out divergence' alert (with evaluation.every) fires when the held-out score falls "
        "at two evaluations in a row, by this much in all (in the metric's units: 0.1 is 10 points of a 0-1 metric, "
        "4 of 40 prompts), while the training reward rises; smaller falls are within the noise of a few dozen "
        "held-out prompts.",
    )


def _metric_form(schema: dict) -> None:
    """`evaluation.metric` in the JSON schema (the Prefect form): one flat choice of a reward's name, an entry of its
    own, or nothing, as `RewardSpec.name` offers its choices (the discriminated union would nest a oneOf)."""
    branches = next((b["oneOf"] for b in schema.get("anyOf", []) if "oneOf" in b), None)
    if branches:
        name, entry = branches
        schema["anyOf"] = [
            {**name, "title": "A job reward, by name"},
            {**entry, "title": "A metric of its own (never trained on)"},
            {"type": "null"},
        ]


def _metric_kind(value: Any) -> str:
    return METRIC_ENTRY if isinstance(value, dict | RewardSpec) else METRIC_NAME


# `evaluation.metric` is a job reward's name or a reward entry of its own: which, the value's type decides (so an entry
# with a bad key is reported once, as an entry). The tags are left out of error locations (core/spec/loading.py).
METRIC_NAME, METRIC_ENTRY = "reward-name", "reward-entry"
HeldOutMetric = Annotated[
    Annotated[str, Tag(METRIC_NAME)] | Annotated[RewardSpec, Tag(METRIC_ENTRY)], Discriminator(_metric_kind)
]


class EvaluationSpec(Section):
    """The held-out before/after evaluation."""

    holdout: float = Field(
        0.1,
        ge=0,
        description="Prompts held out of training: a fraction in (0, 1), a count if >= 1; 0 disables (the default "
        "with evaluation.dataset).",
    )
    dataset: DatasetSpec | None = Field(
        None,
        description="A separate validation set scored instead of prompts held out of the training set (holdout then "
        "0 or unset); the same form and sources as the top-level dataset. Ingested beside it as the held-out split, "
        "checked the same way: its prompt column must hold prompts of the training set's format (text or chat), "
        "renamed to dataset.prompt_column, and it must have the columns evaluation.metric reads.",
    )
    metric: HeldOutMetric | None = Field(
        None,
        description="What scores the held-out completions: a job reward by name, or one entry in the rewards' form "
        "(name | function | model, with kwargs) scored on the held-out prompts only and never trained on, so that "
        "a reward that can be gamed is checked by one that cannot; or the environment's class name (its get_reward() "
        "after each held-out rollout); default: the first reward.",
        json_schema_extra=_metric_form,
    )
    every: Int = Field(
        0,
        ge=0,
        description="GRPO steps between held-out evaluations during training (greedy, in the training process, "
        "logged as eval/METRIC; the last step is always scored); 0 scores only before and after training.",
    )
    select: Literal["last", "best"] = Field(
        "last",
        description="The checkpoint merged, evaluated 'after', published and gated: the last step's, or the one "
        "with the best held-out score during training (needs every > 0; a checkpoint is saved at each evaluation), "
        "or the start model itself when no checkpoint beat it.",
    )
    max_new_tokens: Int | None = Field(None, ge=1, description="Generation length; default: max_response_length.")
    samples: Int = Field(
        1,
        ge=1,
        description="Completions per held-out prompt: 1, greedy; more, sampled (temperature 1, a fixed seed), each "
        "prompt's score their mean, with pass@1 and pass@samples (unbiased; a completion passes with a score of 1) "
        "in evaluation.json and the report.",
    )
    confidence: float | None = Field(
        0.95,
        gt=0,
        lt=1,
        description="Every held-out score and the gain (after minus before) get an interval of this confidence: a "
        "paired bootstrap over the held-out prompts (the same resampled prompts for both models, a fixed seed: the "
        "same scores give the same interval), in evaluation.json, the report, the run's message and the gate's "
        "verdict; null: no interval.",
    )
    suites: list[SuiteSpec] = Field(
        [],
        description="inspect-ai tasks run after the held-out evaluation on the model GRPO started from and on the "
        "kept model, each metric of both in suites.json and the report (greedy, up to max_new_tokens per answer).",
    )
    gate: GateSpec = Field(
        GateSpec(),
        description="Publish and deploy only when the GRPO result passes; by default one that beats its "
        "start model on the held-out metric does.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_holdout_with_dataset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("dataset") is not None and "holdout" not in data:
            return {**data, "holdout": 0}  # a validation set replaces the held-out split
        return data

    @field_validator("holdout")
    @classmethod
    def _whole_count(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("must be a fraction below 1 or a whole number of prompts")
        return value

    @field_serializer("holdout")
    def _count_as_int(self, value: float) -> int | float:
        return int(value) if value >= 1 else value  # a count reads as one (8, not 8.0) in spec.yaml and the report

    @field_validator("gate", mode="before")
    @classmethod
    def _no_gate(cls, value: Any) -> Any:
        return {"min_gain": None} if value is None else value  # `gate:` with nothing under it (or null): no gate

    @property
    def held_out(self) -> bool:
        """Whether there are held-out prompts to score: a holdout of the training set, or a validation set."""
        return self.holdout > 0 or self.dataset is not None

    @property
    def metric_name(self) -> str | None:
        """The held-out metric's name: `eval/<name>` in metrics.jsonl, `metric` in evaluation.json."""
        return self.metric.name if isinstance(self.metric, RewardSpec) else self.metric

    @model_validator(mode="after")
    def _gate_needs_held_out_prompts(self) -> "EvaluationSpec":
        if not self.held_out and self.gate.min_gain == GateSpec.model_fields["min_gain"].default:
            self.gate.min_gain = None  # the default gate has nothing to judge without held-out prompts: no gate
        if not self.held_out and (self.gate.min_gain is not None or self.gate.beat_deployed or self.gate.significant):
            raise ValueError(
                "evaluation.gate judges held-out scores: set evaluation.holdout above 0 (or give "
                "evaluation.dataset) or drop the gate"
            )
        if self.gate.significant and (self.gate.min_gain is None or self.confidence is None):
            raise ValueError(
                "evaluation.gate.significant judges the interval of the gain against min_gain: set "
                "evaluation.gate.min_gain and evaluation.confidence, or drop significant"
            )
        return self


class PublishSpec(Section):
    """Publishing the trained model to the Hugging Face Hub."""

    repo_id: RepoId = Field(description="Hub repository, 'owner/name'.")
    artifact: Literal["merged", "adapter"] = Field("merged", description="Push the merged weights or the adapter.")
    private: bool = Field(True, description="Create the repository as private.")


class DeploySpec(Section):
    """Registering the merged weights in the serving registry (`grpoflow serving list`)."""

    name: Slug = Field(description="The name to serve them under in the serving registry (a slug).")


class WebhookSpec(Section):
    """A webhook receiving the job's events (Standard Webhooks)."""

    # A str, not a `Url`: its own check below refuses credentials pointing to secret_env; the schema's part is Url's.
    url: str = Field(description="http(s) URL receiving the events.", json_schema_extra=REFUSED_IN_FORM)
    secret_env: EnvName | None = Field(
        None, description="Name of the environment variable holding the signing secret (never the secret itself)."
    )
    openai_events: bool | Literal["only"] = Field(
        False,
        description="Also send the job's end as OpenAI's fine-tuning webhook event (fine_tuning.job.succeeded, "
        "failed or cancelled), for a receiver written for OpenAI's webhooks; `only`: those events and no other.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL")
        if where := url_credentials(value):
            raise PydanticCustomError(
                "url_credentials",
                "holds credentials ({where}): credentials in the URL would be stored in spec.yaml and Prefect's "
                "database; put the secret in secret_env (the receiver verifies the signature)",
                {"where": where},
            )
        not_link_local(value, "a webhook receiver")
        return value


# The package a tracker of transformers' needs where it is not the tracker's name (kubeflow: none, an environment
# variable), and how to install one where `pip install <package>` is not the way.
TRACKER_PACKAGES = {"azure_ml": "azureml", "flyte": "flytekit", "kubeflow": None}
TRACKER_INSTALL = {"tensorboard": "pip install 'grpoflow[tracking]'", "azure_ml": "pip install azureml-core"}


def _tracker(name: str) -> str:
    """A name transformers' `report_to` takes (its integrations, frozen in trl_fields.json: no import of it here)."""
    known = trl_fields()["report_to"]
    if name not in known:
        expected = ", ".join(map(repr, known[:-1])) + f" or {known[-1]!r}"
        raise PydanticCustomError("literal_error", "must be {expected}", {"expected": expected})
    return name


Tracker = Annotated[str, AfterValidator(_tracker), Field(json_schema_extra={"enum": trl_fields()["report_to"]})]


class TrackingSpec(Section):
    """Experiment tracking of the GRPO run, through TRL's own integrations (transformers' `report_to`)."""

    report_to: list[Tracker] = Field(
        [],
        description="Trackers that receive the run's metrics, by transformers' names for them: tensorboard (offline, "
        "no account: event files in the job folder's tracking/), trackio (local, ~/.cache/huggingface/trackio), "
        "wandb, mlflow, comet_ml, clearml, ... Credentials come from each tracker's own environment variables "
        "(WANDB_API_KEY, MLFLOW_TRACKING_URI, ...), never from the spec.",
    )
    project: str = Field(
        "grpoflow", min_length=1, description="Project the runs are grouped under (trackio, wandb, mlflow)."
    )
    run_name: str | None = Field(None, description="The run's name in the trackers; default: the job id.")
    log_completions: bool = Field(
        False, description="Log a sample of prompts, completions and rewards every step (TRL's log_completions)."
    )
    num_completions_to_print: Int | None = Field(
        None, ge=1, description="How many completions log_completions prints per step; default: all of the step's."
    )

    @field_validator("report_to")
    @classmethod
    def _installed(cls, value: list[str]) -> list[str]:
        # A tracker missing on this machine would only fail once the model is loaded: say now what to install.
        packages = {name: TRACKER_PACKAGES.get(name, name) for name in value}
        missing = [
            f"{name} ({TRACKER_INSTALL.get(name, f'pip install {package}')})"
            for name, package in packages.items()
            if package is not None and not importlib.util.find_spec(package)
        ]
        if missing:
            raise ValueError(f"not installed: {', '.join(missing)}")
        return list(dict.fromkeys(value))


class GenerationSpec(Section):
    """The rollout engine: how the completions of each step are generated."""

    engine: Literal["transformers", "paged", "vllm"] = Field(
        "transformers",
        description="transformers: the model's own generate (padded batches); paged: transformers' continuous "
        "batching with a paged KV cache (TRL's use_transformers_continuous_batching), for many or long completions on "
        "a GPU; vllm: TRL's vLLM integration (CUDA GPU and pip install 'grpoflow[vllm]').",
    )
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate",
        description="vllm only. colocate: vLLM shares each training GPU (gpu_memory_utilization of its memory); "
        "server: a separate `trl vllm-serve` process, at vllm_server_url or, when that is null, started by the "
        "training task on tensor_parallel_size GPUs set aside beyond the gpu_count training GPUs.",
    )
    vllm_server_url: OptionalUrl = Field(
        None,
        description="vllm server mode: the base URL of a running `trl vllm-serve` (e.g. http://10.0.0.5:8000); "
        "null: the training task starts one on this machine.",
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description="vllm only: the share of a GPU's memory vLLM takes for weights and KV cache (colocate: of each "
        "training GPU; a server started by grpoflow: of each of its GPUs).",
    )
    tensor_parallel_size: Int = Field(
        1,
        ge=1,
        description="vllm only: GPUs one vLLM engine spans. Colocate: must divide gpu_count; a server started by "
        "grpoflow uses this many extra GPUs.",
    )

    @field_validator("vllm_server_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("must be an http(s) URL such as http://host:8000")
            not_link_local(value, "a vLLM server")
        return value


class DistributedSpec(Section):
    """How training spreads over several GPUs (gpu_count > 1)."""

    strategy: Literal["ddp", "fsdp2", "zero2", "zero3"] = Field(
        "ddp",
        description="ddp: a full model copy per GPU; fsdp2: weights, gradients and optimizer state sharded over the "
        "GPUs (PyTorch FSDP2); zero2: gradients and optimizer state sharded (DeepSpeed ZeRO-2); zero3: everything "
        "sharded (DeepSpeed ZeRO-3). Each runs under accelerate launch with TRL's config; the saved model is the "
        "same full model (or adapter). fsdp2 and the zero strategies need gpu_count > 1; zero needs "
        "pip install 'grpoflow[deepspeed]' and CUDA.",
    )
    num_machines: Int = Field(
        1,
        ge=1,
        description="Machines the training stage spans, each with gpu_count GPUs (one process per GPU, "
        "num_machines * gpu_count in all). More than 1 runs the training stage as a Kubeflow Trainer TrainJob of "
        "that many nodes, created by the training task; it needs shared_volume and an s3:// output_uri.",
    )
    runtime: K8sName = Field(
        "torch-distributed",
        description="With num_machines > 1: the Kubeflow Trainer ClusterTrainingRuntime the TrainJob references (a "
        "torch runtime: it sets the rendezvous environment on every node).",
    )
    shared_volume: K8sName | None = Field(
        None,
        description="With num_machines > 1: the name of a ReadWriteMany PersistentVolumeClaim that the flow run's "
        "pod mounts at its staging folder (GRPOFLOW_STAGING_DIR); every node mounts the job's folder of it at the "
        "same path, so the nodes share the job folder and its checkpoints.",
    )


class JobSpec(Section):
    """A grpoflow job: dataset, base model and rewards in, a GRPO-fine-tuned model out."""

    name: Slug = Field(description="Job name (a slug); becomes part of the job id.")
    base_model: Url = Field(
        min_length=1,
        description="HF repo id, local model folder, a .gguf file (local, hf://owner/name[@rev]/file.gguf or "
        "s3://...; its weights dequantized once into a model folder; needs grpoflow[gguf]), or builtin:tiny (offline, "
        "shipped).",
    )
    dataset: DatasetSpec = Field(description="The prompt dataset.")
    rewards: list[RewardSpec] = Field(min_length=1, description="Rewards, summed with their weights.")
    sft: SFTSpec = Field(SFTSpec(), description="Optional SFT format warm-up before GRPO.")
    evaluation: EvaluationSpec = Field(EvaluationSpec(), description="Held-out before/after evaluation.")
    hyperparameters: Hyperparameters = Field(Hyperparameters(), description="GRPO hyperparameters.")
    gpu_count: Int = Field(1, ge=1, description="GPUs for training; more than one runs under accelerate launch.")
    checkpoint_every: Int | None = Field(
        None, ge=1, description="Steps between checkpoints; default: max_steps // 10."
    )
    output_uri: Url = Field(
        "runs", min_length=1, description="Local folder or s3://bucket/prefix; the job folder goes under it."
    )
    stop_on_alert: bool = Field(False, description="Stop training on a health alert.")
    health: HealthSpec = Field(HealthSpec(), description="Thresholds of the training health alerts.")
    budget: BudgetSpec = Field(BudgetSpec(), description="A cap on what the job may spend (training hours).")
    rollouts: RolloutsSpec = Field(
        RolloutsSpec(), description="The completions kept in the job folder (rollouts/), with every reward's score."
    )
    canary: CanarySpec = Field(CanarySpec(), description="The canary: one step at full length before training.")
    publish: PublishSpec | None = Field(None, description="Optional: push the model to the Hugging Face Hub.")
    deploy: DeploySpec | None = Field(None, description="Optional: register the merged weights for serving.")
    webhooks: list[WebhookSpec] = Field([], description="Optional webhooks receiving the job's events.")
    tracking: TrackingSpec = Field(TrackingSpec(), description="Optional experiment tracking (TensorBoard, ...).")
    generation: GenerationSpec = Field(
        GenerationSpec(), description="The rollout engine: transformers (default), paged or vllm."
    )
    distributed: DistributedSpec = Field(
        DistributedSpec(), description="How training spreads over gpu_count GPUs: ddp (default), fsdp2, zero2, zero3."
    )
    tools: list[FunctionRef] = Field(
        [],
        description="Tools the model may call during its rollouts, each 'package.module:function': a typed function "
        "with a Google-style docstring (Args: a line per argument), whose JSON schema the model sees. A rollout runs "
        "turn after turn until an answer without a tool call, or trl.max_tool_calling_iterations tool turns. Needs "
        "chat prompts and a tool-calling chat template (Qwen2.5/Qwen3, Llama 3.1, ...; builtin:tiny gets its own).",
    )
    environment: FunctionRef | None = Field(
        None,
        description="An environment for multi-turn rollouts, 'package.module:Factory' (TRL's environment_factory): "
        "one instance per rollout, reset(**row) with its dataset row before it (returning None or text appended to "
        "the prompt); its public methods are more tools; an optional get_reward() scores the rollout beside the "
        "rewards (weight 1, logged as rewards/CLASS/mean).",
    )
    trl: dict[str, Any] = Field(
        {},
        description="Any other trl.GRPOConfig field, passed to TRL as given, e.g. {loss_type: dr_grpo, "
        "scale_rewards: none}; checked against the installed TRL's fields and types. The fields the spec sets "
        "(learning_rate, beta, num_generations, ...) are rejected, naming the spec key to use.",
    )

    @property
    def evaluation_reward(self) -> RewardSpec | None:
        """The reward that scores the held-out prompts: `evaluation.metric`'s own entry, or the job reward it names;
        None when it names the environment (its `get_reward()` scores the held-out rollouts)."""
        metric = self.evaluation.metric
        if isinstance(metric, RewardSpec):
            return metric
        if self.environment and metric == function_name(self.environment):
            return None
        return next(r for r in self.rewards if r.name == (metric or self.rewards[0].name))

    @property
    def processes(self) -> int:
        """The training processes of the whole run: gpu_count on each of distributed.num_machines machines."""
        return self.gpu_count * self.distributed.num_machines

    @field_validator("output_uri")
    @classmethod
    def _writable_scheme(cls, value: str) -> str:
        # Remote roots go through fsspec (integrations/storage.py): a scheme it cannot open would only fail after
        # training.
        if reason := outside_stores(value, OBJECT_STORES):
            raise ValueError(reason)
        if reason := unopenable(value):
            raise ValueError("cannot write to" + reason.removeprefix("cannot open"))
        return file_path(value)  # a file:// URL is the folder it names (Path would read it as `./file:/...`)

    @field_validator(
        "sft",
        "evaluation",
        "hyperparameters",
        "health",
        "webhooks",
        "trl",
        "generation",
        "distributed",
        "rollouts",
        mode="before",
    )
    @classmethod
    def _empty_section(cls, value: Any, info: ValidationInfo) -> Any:
        # A YAML key with nothing under it (`sft:`) is null; read it as "all defaults".
        return ([] if info.field_name == "webhooks" else {}) if value is None else value

    @model_validator(mode="before")
    @classmethod
    def _metric_naming_a_job_reward(cls, data: Any) -> Any:
        return metric_by_name(data)

    @model_validator(mode="after")
    def _rules_then_defaults(self) -> "JobSpec":
        problems = rule_problems(self.model_dump(exclude_unset=True), type(self))
        if problems:
            raise PydanticCustomError(
                "spec_rules", "{summary}", {"summary": "; ".join(problems), "problems": problems}
            )
        # Resolve the defaults that depend on other fields, so consumers and the saved spec see concrete values.
        hp = self.hyperparameters
        if hp.lora_rank is not None and hp.lora_alpha is None:
            hp.lora_alpha = hp.lora_rank
        if self.checkpoint_every is None and self.evaluation.select == "best":
            self.checkpoint_every = self.evaluation.every  # a checkpoint at every held-out score, to pick from
        if self.checkpoint_every is None:
            self.checkpoint_every = max(1, hp.max_steps // 10)
        if self.evaluation.metric is None:
            self.evaluation.metric = self.rewards[0].name
        if self.evaluation.max_new_tokens is None:
            self.evaluation.max_new_tokens = hp.max_response_length
        return self
