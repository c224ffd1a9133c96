"""The operator's policy: what a spec that comes from a deployment run (the Prefect UI's form, `grpoflow submit`, an
event, a watcher, the jobs API) may do. Everything that names code, a file, a URL or host, a credential's name or a
model source is refused unless the policy allows it: an allow-list, not a deny-list.

The policy is one YAML file the operator owns, read from the file `GRPOFLOW_POLICY` names (set it in the work pool's
base job template or the worker's environment: no run can change either) or else the project's
`.grpoflow/policy.yaml`; with neither, the defaults below, which refuse every such field. `grpoflow init` writes a
project's own, which lets its deployments run its own rewards, data and graders.

    from_deployments:               # what a spec from a deployment may do
      trl_keys: vetted              # `vetted` (VETTED_TRL_KEYS) or a list of trl.GRPOConfig fields
      trust_remote_code: false      # a model's or reward model's own code from the Hub, however it is asked for
      modules: []                   # reward/tool modules beyond the project's own, trl.rewards and grpoflow's
      python_graders: sandboxed     # sandboxed | off
      endpoints: []                 # hosts a judge's, grader's, embeddings' or vLLM server's URL may name
      api_key_env: {}               # variable -> the hosts its value may be sent to
      paths: [data]                 # folders (relative ones: the project's) or store prefixes (s3://bucket/x)
      models: []                    # Hub model ids beside builtin:*, as patterns (Qwen/*)
      webhooks: []                  # hosts a webhook may post to
      secret_env: []                # variables a webhook may sign with
      model_graders: null           # {base_url, api_key_env}: where a model grader that names no endpoint is sent
    limits: {max_steps: 100000, rollouts_per_prompt: 64, completions_per_step: 1024, max_response_length: 32768,
             tokens_per_step: 8000000}
    teams: {}                       # name -> {paths: [...], deploy_names: [prefix...], limits: {...},
                                    #          webhooks: [{url, secret_env}]}
    run_job_variables: []           # job variables a single run may override

Loopback is never an endpoint: a judge at 127.0.0.1 from a deployment would reach the worker's own services. The
one exception is the operator's own `model_graders.base_url`: the endpoint the jobs API gives OpenAI's model graders
(`score_model`, `label_model`, and `cosine`), whose requests name a model but no endpoint; a spec naming that URL, with
no key variable or its `api_key_env`, is allowed, loopback or not. So is a team's own webhook (`teams.NAME.webhooks`,
which the jobs API gives the jobs the team creates with OpenAI's client) in that team's runs. The
`GRPOFLOW_REWARD_MODULES`, `GRPOFLOW_ALLOW_SPEC_CODE` and `GRPOFLOW_DEPLOYED_PATHS` settings of earlier versions no
longer apply to deployments (a run's job variables could set them); a refusal that one of them would have allowed
names the policy line that does now. Nothing here imports a reward or reads a dataset: the checks read the spec, the
policy and where the spec's modules and paths are.
"""

from __future__ import annotations

import fnmatch
import importlib.machinery
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from grpoflow.core.catalog import CODE_GRADERS
from grpoflow.core.uris import LOCAL_SCHEMES, file_path, is_gguf, is_local_model, url_scheme

if TYPE_CHECKING:
    from grpoflow.core.spec import JobSpec

POLICY_ENV = "GRPOFLOW_POLICY"
PROJECT_POLICY = Path(".grpoflow") / "policy.yaml"
# The earlier settings a deployment's spec no longer reads, with the policy line that does their work now.
OLD_SETTINGS = {
    "GRPOFLOW_REWARD_MODULES": "from_deployments.modules",
    "GRPOFLOW_ALLOW_SPEC_CODE": "from_deployments.python_graders",
    "GRPOFLOW_DEPLOYED_PATHS": "from_deployments.paths",
}
# What grpoflow ships as rewards, tools and environments (no factory of them takes code), and TRL's rewards.
ALWAYS_ALLOWED_MODULES = ("grpoflow.trainers.rewards.builtin", "grpoflow.examples", "trl.rewards")

# trl.GRPOConfig fields a spec from a deployment may set with `trl_keys: vetted`: numbers, switches and choices among
# TRL's own algorithms. None names a file, URL, module, credential, upload or remote code, and none is a free-form
# dict handed on to a library (generation_kwargs reaches transformers' custom_generate, model_init_kwargs
# trust_remote_code). The docs' table of them is generated from this tuple.
VETTED_TRL_KEYS = (
    "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm", "warmup_steps", "lr_scheduler_type",
    "optim", "logging_steps", "logging_first_step", "gradient_checkpointing", "activation_checkpointing",
    "epsilon", "epsilon_high", "delta", "loss_type", "scale_rewards", "importance_sampling_level",
    "mask_truncated_completions", "num_iterations", "top_k", "top_p", "min_p", "repetition_penalty",
    "steps_per_generation", "generation_batch_size", "disable_dropout", "entropy_coef", "entropy_coef_delta",
    "entropy_coef_max", "entropy_coef_min", "entropy_target", "use_adaptive_entropy", "top_entropy_quantile",
    "sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps", "max_tool_calling_iterations",
    "use_bias_correction_kl", "save_total_limit", "shuffle_dataset", "multi_objective_aggregation",
    "cast_lm_head_to_fp32", "bf16", "fp16", "tf32", "off_policy_mask_threshold", "sapo_temperature_neg",
    "sapo_temperature_pos", "vespo_k_neg", "vespo_k_pos", "vespo_lambda_neg", "vespo_lambda_pos",
    "neftune_noise_alpha", "router_aux_loss_coef", "torch_empty_cache_steps", "use_cache", "full_determinism",
    "num_generations_eval", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
    "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max",
)  # fmt: skip


class PolicyError(ValueError):
    """The policy file cannot be read or holds a mistake (the message names the file and the key)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelGraders(_Strict):
    """The operator's OpenAI-compatible endpoint for the model graders of requests that name none (the jobs API's)."""

    base_url: str = Field(description="The endpoint's /v1 root (http or https; loopback allowed).")
    api_key_env: str | None = Field(None, description="The variable holding its key (the API's and worker's env).")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        return _operator_url(url)


def _operator_url(url: str) -> str:
    """An endpoint the operator names: http(s), no credentials in it; loopback allowed (the operator's own)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise ValueError(f"{url!r} is no http(s) URL without credentials (a secret goes in a variable)")
    return url.rstrip("/")


class FromDeployments(_Strict):
    """What a spec that comes from a deployment run may do; every list is empty by default."""

    trl_keys: Literal["vetted"] | list[str] = Field("vetted", description="`vetted` or a list of GRPOConfig fields.")
    trust_remote_code: bool = Field(False, description="Model and reward-model code from the Hub.")
    modules: list[str] = Field([], description="Reward/tool modules (packages allow their submodules).")
    python_graders: Literal["sandboxed", "off"] = Field("sandboxed", description="Python graders: sandboxed or off.")
    endpoints: list[str] = Field([], description="Hosts a judge, grader, embeddings or vLLM server URL may name.")
    api_key_env: dict[str, list[str]] = Field({}, description="Variable -> hosts its value may be sent to.")
    paths: list[str] = Field(["data"], description="Folders (or store prefixes) a spec may read from.")
    models: list[str] = Field([], description="Hub model ids (patterns) beside builtin:*.")
    webhooks: list[str] = Field([], description="Hosts a webhook may post to.")
    secret_env: list[str] = Field([], description="Variables a webhook may sign with.")
    model_graders: ModelGraders | None = Field(
        None, description="Where a model grader that names no endpoint sends its calls: {base_url, api_key_env}."
    )

    @field_validator("endpoints")
    @classmethod
    def _no_loopback(cls, hosts: list[str]) -> list[str]:
        if bad := [h for h in hosts if is_loopback(h)]:
            raise ValueError(f"{', '.join(bad)}: loopback is never an endpoint (it reaches the worker's services)")
        return [h.lower() for h in hosts]

    @field_validator("trl_keys")
    @classmethod
    def _real_fields(cls, keys):
        from grpoflow.core.spec.trl_fields import trl_fields

        if isinstance(keys, list) and (unknown := sorted(set(keys) - set(trl_fields()["fields"]))):
            raise ValueError(f"not fields of trl.GRPOConfig: {', '.join(unknown)}")
        return keys


class Limits(_Strict):
    """The largest job a deployment's spec may ask for (refused before any model loads; the CLI warns past them)."""

    max_steps: int = Field(100_000, ge=1, description="Training steps.")
    rollouts_per_prompt: int = Field(64, ge=2, description="The GRPO group.")
    completions_per_step: int = Field(1024, ge=1, description="prompts_per_step x rollouts_per_prompt.")
    max_response_length: int = Field(32768, ge=1, description="Tokens of one completion.")
    tokens_per_step: int = Field(
        8_000_000, ge=1, description="completions_per_step x (max_prompt_length + max_response_length)."
    )


class TeamWebhook(_Strict):
    """A webhook of the team's: the jobs API gives it to every job the team creates with OpenAI's client."""

    url: str = Field(description="http(s) URL receiving OpenAI's fine_tuning.job.* events (loopback allowed).")
    secret_env: str | None = Field(None, description="The variable (in the worker's env) holding its signing secret.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        return _operator_url(url)


class Team(_Strict):
    """A team's own folders, deployment-name prefixes, limits (those it sets replace the policy's) and webhooks."""

    paths: list[str] = Field([], description="Folders (or store prefixes) the team's specs may read too.")
    deploy_names: list[str] = Field([], description="Prefixes the team's deploy.name must start with (any: empty).")
    limits: dict[str, int] = Field({}, description="Limits of the team's runs, in place of the policy's.")
    webhooks: list[TeamWebhook] = Field(
        [], description="Webhooks getting OpenAI's fine_tuning.job.* events of the jobs OpenAI's client creates."
    )

    @field_validator("limits")
    @classmethod
    def _known_limits(cls, limits: dict[str, int]) -> dict[str, int]:
        Limits(**limits)
        return limits


class Policy(_Strict):
    from_deployments: FromDeployments = FromDeployments()
    limits: Limits = Limits()
    teams: dict[str, Team] = {}
    run_job_variables: list[str] = []

    def limits_for(self, team: str | None) -> Limits:
        """The limits of `team`'s runs: the policy's, with those the team sets in their place."""
        own = self.teams[team].limits if team in self.teams else {}
        return self.limits.model_copy(update=own)


@dataclass(frozen=True)
class Loaded:
    """The policy in force and where it came from (a file, or `built-in defaults`)."""

    policy: Policy
    source: str


def policy_path(project: Path | None = None) -> Path | None:
    """The policy file in force: `GRPOFLOW_POLICY`'s, else the project's `.grpoflow/policy.yaml`; None for neither."""
    if named := os.environ.get(POLICY_ENV, "").strip():
        return Path(named).expanduser()
    found = Path(project or os.getcwd()) / PROJECT_POLICY
    return found if found.is_file() else None


def load_policy(project: Path | None = None) -> Loaded:
    """The policy in force for runs in `project` (default: the working folder).

    Raises:
        PolicyError: the file `GRPOFLOW_POLICY` names is missing, or the file holds a mistake.
    """
    path = policy_path(project)
    if path is None:
        return Loaded(Policy(), "the built-in defaults")
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return Loaded(Policy.model_validate(data), str(path))
    except OSError as e:
        raise PolicyError(f"policy {path}: cannot read it ({e.strerror or e}); {POLICY_ENV} names it") from None
    except yaml.YAMLError as e:
        raise PolicyError(f"policy {path}: not YAML ({e})") from None
    except ValidationError as e:
        said = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise PolicyError(f"policy {path}: {said}") from None


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine: localhost (and *.localhost), 127.0.0.0/8, ::1, 0.0.0.0, in any spelling
    Python's address parser reads (a bare integer such as 2130706433 too)."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(int(host) if host.isdigit() else host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (
        address.is_loopback or address.is_unspecified or bool(mapped and (mapped.is_loopback or mapped.is_unspecified))
    )


def host_of(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


# --- the checks -------------------------------------------------------------------------------------------------


@dataclass
class Check:
    """One spec from a deployment checked against the policy: what it is refused, each naming the field and the
    policy line that would allow it."""

    spec: JobSpec
    loaded: Loaded
    project: Path
    team: str | None = None

    @property
    def allow(self) -> FromDeployments:
        return self.loaded.policy.from_deployments

    def refuse(self, where: str, what: str, line: str) -> str:
        return f"{where}: {what}; the policy ({self.loaded.source}) allows it with `{line}`" + _old_setting(line)

    def problems(self) -> list[str]:
        checks = (self.modules, self.suites, self.graders, self.trl, self.remote_code, self.urls, self.models,
                  self.files, self.webhooks, self.limits, self.deploy_name)  # fmt: skip
        return [problem for check in checks for problem in check()]

    # --- code

    def modules(self) -> list[str]:
        allowed = [*ALWAYS_ALLOWED_MODULES, *self.allow.modules]
        problems = []
        for where, ref in code_references(self.spec):
            module = ref.partition(":")[0]
            if any(module == a or module.startswith(a + ".") for a in allowed):
                continue
            if module.split(".")[0] != "grpoflow" and in_project(module, self.project):
                continue
            if module == "grpoflow" or module.startswith("grpoflow."):
                problems.append(
                    f"{where}: module {module!r}: no grpoflow module but its built-in rewards and examples (its "
                    "factories can carry a grader or code past the policy); name a built-in reward by its name, or "
                    "give a grader in the entry's `grader:`"
                )
                continue
            what = f"module {module!r} is neither the project's own nor an allowed one"
            problems.append(self.refuse(where, what, f"from_deployments.modules: [{module}]"))
        return problems

    def suites(self) -> list[str]:
        """An evaluation suite is code: the project's own files only (as modules are the project's own)."""
        root, problems = self.project.resolve(), []
        # What teams and runs write (the data folders, the job folders with their uploads) is not the project's code,
        # even inside the project folder.
        written = [r for r in [*self.read_roots(), self._output_root()] if isinstance(r, Path)]
        for i, suite in enumerate(self.spec.evaluation.suites):
            where, file = f"evaluation.suites[{i}].inspect", (self.project / suite.file).resolve()
            if not file.is_relative_to(root):
                problems.append(
                    f"{where}: {suite.file} is outside the project folder ({root}); a deployment's spec runs only "
                    "the project's own suite files: move it into the project"
                )
            elif folder := next((r for r in written if file.is_relative_to(r)), None):
                problems.append(
                    f"{where}: {suite.file} is in {folder}, a folder data and jobs are written to, not the project's "
                    "code; a deployment's spec runs only suite files the project ships"
                )
        return problems

    def _output_root(self) -> Path | None:
        if url_scheme(self.spec.output_uri) not in LOCAL_SCHEMES:
            return None
        return _root(file_path(self.spec.output_uri), self.project)

    def graders(self) -> list[str]:
        places = spec_code(self.spec)
        if not places:
            return []
        if self.allow.python_graders == "off":
            what = "a python grader is code carried inside the spec, which the policy turns off"
            return [self.refuse(where, what, "from_deployments.python_graders: sandboxed") for where in places]
        return []  # allowed, in the sandbox: whether one starts on this worker is `sandbox_refusals`'

    def trl_allowed(self, key: str) -> bool:
        """Whether the `trl:` key may be set (trust_remote_code is its own policy line, `remote_code`)."""
        allowed = VETTED_TRL_KEYS if self.allow.trl_keys == "vetted" else self.allow.trl_keys
        return key in allowed or key == "trust_remote_code"

    def trl(self) -> list[str]:
        return [
            self.refuse(f"trl.{key}", "not a vetted trl: key", f"from_deployments.trl_keys: [..., {key}]")
            for key in self.spec.trl
            if not self.trl_allowed(key)
        ]

    def remote_code(self) -> list[str]:
        if self.allow.trust_remote_code:
            return []
        found = [(f"trl.{k}", v) for k, v in self.spec.trl.items() if self.trl_allowed(k)]  # others: refused already
        found += [(f"rewards[{i}].kwargs", r.kwargs) for i, r in enumerate(self.spec.rewards)]
        return [
            self.refuse(
                where, "runs a model's own code with the worker's secrets", "from_deployments.trust_remote_code: true"
            )  # fmt: skip
            for top, value in found
            for where, item in _walk(value, top)
            if where.endswith("trust_remote_code") and item not in (False, None)
        ]

    # --- where requests go

    def urls(self) -> list[str]:
        problems, own = [], self.allow.model_graders
        for where, url, key_env in endpoint_urls(self.spec):
            if own is not None and url.rstrip("/") == own.base_url and key_env in (None, own.api_key_env):
                continue  # the operator's own endpoint for model graders
            host = host_of(url)
            if is_loopback(host):
                problems.append(f"{where}: {url} is on loopback, which a deployment's spec never names (the worker's "
                                "own services are there); no policy line allows it")  # fmt: skip
            elif host not in self.allow.endpoints:
                problems.append(self.refuse(where, f"host {host!r} is not an allowed endpoint",
                                            f"from_deployments.endpoints: [{host}]"))  # fmt: skip
            if key_env and host not in [h.lower() for h in self.allow.api_key_env.get(key_env, [])]:
                problems.append(self.refuse(
                    f"{where.rpartition('.')[0]}.api_key_env", f"the value of {key_env} may not be sent to {host!r}",
                    f"from_deployments.api_key_env: {{{key_env}: [{host}]}}",
                ))  # fmt: skip
        return problems + self.keys_without_url()

    def keys_without_url(self) -> list[str]:
        """An `api_key_env` with no URL beside it (an endpoint's default host) still names a credential: only a
        variable the policy lists."""
        found = []
        for where, entry in _entries(self.spec):
            for key in ("grader", "kwargs"):
                for place, value in _walk(getattr(entry, key, None), f"{where}.{key}"):
                    if isinstance(value, dict) and isinstance(env := value.get("api_key_env"), str):
                        if not any(isinstance(v, str) and "://" in v for v in value.values()):
                            found.append((f"{place}.api_key_env", env))
        return [
            self.refuse(
                where,
                f"{env} is not a key variable the policy lists",
                f"from_deployments.api_key_env: {{{env}: [HOST]}}",
            )  # fmt: skip
            for where, env in found
            if env not in self.allow.api_key_env
        ]

    def webhooks(self) -> list[str]:
        problems, team = [], self.loaded.policy.teams.get(self.team) if self.team else None
        own = {(h.url, h.secret_env) for h in (team.webhooks if team else [])}
        for i, hook in enumerate(self.spec.webhooks):
            if (hook.url.rstrip("/"), hook.secret_env) in own:
                continue  # the operator's own webhook of the team
            host = host_of(hook.url)
            if host not in [h.lower() for h in self.allow.webhooks]:
                problems.append(self.refuse(f"webhooks[{i}].url", f"host {host!r} is not an allowed webhook host",
                                            f"from_deployments.webhooks: [{host}]"))  # fmt: skip
            if hook.secret_env and hook.secret_env not in self.allow.secret_env:
                problems.append(self.refuse(f"webhooks[{i}].secret_env", f"{hook.secret_env} is not a signing "
                                            "secret the policy lists", f"from_deployments.secret_env: "
                                            f"[{hook.secret_env}]"))  # fmt: skip
        return problems

    # --- models and files

    def models(self) -> list[str]:
        problems = []
        for where, model in model_sources(self.spec):
            if model.startswith("builtin:") or _is_local_model(model):
                continue  # a local model is a path: `files` checks it
            if not any(fnmatch.fnmatchcase(model, pattern) for pattern in self.allow.models):
                problems.append(self.refuse(where, f"model {model!r} is not an allowed model source",
                                            f"from_deployments.models: [{model}]"))  # fmt: skip
        return problems

    def files(self) -> list[str]:
        reads = [("dataset.uri", self.spec.dataset.uri)]
        if (validation := self.spec.evaluation.dataset) is not None:
            reads.append(("evaluation.dataset.uri", validation.uri))
        reads += [(where, m) for where, m in model_sources(self.spec) if _is_local_model(m)]
        problems = [p for where, uri in reads if (p := self.outside(where, uri, self.read_roots()))]
        if problem := self.outside("output_uri", self.spec.output_uri, [self.project.resolve(), *self.listed()]):
            problems.append(problem)
        return problems

    def listed(self) -> list[Path | str]:
        """The policy's paths and the team's, as roots."""
        team = self.loaded.policy.teams.get(self.team) if self.team else None
        return [_root(p, self.project) for p in [*self.allow.paths, *(team.paths if team else [])]]

    def read_roots(self) -> list[Path | str]:
        """Where a spec may read: the listed paths, and the team's job folders (all jobs' without teams)."""
        roots = self.listed()
        if url_scheme(self.spec.output_uri) in LOCAL_SCHEMES:  # the team's own jobs: a warm start reads one
            jobs = Path(file_path(self.spec.output_uri)) / (self.team or "")
            roots.append(_root(str(jobs), self.project))
        return roots

    def outside(self, where: str, uri: str, roots: list[Path | str]) -> str | None:
        if url_scheme(uri) not in LOCAL_SCHEMES:
            prefixes = [r for r in roots if isinstance(r, str)]
            if any(uri.rstrip("/") == p or uri.startswith(p + "/") for p in prefixes):
                return None
            return self.refuse(where, f"{uri} is not under a store prefix the policy lists",
                               f"from_deployments.paths: [{uri.rsplit('/', 1)[0]}]")  # fmt: skip
        try:
            resolved = (self.project / Path(file_path(uri)).expanduser()).resolve()
        except ValueError as e:  # a file:// URL of another host
            return f"{where}: {e}"
        if any(isinstance(r, Path) and resolved.is_relative_to(r) for r in roots):
            return None
        folder = resolved.parent
        shown = folder.relative_to(self.project.resolve()) if folder.is_relative_to(self.project.resolve()) else folder
        return self.refuse(where, f"{uri} resolves outside the folders the policy lets a deployment's spec use",
                           f"from_deployments.paths: [{shown}]")  # fmt: skip

    # --- size and names

    def limits(self) -> list[str]:
        limits = self.loaded.policy.limits_for(self.team)
        line = f"teams.{self.team}.limits" if self.team else "limits"
        return [f"{where}: {what}; the policy ({self.loaded.source}) allows more with `{line}.{key}`"
                for where, what, key in limit_excess(self.spec, limits)]  # fmt: skip

    def deploy_name(self) -> list[str]:
        team = self.loaded.policy.teams.get(self.team) if self.team else None
        if not (self.spec.deploy and team and team.deploy_names):
            return []
        name = self.spec.deploy.name
        if any(name.startswith(prefix) for prefix in team.deploy_names):
            return []
        return [self.refuse("deploy.name", f"{name!r} is not among team {self.team}'s serving names",
                            f"teams.{self.team}.deploy_names: [{name}]")]  # fmt: skip


def limit_excess(spec: JobSpec, limits: Limits) -> list[tuple[str, str, str]]:
    """Where `spec` asks for more than `limits`: (field, what, limit key)."""
    hp = spec.hyperparameters
    completions = hp.prompts_per_step * hp.rollouts_per_prompt
    tokens = completions * (hp.max_prompt_length + hp.max_response_length)
    asked = (
        ("hyperparameters.max_steps", hp.max_steps, "max_steps"),
        ("hyperparameters.rollouts_per_prompt", hp.rollouts_per_prompt, "rollouts_per_prompt"),
        ("hyperparameters.prompts_per_step", completions, "completions_per_step"),
        ("hyperparameters.max_response_length", hp.max_response_length, "max_response_length"),
        ("hyperparameters.max_response_length", tokens, "tokens_per_step"),
    )
    said = {
        "completions_per_step": "completions a step (prompts_per_step x rollouts_per_prompt)",
        "tokens_per_step": "tokens a step (completions x (max_prompt_length + max_response_length))",
    }
    return [
        (where, f"{value:,} {said.get(key, '')}".rstrip() + f" is over the limit of {getattr(limits, key):,}", key)
        for where, value, key in asked
        if value > getattr(limits, key)
    ]


def deployment_check(spec: JobSpec, project: Path | None = None, team: str | None = None) -> list[str]:
    """Everything the policy in force refuses `spec` as a deployment's spec, in one pass (empty when allowed).

    Args:
        spec (`JobSpec`): the spec a deployment run was given.
        project (`Path`, *optional*): the project folder (default: the working folder, where the worker runs it).
        team (`str`, *optional*): the run's team; an unknown one is refused.
    """
    project = Path(project or os.getcwd())
    try:
        loaded = load_policy(project)
    except PolicyError as e:
        return [str(e)]
    if team is not None and team not in loaded.policy.teams:
        known = ", ".join(loaded.policy.teams) or "none"
        return [f"team {team!r}: not a team of the policy ({loaded.source}; teams: {known})"]
    return Check(spec, loaded, project, team).problems()


# --- what a spec names --------------------------------------------------------------------------------------------


def code_references(spec: JobSpec) -> list[tuple[str, str]]:
    """Every `package.module:callable` the spec names, with where: (location, reference)."""
    refs = [(f"rewards[{i}].function", r.function) for i, r in enumerate(spec.rewards) if r.function]
    metric = spec.evaluation.metric
    if not isinstance(metric, str | None) and metric.function:
        refs.append(("evaluation.metric.function", metric.function))
    refs += [(f"tools[{i}]", tool) for i, tool in enumerate(spec.tools)]
    if spec.environment:
        refs.append(("environment", spec.environment))
    return refs


def _entries(spec: JobSpec) -> list[tuple[str, Any]]:
    """The rewards and the held-out metric, each with where it is: what holds kwargs and graders."""
    entries = [(f"rewards[{i}]", r) for i, r in enumerate(spec.rewards)]
    metric = spec.evaluation.metric
    if not isinstance(metric, str | None):
        entries.append(("evaluation.metric", metric))
    return entries


def spec_code(spec: JobSpec) -> list[str]:
    """Where the spec carries code of its own: each `python` grader, in a `grader:` (a multi grader's sub-graders
    included) or anywhere in a `kwargs` (a factory named by `function:` that takes a grader)."""
    places = []
    for where, entry in _entries(spec):
        for key in ("grader", "kwargs"):
            for place, value in _walk(getattr(entry, key, None), f"{where}.{key}"):
                if isinstance(value, dict) and value.get("type") in CODE_GRADERS:
                    places.append(place)
    return places


def endpoint_urls(spec: JobSpec) -> list[tuple[str, str, str | None]]:
    """Every URL the spec's rewards, graders and metric may send a request to, and the vLLM server's: (where, URL,
    the `api_key_env` beside it or None). Any string holding `://` in a kwargs or grader counts, whatever its key."""
    found = []
    for where, entry in _entries(spec):
        for key in ("grader", "kwargs"):
            for place, value in _walk(getattr(entry, key, None), f"{where}.{key}"):
                if isinstance(value, dict):
                    env = value.get("api_key_env") if isinstance(value.get("api_key_env"), str) else None
                    found += [(f"{place}.{k}", v, env) for k, v in value.items() if isinstance(v, str) and "://" in v]
                elif isinstance(value, list):
                    found += [
                        (f"{place}[{i}]", v, None) for i, v in enumerate(value) if isinstance(v, str) and "://" in v
                    ]
    if spec.generation.vllm_server_url:
        found.append(("generation.vllm_server_url", spec.generation.vllm_server_url, None))
    return found


def model_sources(spec: JobSpec) -> list[tuple[str, str]]:
    models = [("base_model", spec.base_model)] + [(f"rewards[{i}].model", r.model) for i, r in enumerate(spec.rewards)]
    metric = spec.evaluation.metric
    if not isinstance(metric, str | None):
        models.append(("evaluation.metric.model", metric.model))
    return [(where, model) for where, model in models if model]


def _is_local_model(model: str) -> bool:
    if model.startswith("builtin:") or url_scheme(model) not in LOCAL_SCHEMES:
        return False
    return is_local_model(model) or is_gguf(model) or model.startswith(("/", ".", "~"))


def _walk(value: object, where: str):
    """(place, value) for `value` and everything nested in it (mappings and lists)."""
    yield where, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{where}[{i}]")


def in_project(module: str, project: Path) -> bool:
    """Whether `module`'s top-level package or module lives under `project`, looked up as its import would find it
    (the project folder after sys.path, as trainers/rewards/build.py imports it), without importing anything."""
    top = module.split(".")[0]
    if top in sys.builtin_module_names or importlib.machinery.FrozenImporter.find_spec(top) is not None:
        return False  # os, sys, ...: no file, never the project's
    found = importlib.machinery.PathFinder.find_spec(top, [*sys.path, str(project)])
    if found is None:
        return False
    places = [found.origin] if found.has_location and found.origin else []
    places += list(found.submodule_search_locations or [])
    root = project.resolve()
    return bool(places) and all(Path(p).is_absolute() and Path(p).resolve().is_relative_to(root) for p in places)


def _root(listed: str, project: Path) -> Path | str:
    """A policy path as a root: a store prefix as written (no trailing slash), a folder resolved (relative ones
    against the project folder)."""
    if url_scheme(listed) not in LOCAL_SCHEMES:
        return listed.rstrip("/")
    return (project / Path(file_path(listed)).expanduser()).resolve()


def _old_setting(line: str) -> str:
    """A note when an earlier setting that did this line's work is still set in the worker's environment."""
    for variable, key in OLD_SETTINGS.items():
        if line.startswith(key) and os.environ.get(variable):
            return f" ({variable} in the worker's environment no longer applies to deployments: the policy does)"
    return ""
