"""Preflight: every offline check of a job that a GPU hour should not be spent to discover, before anything runs.

`grpoflow validate` runs it after the spec loads, and `grpoflow run` and `grpoflow submit` before anything starts or is
sent. It loads no weights and needs no torch (a reward module may import it): the model folder or Hub cache holds
config.json and weights (a GGUF file: transformers can read its architecture, and its header gives the config), that
config names a causal LM (transformers' table of them, which imports torch, is read only for architectures not named
*ForCausalLM), the architecture's rules read from that config, the tokenizer has a chat template when the prompts need
one, a local output root can be written and has room for a checkpoint and the trained model, the dataset (and a
validation set, `evaluation.dataset`) opens and has its columns (checked as the ingest checks it, nothing saved), the
evaluation suites' files define their inspect-ai tasks (read, not run; the evals extra installed), the rewards import
and pass the dry run on a few rows, and the tools and environment import and pass theirs on a row. Two exceptions,
both in the reward dry run: a reward model (`rewards[].model`, its files checked first) is loaded on CPU to score the
sample, and an `llm_judge` calls its endpoint. By hand:

    python -m grpoflow.jobs.preflight examples/arithmetic.yaml

Each check is a function of a `Preflight` (the spec and what the earlier checks found) returning problems, one line
each, naming the spec field ("base_model: ..."); `CHECKS` runs them all, in order, so every problem is reported at
once. A new check is one function and one line in `CHECKS`.
"""

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpoflow.core.spec import LIGER_UNSUPPORTED, JobSpec, SpecError, load_spec, model_family
from grpoflow.core.uris import is_gguf, is_remote
from grpoflow.trainers.agents import (
    AgentError,
    environment_problems,
    load_environment,
    load_tools,
    sft_completion_problems,
    tool_template_problem,
)
from grpoflow.trainers.model.architecture import lora_target_problem
from grpoflow.trainers.model.gguf import (
    GgufHeader,
    gguf_config,
    gguf_folder,
    gguf_note,
    gguf_problem,
    local_gguf,
    read_header,
)
from grpoflow.trainers.model.hub import WEIGHT_FILES, cached_hub_file
from grpoflow.trainers.model.load import (
    causal_lm_problem,
    chat_template_problem,
    free_space,
    hub_model_problem,
    is_local_model,
    model_problem,
    openai_roles,
    size_in_words,
    weights_problem,
)
from grpoflow.trainers.model.tiny import TINY_VERSION, cache_root, is_builtin, resolve_model_path
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.dry_run import dry_run_job_rewards, metric_columns, required_columns
from grpoflow.trainers.rewards.models import reward_model_problem
from grpoflow.trainers.suites import suite_problems


@dataclass
class Preflight:
    """A job under check: its spec, the warnings so far, and what the earlier checks found for the later ones."""

    spec: JobSpec
    warnings: list[str] = field(default_factory=list)
    # The folder holding the model's config.json and tokenizer files: a local folder or its Hub cache snapshot.
    model_dir: Path | None = None
    config: dict | None = None
    storage_options: dict = field(default_factory=dict)  # fsspec options for a remote dataset
    rewards: list[tuple[int, Callable]] = field(default_factory=list)  # (index in spec.rewards, reward) that built
    prompt_format: str | None = None  # "text" or "chat", once the dataset opened
    sample: Any = None  # a few training rows (a `datasets.Dataset`), once the dataset opened
    tokenizer: Any = None  # the model's tokenizer, when it loads from a local folder (no weights, no download)
    causal_lm: bool = True  # False once check_causal_lm found it is not (the checks that build the model skip it)
    gguf: GgufHeader | None = None  # a GGUF base model's header, once check_model read it


# --- the model -------------------------------------------------------------------------------------------------------


def check_model(p: Preflight) -> list[str]:
    """A local folder exists and holds config.json and weights; a Hub id is in the local cache when offline, else a
    warning."""
    base = p.spec.base_model
    if is_builtin(base):
        try:
            if base != "builtin:tiny":  # builtin:tiny is fine: built offline on first use, which takes seconds
                resolve_model_path(base)
        except ValueError as e:
            return [f"base_model: {e}"]
        return []
    if is_gguf(base):
        return check_gguf(p)
    if problem := model_problem(base):
        return [problem]
    if is_local_model(base):
        p.model_dir = Path(base).expanduser()
    elif (config := cached_hub_file(base, "config.json")) is not None:
        p.model_dir = config.parent
    elif problem := hub_model_problem(base):
        return [problem]
    else:
        p.warnings.append(f"base_model: {base!r} is not in the local Hugging Face cache; it will be downloaded")
        return []
    try:
        p.config = json.loads((p.model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        return [f"base_model: cannot read {p.model_dir / 'config.json'}: {e}"]
    if not isinstance(p.config, dict):
        p.config = None
        return [f"base_model: {p.model_dir / 'config.json'} is not a JSON object"]
    # The folder stays p.model_dir: its tokenizer and config are still worth checking, for every problem at once.
    return [problem] if (problem := weights_problem(base)) else []


def check_gguf(p: Preflight) -> list[str]:
    """A GGUF file (trainers/model/gguf.py) that transformers can read, said once to be dequantized; the folder it was
    converted to, when it was, is then checked as any model folder, else the config its header gives. A remote file
    (`hf://`, `s3://`) not downloaded yet: its metadata only (the file is there), its header read by the training
    child."""
    base = p.spec.base_model
    if problem := gguf_problem(base):
        return [problem]
    local = local_gguf(base)  # None: a remote file not downloaded yet
    p.gguf = read_header(local) if local is not None else None
    p.warnings.append(gguf_note(base, p.spec.hyperparameters.load_in_4bit))
    folder = gguf_folder(base)
    if (folder / "config.json").is_file():
        p.model_dir, p.config = folder, json.loads((folder / "config.json").read_text())
    else:
        p.config = gguf_config(base) or None
    return []


def check_causal_lm(p: Preflight) -> list[str]:
    """config.json says a causal LM (GRPO generates with it and scores its tokens): not T5 or another
    encoder-decoder, nor a model AutoModelForCausalLM does not load."""
    source = "its GGUF header" if p.gguf is not None and p.model_dir is None else "config.json"
    if p.config is None or (problem := causal_lm_problem(p.config, p.spec.base_model, source=source)) is None:
        return []
    p.causal_lm = False
    return [problem]


def check_architecture(p: Preflight) -> list[str]:
    """The rules that depend on the model family, read from config.json's model_type (the spec's rules can only guess
    it from a Hub id's name)."""
    hp, family = p.spec.hyperparameters, (p.config or {}).get("model_type")
    if not isinstance(family, str) or not hp.use_liger:
        return []
    guessed = model_family(p.spec.base_model)
    if family.lower().startswith(LIGER_UNSUPPORTED) and not (guessed or "").startswith(LIGER_UNSUPPORTED):
        return [
            f"hyperparameters.use_liger: not supported for {family} models (config.json's model_type) such as "
            f"{p.spec.base_model!r} (Liger's kernels give wrong log-probs); set use_liger: false"
        ]
    return []


def check_lora_targets(p: Preflight) -> list[str]:
    """hyperparameters.lora_target_modules names modules the model has (its config built on the meta device)."""
    hp = p.spec.hyperparameters
    if (
        not p.causal_lm
        or hp.lora_rank is None
        or hp.lora_target_modules is None
        or p.model_dir is None
        and not is_builtin(p.spec.base_model)
    ):
        return []  # a full fine-tune; every projection; or a Hub model not here to look at

    problem = lora_target_problem(str(p.model_dir or resolve_model_path(p.spec.base_model)), hp.lora_target_modules)
    return [problem] if problem else []


def has_chat_template(model_dir: Path) -> bool | None:
    """Whether the tokenizer saved in `model_dir` has a chat template (in tokenizer_config.json, or the
    chat_template.jinja / chat_template.json files transformers writes); None when there is no tokenizer config."""
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(config, dict) and config.get("chat_template"):
        return True
    return any((model_dir / name).is_file() for name in ("chat_template.jinja", "chat_template.json"))


def check_chat_template(p: Preflight) -> list[str]:
    """The tokenizer has a chat template when the prompts are chats or hyperparameters.system_prompt makes them so."""
    system_prompt = p.spec.hyperparameters.system_prompt
    needs_one = p.prompt_format == "chat" or system_prompt is not None
    # builtin:tiny has a template; a Hub model not in the cache cannot be looked at (it is downloaded on the worker).
    if p.model_dir is not None:
        has_one = has_chat_template(p.model_dir)
    else:
        has_one = p.gguf.chat_template if p.gguf is not None else None
    if not needs_one or has_one is not False:
        return []
    return [chat_template_problem(p.spec.base_model, p.prompt_format == "chat", system_prompt)]


# --- the rewards and the dataset -------------------------------------------------------------------------------------


def _reward_field(p: Preflight, message: str) -> str:
    """`message` prefixed with the spec field of the reward it names (`rewards[i]`)."""
    for i, reward in enumerate(p.spec.rewards):
        if message.startswith(f"reward {reward.name!r}"):
            return f"rewards[{i}]: {message}"
    return f"rewards: {message}"


def check_rewards_build(p: Preflight) -> list[str]:
    """Each reward imports (a custom function) or exists (a built-in) and takes its kwargs; a reward model is here,
    offline, and is a sequence classifier (its files read, no weights loaded)."""
    problems = []
    for i, reward in enumerate(p.spec.rewards):
        if reward.model is not None and (problem := reward_model_problem(reward.model)) is not None:
            problems.append(f"rewards[{i}].model: {problem}")
            continue
        try:
            built = build_reward(
                reward.name, reward.function, reward.kwargs, reward.model, reward.grader, p.spec.dataset.prompt_column
            )
            p.rewards.append((i, built))
        except RewardError as e:
            problems.append(f"rewards[{i}]: {e}")
    return problems


def _built_spec(p: Preflight) -> JobSpec:
    """The spec with only the rewards that built, for the helpers that pair `spec.rewards` with built rewards."""
    return p.spec.model_copy(update={"rewards": [p.spec.rewards[i] for i, _ in p.rewards]})


def check_dataset(p: Preflight) -> list[str]:
    """The dataset opens and has the prompt column and every column the rewards and the SFT warm-up read."""
    from grpoflow.core.errors import DatasetError
    from grpoflow.trainers.dataset import check_dataset as load_and_check

    spec = p.spec
    try:
        p.prompt_format, p.sample = load_and_check(
            spec.dataset.uri,
            prompt_column=spec.dataset.prompt_column,
            required_columns=required_columns(_built_spec(p), [fn for _, fn in p.rewards]),
            holdout=spec.evaluation.holdout,
            seed=spec.hyperparameters.seed,
            split=spec.dataset.split,
            storage_options=p.storage_options,
            max_row_bytes=spec.dataset.max_row_bytes,
        )
    except DatasetError as e:
        return [f"dataset: {problem}" for problem in e.problems]  # each its own line of the report
    return []


def check_validation_set(p: Preflight) -> list[str]:
    """`evaluation.dataset` opens and has, as the ingest checks it, prompts of the training set's format and the
    columns the held-out metric reads."""
    from grpoflow.core.errors import DatasetError
    from grpoflow.trainers.dataset import ValidationSet
    from grpoflow.trainers.dataset import check_validation_set as load_and_check

    if (vs := p.spec.evaluation.dataset) is None:
        return []
    try:
        columns = metric_columns(p.spec)
    except RewardError:
        columns = None  # a metric that does not build is the rewards' check's to report
    options = p.storage_options if is_remote(vs.uri) else None
    try:
        load_and_check(
            ValidationSet(vs.uri, vs.prompt_column, columns, vs.split, options, vs.max_row_bytes),
            p.spec.dataset.prompt_column,
            p.prompt_format,
        )
    except DatasetError as e:
        return e.problems  # each names evaluation.dataset
    return []


def check_rewards_dry_run(p: Preflight) -> list[str]:
    """The rewards that built pass the dry run on a few of the dataset's rows, shaped as TRL will pass them."""
    if p.sample is None or not p.rewards:
        return []
    try:
        p.warnings += dry_run_job_rewards(_built_spec(p), [fn for _, fn in p.rewards], p.sample)
    except RewardError as e:
        return [_reward_field(p, problem) for problem in e.problems]
    return []


# --- what the model can do with the prompts --------------------------------------------------------------------------

KNOWN_ROLES = ("system", "user", "assistant", "tool")


def _local_model_dir(p: Preflight) -> Path | None:
    if p.model_dir is not None:
        return p.model_dir
    if p.spec.base_model != "builtin:tiny":
        return None

    # Its cached folder when it was built, without building it (which needs torch): otherwise nothing to read.
    folder = cache_root() / f"builtin-tiny-{TINY_VERSION}"
    return folder if (folder / "config.json").is_file() else None


class _Tokenizer:
    """The model's tokenizer.json and chat template, read with `tokenizers` and jinja2 as transformers renders them,
    so preflight stays without torch (transformers' AutoTokenizer imports it)."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        template = folder / "chat_template.jinja"
        self.chat_template = template.read_text() if template.is_file() else config.get("chat_template")
        self.special = {k: v for k, v in config.items() if k in ("bos_token", "eos_token") and isinstance(v, str)}

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def render(self, messages: list[dict]) -> str:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=True, **self.special
        )


def _tokenizer(p: Preflight) -> "_Tokenizer | None":
    """The model's tokenizer when its folder (local or the Hub cache) holds tokenizer.json: files only, no weights,
    no network, no torch; None otherwise (or when it fails to load: the training child reports that)."""
    folder = _local_model_dir(p)
    if p.tokenizer is None and folder is not None and (folder / "tokenizer.json").is_file():
        try:
            p.tokenizer = _Tokenizer(folder)
        except Exception:
            p.tokenizer = False
    return p.tokenizer or None


def _messages(p: Preflight, prompt) -> list[dict]:
    system = p.spec.hyperparameters.system_prompt
    if isinstance(prompt, list):
        return prompt
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}
    ]


def _prompt_length(p: Preflight, prompt, tokenizer) -> int:
    """Tokens of one prompt as the model sees it (its chat template applied to a chat), or chars / 4 without one."""
    chat = isinstance(prompt, list) or p.spec.hyperparameters.system_prompt is not None
    if tokenizer is None:
        text = "".join(str(m.get("content", "")) for m in _messages(p, prompt)) if chat else prompt
        return len(text) // 4
    try:
        return tokenizer.count(tokenizer.render(_messages(p, prompt)) if chat and tokenizer.chat_template else prompt)
    except Exception:  # a template that cannot render the row: check_chat_roles says so
        return 0


def check_context_length(p: Preflight) -> list[str]:
    """max_response_length plus the longest sampled prompt fits the model's positions (config.json's
    max_position_embeddings or n_positions): beyond them a model errors or produces garbage."""
    folder = _local_model_dir(p)
    config = p.config
    if config is None and folder is not None:
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            return []
    config = config if isinstance(config, dict) else {}
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    if not isinstance(positions, int) or p.sample is None or len(p.sample) == 0:
        return []
    tokenizer = _tokenizer(p)
    prompts = p.sample[p.spec.dataset.prompt_column]
    longest = max(_prompt_length(p, prompt, tokenizer) for prompt in prompts)
    how = "counted with the model's tokenizer" if tokenizer else "estimated at 4 characters a token"
    response = p.spec.hyperparameters.max_response_length
    if longest + response <= positions:
        return []
    key = "max_position_embeddings" if config.get("max_position_embeddings") else "n_positions"
    message = (
        f"hyperparameters.max_response_length: {response:,} plus the longest of {len(prompts)} sampled prompts "
        f"({longest:,} tokens, {how}) is {longest + response:,}, beyond the {positions:,} positions of "
        f"{p.spec.base_model} (config.json {key}); lower max_response_length to at most "
        f"{max(positions - longest, 0):,}, or shorten the prompts"
    )
    # Learned position embeddings (GPT-2's n_positions) have no row past the last: generation fails with an index
    # error. Rotary ones run on, degrading past the trained length: that is a warning.
    if any(k in config for k in ("rope_theta", "rope_scaling", "rope_parameters")):
        p.warnings.append(message + " (rotary positions: it runs, but past its trained length the model degrades)")
        return []
    return [message]


def check_chat_roles(p: Preflight) -> list[str]:
    """Chat prompts use roles the chat template knows: a role outside system/user/assistant/tool is a warning; a
    template that raises on the sampled rows (when the tokenizer loads from a local folder) is a problem. OpenAI's
    `developer` role is read as `system`, as training reads it (`grpoflow.trainers.model.load.openai_roles`)."""
    if p.prompt_format != "chat" or p.sample is None:
        return []
    prompts = [openai_roles(prompt) for prompt in p.sample[p.spec.dataset.prompt_column]]
    odd = sorted(
        {str(m.get("role")) for prompt in prompts for m in prompt if m.get("role") not in KNOWN_ROLES} - {"None"}
    )
    tokenizer = _tokenizer(p)
    if tokenizer is not None and tokenizer.chat_template:
        for row, prompt in enumerate(prompts):
            try:
                tokenizer.render(prompt)
            except Exception as e:
                return [
                    f"dataset.prompt_column: the chat template of {p.spec.base_model} cannot render sampled row {row} "
                    f"({type(e).__name__}: {e}); use the roles {', '.join(KNOWN_ROLES)}"
                ]
    if odd:
        p.warnings.append(
            f"dataset.prompt_column: chat messages with the role {', '.join(map(repr, odd))}, which chat templates "
            f"do not know (they know {', '.join(KNOWN_ROLES)}): the template may drop or mislabel them"
        )
    return []


def check_agents(p: Preflight) -> list[str]:
    """`tools:` import and have schemas; `environment:` builds, resets on the first sampled row (as TRL passes it:
    every column, the prompt as `prompt`) and its get_reward() returns a number; the SFT warm-up's completions are
    text or tool-calling conversations; the prompts are chats, and the chat template renders tool calls that TRL can
    parse (when the tokenizer is here to read)."""
    spec = p.spec
    if not spec.tools and spec.environment is None:
        return []
    problems, factory = [], None
    try:
        load_tools(spec.tools)
        factory = load_environment(spec.environment)
    except AgentError as e:
        problems.append(str(e))
    if factory is not None and p.sample is not None and len(p.sample) > 0:
        row = dict(p.sample[0])
        row["prompt"] = _messages(p, row.pop(spec.dataset.prompt_column))
        problems += environment_problems(factory, row)
    if spec.sft.enabled and p.sample is not None and spec.sft.completion_column in p.sample.column_names:
        sft_problems, sft_warnings = sft_completion_problems(list(p.sample), spec.sft.completion_column)
        problems += sft_problems
        p.warnings += sft_warnings
    if p.prompt_format == "text" and spec.hyperparameters.system_prompt is None:
        problems.append(
            "dataset.prompt_column: tools and environment need chat prompts (TRL's tool loop appends the calls and "
            "their results as messages): give lists of messages, or set hyperparameters.system_prompt"
        )
    if (tokenizer := _tokenizer(p)) is not None:
        has_parser = bool(
            json.loads((_local_model_dir(p) / "tokenizer_config.json").read_text()).get("response_template")
        )
        if problem := tool_template_problem(tokenizer.chat_template, spec.base_model, has_parser):
            problems.append(problem)
    return problems


# --- the output root -------------------------------------------------------------------------------------------------

ADAM_BYTES_PER_PARAMETER = 8  # a full fine-tune's checkpoint holds Adam's two float32 moments of every weight
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _weights_bytes(folder: Path) -> int:
    """The size of the model's weights in `folder` (its weight file, or what its shard index says); 0 if unknown."""
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return path.stat().st_size
        try:
            size = json.loads(path.read_text()).get("metadata", {}).get("total_size")
        except (OSError, ValueError, AttributeError):
            return 0
        return size if isinstance(size, int) else 0
    return 0


def space_needed(p: Preflight) -> tuple[int, str]:
    """Bytes the job folder needs at least, and how they were estimated: one checkpoint (for a full fine-tune, the
    weights and Adam's moments; a LoRA adapter's is small) and the trained model. (0, "") when the model's files are
    not here to size."""
    folder = _local_model_dir(p)
    weights = _weights_bytes(folder) if folder is not None else 0
    if not weights:
        return 0, ""
    config = p.config or {}
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    parameters = weights // _DTYPE_BYTES.get(dtype, 4)
    source = f"estimated from {p.spec.base_model}'s {size_in_words(weights)} of weights"
    if p.spec.hyperparameters.lora_rank is not None:
        return weights, f"the merged model, {source}"
    checkpoint = weights + ADAM_BYTES_PER_PARAMETER * parameters
    how = f"one checkpoint of {size_in_words(checkpoint)} (the weights and Adam's moments) and the trained model"
    return checkpoint + weights, f"{how}, {source}"


def _nearest_folder(path: Path) -> Path:
    """`path`, or its nearest parent that exists: where a run would create the rest."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_root(p: Preflight) -> list[str]:
    """A local output_uri can be written (a probe file is made and removed there, or in the nearest folder above it
    that exists) and has room for what training writes (`space_needed`): a full disk or a read-only root would
    otherwise fail at the first checkpoint. A remote one's jobs run in a worker's staging folder, not checked here."""
    uri = p.spec.output_uri
    if is_remote(uri):
        return []
    root = Path(uri).expanduser().absolute()
    folder = _nearest_folder(root)
    at = uri if folder == root else f"{uri}: {folder}"  # the folder a run would write in first
    if not folder.is_dir():
        return [f"output_uri: {at} is not a folder; give a folder (or a path one can be made at)"]
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".grpoflow-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        return [
            f"output_uri: {at} cannot be written ({e.strerror or e}); make it writable, or choose another output_uri"
        ]
    need, how = space_needed(p)
    if need and shutil.disk_usage(folder).free < need:
        return [
            f"output_uri: {at} has {free_space(folder)}, less than the {size_in_words(need)} the job needs at least: "
            f"{how}; free space there, or choose another output_uri"
        ]
    return []


def check_suites(p: Preflight) -> list[str]:
    """`evaluation.suites`: inspect-ai is installed, and each file exists and defines its task."""
    return suite_problems(p.spec)


# In order: a check may use what the ones before it found (the model's folder, the built rewards, the dataset rows).
CHECKS: tuple[Callable[[Preflight], list[str]], ...] = (
    check_model,
    check_causal_lm,
    check_architecture,
    check_lora_targets,
    check_output_root,
    check_rewards_build,
    check_dataset,
    check_validation_set,
    check_chat_template,
    check_context_length,
    check_chat_roles,
    check_agents,
    check_suites,
    check_rewards_dry_run,
)


def preflight(spec: JobSpec, warnings: list[str] | None = None, storage_options: dict | None = None) -> list[str]:
    """Runs every preflight check on a validated spec and returns all the problems found (empty: the job can start).

    Args:
        spec (`JobSpec`): the job spec, as `load_spec` returned it.
        warnings (`list[str]` or `None`, *optional*): where to append what is worth saying but no problem (a Hub
            model that will be downloaded).
        storage_options (`dict` or `None`, *optional*): fsspec options for a remote dataset (`s3://...`), as the
            ingest gets them.

    Returns:
        `list[str]`: one line per problem, each starting with the spec field it is about ("base_model: ...").
    """
    import datasets

    datasets.disable_progress_bars()  # a progress bar per check would drown the problems
    state = Preflight(spec, storage_options=storage_options or {})
    problems = [problem for check in CHECKS for problem in check(state)]
    if warnings is not None:
        warnings.extend(state.warnings)
    return problems


def main(argv: list[str]) -> int:
    try:
        spec, warnings = load_spec(argv[0], argv[1:])
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    problems = preflight(spec, warnings)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in problems:
        print(line, file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
