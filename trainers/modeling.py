"""Model-side glue shared by the SFT, GRPO, merge and evaluation stages: dtype, LoRA/QLoRA configs, tokenizer,
prompt formatting, and the checks for the optional accelerators (Unsloth, Liger)."""

import importlib.util

from trainers.tiny import resolve_model_path

# The attention and MLP projections of Llama/Qwen-style models (builtin:tiny's), which is what
# `trainers.architecture.default_lora_targets` finds for them; a job's targets come from its own architecture.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class SetupError(RuntimeError):
    """The job cannot run on this machine as specified (missing library, no CUDA); retrying will not help."""


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


def lora_targets(hp, model_path: str) -> list[str] | str:
    """The modules LoRA adapts in `model_path` (`lora_target_modules`, default: every attention and MLP projection).

    Raises:
        `SetupError`: a requested name is not in the model; the message names the modules it has.
    """
    from trainers.architecture import lora_target_problem, resolve_lora_targets

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

    return LoraConfig(
        r=hp.lora_rank,
        lora_alpha=hp.lora_alpha or hp.lora_rank,
        target_modules=lora_targets(hp, model_path),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )


def quantization_config(hp):
    """NF4 4-bit `BitsAndBytesConfig` for QLoRA jobs, else None."""
    if not hp.load_in_4bit:
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise SetupError("load_in_4bit needs bitsandbytes: pip install 'grpoflow[qlora]'")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch_dtype(),
        bnb_4bit_use_double_quant=True,
    )


def check_accelerators(hp) -> None:
    """Fails early, with what to do, when an opt-in accelerator cannot run here."""
    import torch

    for flag, package, extra in (("use_unsloth", "unsloth", "unsloth"), ("use_liger", "liger_kernel", "liger")):
        if not getattr(hp, flag):
            continue
        if not torch.cuda.is_available():
            raise SetupError(f"{flag}=true needs a CUDA GPU and none is visible; set {flag}: false to run here")
        if importlib.util.find_spec(package) is None:
            raise SetupError(f"{flag}=true needs the {package} package: pip install 'grpoflow[{extra}]'")


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
            target_modules=lora_targets(hp, model_path),
            lora_dropout=0.0,
            random_state=hp.seed,
        )
    return model, tokenizer


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model_path))
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


def prepare_prompts(dataset, prompt_column: str, system_prompt: str | None):
    """Renames the spec's prompt column to TRL's `prompt` and applies the system prompt."""
    if prompt_column != "prompt":
        if "prompt" in dataset.column_names:
            dataset = dataset.remove_columns("prompt")
        dataset = dataset.rename_column(prompt_column, "prompt")
    if system_prompt is not None:
        dataset = dataset.map(lambda row: {"prompt": to_prompt(row["prompt"], system_prompt)})
    return dataset


def start_model(spec, job) -> str:
    """The weights GRPO starts from: the SFT warm-up's output when it ran, else the base model."""
    if spec.sft.enabled and (job.sft / "config.json").exists():
        return str(job.sft)
    return resolve_model_path(spec.base_model)
