"""Model-side glue shared by the SFT, GRPO, merge and evaluation stages: dtype, LoRA/QLoRA configs, tokenizer,
prompt formatting, and the checks for the optional accelerators (Unsloth, Liger)."""

# torch, transformers, peft, datasets and the Hub's client are imported inside the functions that use them:
# `grpoflow validate` imports this module and loads no model.
import errno
import importlib.util
import json
import logging
import re
import shutil
import sys
import warnings
from pathlib import Path

from grpoflow.core.errors import SetupError
from grpoflow.core.outbound import call_within, deadline_s
from grpoflow.core.uris import is_local_model
from grpoflow.trainers.model.architecture import lora_target_problem, resolve_lora_targets
from grpoflow.trainers.model.hub import (
    HUB_CHECK_TIMEOUT_S,
    WEIGHT_FILES,
    cached_hub_file,
    hub_not_answering,
    hub_offline,
)
from grpoflow.trainers.model.tiny import resolve_model_path

# The attention and MLP projections of Llama/Qwen-style models (builtin:tiny's), which is what
# `grpoflow.trainers.model.architecture.default_lora_targets` finds for them; a job's targets come from its own
# architecture.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# --- library noise that says nothing a user can act on (every process that loads a model imports this module first)

# bitsandbytes, on a CPU with AVX512-BF16, looks for an optional kernel package at import and warns when it is absent;
# its own CPU path serves grpoflow's 4-bit loads, so each merge and training log would carry a false alarm.
_BNB_NO_KERNELS = "Failed to load CPU gemm_4bit_forward from kernels-community"
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(lambda record: _BNB_NO_KERNELS not in str(record.msg))
# PEFT reads transformers' deprecated `is_gradient_checkpointing` each time it wraps a model (the adapter of every
# merge, every training step's generation): a warning about PEFT's code, not the job's.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def quiet_progress_bars() -> None:
    """Turns off the progress bars of transformers ("Loading weights", "Writing model shards"), huggingface_hub and
    datasets, through their public switches, unless stderr is a terminal: in a log (a Prefect task's, a child's
    file) each bar is a run of carriage-return updates that says nothing afterwards. The training children get the
    same through their environment (`grpoflow.trainers.child.QUIET_ENV`)."""
    if sys.stderr.isatty():
        return
    import datasets
    import huggingface_hub.utils
    import transformers

    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    datasets.disable_progress_bars()


# --- where the model is, found without loading it (the preflight and the training children share these)


def hub_model_problem(model_id: str, field: str = "base_model") -> str | None:
    """Why the Hub model `model_id`, not in the local cache, cannot be downloaded from here, asked of the Hub once
    (its repo info, not its files): the Hub does not answer, no such model (or a private one the token cannot see),
    or a gated one the token has not been granted. None when it can be, or when the Hub's answer says nothing sure
    (the download then tells). Where `model_id` reads as a local path whose parent folder exists, says what is in it:
    a typo in a folder name looks like a Hub id."""
    from huggingface_hub import HfApi, constants, get_token
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    near = _folder_hint(model_id)
    if (refused := hub_not_answering()) is not None:
        return (
            f"{field}: {model_id!r} is {near}not in the local Hugging Face cache, and the Hub at {constants.ENDPOINT} "
            f"cannot be reached to download it ({type(refused).__name__}: {refused}); give a local model folder, "
            "or download it where the Hub is reachable (hf download)"
        )
    api = HfApi()
    # huggingface_hub's timeout bounds each read, not the answer: a Hub trickling bytes would hold validate.
    deadline = deadline_s(HUB_CHECK_TIMEOUT_S)
    try:
        gated = call_within(deadline, lambda: api.model_info(model_id, timeout=HUB_CHECK_TIMEOUT_S).gated)
    except RepositoryNotFoundError:
        return (
            f"{field}: {model_id!r} is {near}no model on the Hub at {constants.ENDPOINT} (or a private one this "
            "machine's token cannot see: HF_TOKEN)"
        )
    except (HfHubHTTPError, OSError):  # TimeoutError, the deadline, among them
        return None
    if not gated:
        return None
    try:
        if get_token() is not None:
            call_within(deadline, lambda: api.auth_check(model_id))
            return None
    except (GatedRepoError, RepositoryNotFoundError):
        pass
    except (HfHubHTTPError, OSError):
        return None
    return (
        f"{field}: {model_id!r} is a gated model: accept its terms on the Hub with the account whose token is in "
        "HF_TOKEN (or `hf auth login`)"
    )


def _folder_hint(model_id: str) -> str:
    """The words `no folder here (models/ holds: a, b), and ` when `model_id`'s parent is a local folder, else none."""
    parent = Path(model_id).expanduser().parent
    if str(parent) in ("", ".") or not parent.is_dir():
        return ""
    names = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))[:8]
    return f"no folder here ({parent}/ holds: {', '.join(names) or 'no folders'}), and "


def weights_size(model_path: str) -> str:
    """How much the model's weights weigh, e.g. "1.2 GB in 2 files", from a local folder or the Hugging Face cache;
    "not in the local cache: downloaded first" for a hub id that is not cached yet."""
    if is_local_model(model_path):
        folder = Path(model_path).expanduser()
    elif (config := cached_hub_file(model_path, "config.json")) is not None:
        folder = config.parent
    else:
        return "not in the local cache: downloaded first"
    files = [f for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern) if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    amount = f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{max(1, round(size / 1e6))} MB"
    return f"{amount} in {len(files)} file{'s' if len(files) != 1 else ''}"


def model_problem(model_id: str, field: str = "base_model") -> str | None:
    """Why the model `model_id` (a local folder or a Hub id) cannot be loaded here, found without loading it: a
    missing folder, a folder without config.json, or, offline, a Hub id whose config or weights are not in the local
    cache. None when it can be loaded (online, a Hub id not in the cache is downloaded)."""
    if is_local_model(model_id):
        path = Path(model_id).expanduser()
        if not path.exists():
            return f"{field}: {model_id} does not exist (a local model folder; a Hub model id is owner/name)"
        if not (path / "config.json").is_file():
            what = "is a file" if path.is_file() else "has no config.json"
            return f"{field}: {model_id} {what}: give a model folder saved with save_pretrained (it holds config.json)"
        return None
    if not hub_offline():
        return None
    if cached_hub_file(model_id, "config.json") is None:
        return (
            f"{field}: {model_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; download it "
            f"first (hf download {model_id}), unset HF_HUB_OFFLINE, or give a local model folder"
        )
    if not any(cached_hub_file(model_id, name) for name in WEIGHT_FILES):
        return f"{field}: {model_id!r} has its config but no weights in the local Hugging Face cache (HF_HUB_OFFLINE)"
    return None


def weights_problem(model_id: str, field: str = "base_model") -> str | None:
    """Why the local model folder `model_id` (which holds config.json) cannot be loaded: none of `WEIGHT_FILES` in it
    (a config and tokenizer saved without the model). None when it has weights, or is no local folder."""
    path = Path(model_id).expanduser()
    if not is_local_model(model_id) or not path.is_dir() or any((path / name).is_file() for name in WEIGHT_FILES):
        return None
    return (
        f"{field}: {model_id} holds config.json but no weights (looked for {', '.join(WEIGHT_FILES)}); give the "
        "folder the model's save_pretrained wrote, with its weights"
    )


def causal_lm_problem(
    config: dict, model_id: str, field: str = "base_model", source: str = "config.json"
) -> str | None:
    """Why the model whose config.json is `config` is not one GRPO can train: an encoder-decoder (T5, BART), or a
    model_type transformers' `AutoModelForCausalLM` does not load. None for a causal LM, or when config.json does
    not say (no model_type): transformers' own error then comes in the training child. `source` says where the
    config was read (a GGUF file's header gives one too)."""
    model_type, architectures = config.get("model_type"), config.get("architectures") or []
    names = ", ".join(str(name) for name in architectures) or f"model_type {model_type}"
    seq2seq = config.get("is_encoder_decoder") is True
    if not seq2seq:
        if not isinstance(model_type, str) or "AutoModelForCausalLM" in (config.get("auto_map") or {}):
            return None
        if architectures and all(str(name).endswith("ForCausalLM") for name in architectures):
            return None  # the usual case, told without importing transformers' model tables (and torch)
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return None
    what = "an encoder-decoder (seq2seq) model" if seq2seq else "not a causal language model"
    return (
        f"{field}: {model_id} is {names} ({source}), {what}; GRPO needs a causal LM, one transformers' "
        "AutoModelForCausalLM loads (decoder-only: Llama, Qwen, Mistral, GPT-2, ...)"
    )


def local_config(model_id: str) -> dict | None:
    """config.json of the model `model_id`, from its local folder or the local Hugging Face cache; None when it is
    not here or not a JSON object."""
    path = Path(model_id).expanduser() / "config.json" if is_local_model(model_id) else None
    path = path or cached_hub_file(model_id, "config.json")
    try:
        config = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def check_model(model_id: str) -> None:
    """Raises `SetupError` when the model cannot be loaded here (see `model_problem`, `weights_problem`) or is not a
    causal LM (`causal_lm_problem`), before a training child spends its imports and the trainer's setup on finding
    out."""
    config = local_config(model_id)
    problem = model_problem(model_id) or weights_problem(model_id)
    if problem or (config is not None and (problem := causal_lm_problem(config, model_id))):
        raise SetupError(problem)


def final_hub_error(error: BaseException) -> bool:
    """Whether a failed load from the Hub will fail again: no such repo, revision or file, a gated repo, an invalid
    id, or a cache miss while offline (a connection error online is transient)."""
    from huggingface_hub import errors

    final = (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.RemoteEntryNotFoundError)
    while error is not None:
        if isinstance(error, errors.LocalEntryNotFoundError):  # an EntryNotFoundError too, but local
            return hub_offline()
        if isinstance(error, (*final, errors.HFValidationError)):
            return True
        error = error.__cause__ or error.__context__
    return False


def setup_problem(error: BaseException, folder: Path | None = None) -> str | None:
    """The message of a training child's failure that a retry cannot cure (its exit code 2): a `SetupError`, a spec
    this machine rejects (a package it lacks), a model load from the Hub that will fail again (see
    `final_hub_error`), or a write into the job folder `folder` that failed for want of space or permission (see
    `write_problem`); None for a crash or a transient error."""
    from grpoflow.core.spec import SpecError

    if isinstance(error, SetupError):
        return str(error)
    if isinstance(error, SpecError):  # valid where it was validated, not here: a package of the spec's is missing
        return f"the job's spec.yaml is rejected on this machine: {'; '.join(error.problems)}"
    if isinstance(error, OSError) and final_hub_error(error):
        return f"base_model: {error}"
    return write_problem(error, folder) if folder is not None else None


# A write that fails the same way on every retry: the disk or the quota is full, or the folder cannot be written.
WRITE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
}
# How torch.save (its C++ stream) and safetensors (Rust) report a full disk, without an errno.
_DISK_FULL_WORDS = re.compile(r"iostream error|failed writing file|file write failed|StorageFull|No space left|quota")
LOW_SPACE_BYTES = 256 << 20  # below this, a library's write failure is read as the disk being full


def size_in_words(size: float) -> str:
    """A size in bytes as one reads it: "812.0 kB", "5.3 MB", "1.2 GB"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 1e3:.1f} kB"


def _disk_usage(path: Path):
    """`shutil.disk_usage` of `path`'s file system, read at its nearest existing parent."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path)


def free_space(path: Path) -> str:
    """`path`'s file system's free space in words ("1.2 GB free of 50.0 GB")."""
    usage = _disk_usage(path)
    return f"{size_in_words(usage.free)} free of {size_in_words(usage.total)}"


def write_problem(error: BaseException, folder: Path) -> str | None:
    """The one-line message of a write into `folder` (the job folder) that a retry would meet again: an OSError whose
    errno is in `WRITE_ERRNOS` on a path in it, or a library's write failure while its disk is (nearly) full. It names
    the path and the free space. None for any other error."""
    folder = Path(folder).absolute()
    fix = f"free space there (or make it writable), then resume: grpoflow run SPEC --resume {folder.name}"
    while error is not None:
        path = Path(error.filename).absolute() if isinstance(error, OSError) and error.filename else folder
        inside = path == folder or folder in path.parents
        if isinstance(error, OSError) and error.errno in WRITE_ERRNOS and inside:
            return f"output_uri: cannot write {path}: {WRITE_ERRNOS[error.errno]} ({free_space(path)}); {fix}"
        if _DISK_FULL_WORDS.search(str(error)) and _disk_usage(folder).free < LOW_SPACE_BYTES:
            return f"output_uri: cannot write into {folder}: the disk is full ({free_space(folder)}); {fix}"
        error = error.__cause__ or error.__context__
    return None


def chat_template_problem(model_id: str, chat_prompts: bool, system_prompt: str | None) -> str | None:
    """The problem of a tokenizer without a chat template, for these prompts; None when they need none."""
    fix = "use a model whose tokenizer has one (a chat or instruct model), or add one to its tokenizer_config.json"
    if system_prompt is not None:
        return (
            f"hyperparameters.system_prompt: set, so each prompt is rendered as a system + user chat, but the "
            f"tokenizer of {model_id} has no chat template; remove system_prompt (with string prompts), or {fix}"
        )
    if chat_prompts:
        return (
            f"dataset.prompt_column: the prompts are chats (lists of messages), but the tokenizer of {model_id} has "
            f"no chat template to render them; give string prompts, or {fix}"
        )
    return None


def check_chat_template(tokenizer, dataset, system_prompt: str | None, model_id: str) -> None:
    """Raises `SetupError` when TRL would render `dataset`'s prompts (as prepared) through a chat template that
    `tokenizer` lacks: transformers' own error comes only after the model has loaded."""
    chat_prompts = len(dataset) > 0 and isinstance(dataset[0]["prompt"], list)
    if chat_prompts and tokenizer.chat_template is None:
        raise SetupError(chat_template_problem(model_id, chat_prompts, system_prompt))


def use_bf16() -> bool:
    import torch  # here, not at the top: the pipeline process imports this module and never needs torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def use_cpu(gpu_count: int) -> bool:
    """True for a several-process run without CUDA (`gpu_count > 1` on a CPU machine, e.g. a test): transformers
    joins `accelerate launch`'s processes into one gloo group only when told it runs on CPU."""
    import torch

    return gpu_count > 1 and not torch.cuda.is_available()


def torch_dtype():
    """`torch.bfloat16` where the GPU supports it, else `torch.float32`."""
    import torch

    return torch.bfloat16 if use_bf16() else torch.float32


def lora_targets(hp, model_path: str):
    """The modules and parameters LoRA adapts in `model_path` (`lora_target_modules`, default: every attention and
    MLP projection, a mixture of experts' expert parameters too): a `LoraTargets`.

    Raises:
        `SetupError`: a requested name is not in the model; the message names the modules it has.
    """
    targets = resolve_lora_targets(model_path, hp.lora_target_modules)
    # In the training child the config may be fetched (a hub id on a worker): the model itself is loaded next.
    if problem := lora_target_problem(model_path, hp.lora_target_modules, local_only=False):
        raise SetupError(problem)
    return targets


def lora_config(hp, model_path: str):
    """A PEFT `LoraConfig` for the spec's hyperparameters on the model at `model_path`, or None for a full
    fine-tune. Raises `SetupError` when `lora_target_modules` names a module the model lacks."""
    if hp.lora_rank is None:
        return None
    from peft import LoraConfig

    targets = lora_targets(hp, model_path)
    return LoraConfig(
        r=hp.lora_rank,
        lora_alpha=hp.lora_alpha or hp.lora_rank,
        target_modules=targets.modules,
        target_parameters=targets.parameters or None,
        lora_dropout=0.0,  # PEFT's target_parameters requires 0
        task_type="CAUSAL_LM",
    )


def quantization_config(hp):
    """NF4 4-bit `BitsAndBytesConfig` for QLoRA jobs, else None."""
    if not hp.load_in_4bit:
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise SetupError("hyperparameters.load_in_4bit: needs bitsandbytes: pip install 'grpoflow[qlora]'")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch_dtype(),
        bnb_4bit_use_double_quant=True,
    )


def needs_cuda(spec) -> bool:
    """Whether the spec asks for something that runs only on a CUDA GPU (what `check_accelerators` checks)."""
    hp = spec.hyperparameters
    return hp.use_unsloth or hp.use_liger or spec.generation.engine == "vllm" or spec.distributed.strategy != "ddp"


def check_accelerators(spec) -> None:
    """Fails early, with what to do, when an opt-in accelerator, the rollout engine or the distributed strategy
    cannot run here (no CUDA, a package missing): a setup problem, exit 2, never retried."""
    import torch

    hp, cuda = spec.hyperparameters, torch.cuda.is_available()
    for flag, package, extra in (("use_unsloth", "unsloth", "unsloth"), ("use_liger", "liger_kernel", "liger")):
        if not getattr(hp, flag):
            continue
        if not cuda:
            raise SetupError(f"{flag}=true needs a CUDA GPU and none is visible; set {flag}: false to run here")
        if importlib.util.find_spec(package) is None:
            raise SetupError(f"{flag}=true needs the {package} package: pip install 'grpoflow[{extra}]'")
    needs = []
    if spec.generation.engine == "vllm":
        needs.append(("generation.engine", "vllm", "vllm", "use engine: transformers or paged"))
    strategy = spec.distributed.strategy
    if strategy in ("zero2", "zero3"):
        needs.append(("distributed.strategy", strategy, "deepspeed", "use ddp"))
    if strategy == "fsdp2" and not cuda:
        # accelerate (1.15) runs FSDP on accelerators only: several CPU processes become plain data parallel
        # (MULTI_CPU), which would train without the sharding asked for.
        raise SetupError(
            "distributed.strategy: fsdp2 needs CUDA GPUs and none is visible (accelerate runs several CPU processes "
            "as plain data parallel, never sharded); use ddp to run here"
        )
    for field, value, package, instead in needs:
        if not cuda:
            raise SetupError(f"{field}: {value} needs a CUDA GPU and none is visible; {instead} to run here")
        if importlib.util.find_spec(package) is None:
            raise SetupError(f"{field}: {value} needs the {package} package: pip install 'grpoflow[{package}]'")


def load_unsloth(model_path: str, hp):
    """Loads the model through Unsloth (`use_unsloth`), LoRA-wrapped when lora_rank is set; returns (model, tokenizer).

    Unsloth sizes its context window from max_prompt_length + max_response_length, which is why the spec accepts
    max_prompt_length only together with use_unsloth.
    """
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=model_path,
        max_seq_length=hp.max_prompt_length + hp.max_response_length,
        load_in_4bit=hp.load_in_4bit,
        dtype=None,
    )
    if hp.lora_rank is not None:
        model = FastLanguageModel.get_peft_model(
            model,
            r=hp.lora_rank,
            lora_alpha=hp.lora_alpha or hp.lora_rank,
            target_modules=lora_targets(hp, model_path).modules,  # the log says what Unsloth's wrap adapted
            lora_dropout=0.0,
            random_state=hp.seed,
        )
    return model, tokenizer


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    model_path = resolve_model_path(model_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except OSError as e:
        if not final_hub_error(e):
            raise
        raise SetupError(f"base_model: cannot load {model_path}: {e}") from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def to_prompt(value, system_prompt: str | None):
    """Returns the prompt TRL should see: a string as is, or a chat (list of messages) with the system prompt.

    A string prompt with a system prompt becomes a system + user chat, so the model's chat template applies.
    A chat prompt gets the system message prepended unless it already starts with one.
    """
    if system_prompt is None:
        return value
    if isinstance(value, str):
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": value}]
    if value and value[0].get("role") == "system":
        return value
    return [{"role": "system", "content": system_prompt}, *value]


def openai_roles(messages: list[dict]) -> list[dict]:
    """A chat with OpenAI's `developer` role (its name for the system role since o1) as `system`, the role model chat
    templates know (Qwen's drops a message of a role it does not know, silently).

    >>> openai_roles([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "2+2?"}])[0]["role"]
    'system'
    """
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


def prepare_prompts(dataset, prompt_column: str, system_prompt: str | None):
    """Renames the spec's prompt column to TRL's `prompt`, reads OpenAI's `developer` role as `system`, and applies
    the system prompt."""
    if prompt_column != "prompt":
        if "prompt" in dataset.column_names:
            dataset = dataset.remove_columns("prompt")
        dataset = dataset.rename_column(prompt_column, "prompt")
    if _has_developer_role(dataset):
        dataset = dataset.map(lambda row: {"prompt": openai_roles(row["prompt"])})
    if system_prompt is not None:
        dataset = dataset.map(lambda row: {"prompt": to_prompt(row["prompt"], system_prompt)})
    return dataset


def _has_developer_role(dataset) -> bool:
    import pyarrow.compute as pc

    column = dataset.data.column("prompt")
    if not hasattr(column.type, "value_type"):  # text prompts
        return False
    roles = pc.struct_field(pc.list_flatten(column), "role")
    return bool(pc.any(pc.equal(roles, "developer")).as_py())


def start_model(spec, job) -> str:
    """The weights GRPO starts from: the SFT warm-up's output when it ran, else the base model."""
    if spec.sft.enabled and (job.sft / "config.json").exists():
        return str(job.sft)
    return resolve_model_path(spec.base_model)
