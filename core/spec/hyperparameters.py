"""The GRPO hyperparameters of a job spec: names, defaults and rules, each field's type carrying the trl.GRPOConfig
fields it sets (`TRL`) or saying that only grpoflow reads it (`GRPOFLOW_ONLY`)."""

import importlib.util
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    field_validator,
)

from grpoflow.core.spec.fields import (
    MAX_SEED,
    MIN_TEMPERATURE,
    Int,
    Section,
    no_form_default,
)
from grpoflow.core.spec.rules import (
    GRPOFLOW_ONLY,
    TRL,
)


class Hyperparameters(Section):
    """The GRPO hyperparameters: names, defaults and rules are the contract. Each one's type carries the
    trl.GRPOConfig fields it sets (`TRL`), or says that only grpoflow reads it (`GRPOFLOW_ONLY`)."""

    learning_rate: Annotated[float, TRL("learning_rate")] = Field(
        1e-6, gt=0, description="Optimizer learning rate, sized for full fine-tuning; LoRA wants ~2e-5."
    )
    num_epochs: Annotated[Int, GRPOFLOW_ONLY] = Field(
        1, ge=1, description="Accepted with a warning but unused by GRPO: the run length is max_steps."
    )
    max_steps: Annotated[Int, TRL("max_steps", also=("num_train_epochs",))] = Field(
        100,
        ge=1,
        description="Training steps; one step is one prompt and its rollouts_per_prompt completions (prompts_per_step "
        "prompts when set), so one pass over N prompts is N steps (N / prompts_per_step).",
    )
    rollouts_per_prompt: Annotated[Int, TRL("num_generations")] = Field(
        8,
        ge=2,
        description="Completions sampled per prompt: the GRPO group (TRL's num_generations); a group of one has no "
        "baseline. rollouts_per_prompt * prompts_per_step must be a multiple of gpu_count.",
    )
    prompts_per_step: Annotated[
        Int, TRL("per_device_train_batch_size", "gradient_accumulation_steps", copied=False)
    ] = Field(
        1,
        ge=1,
        description="Prompts (groups) per optimizer step: each step trains on K = rollouts_per_prompt * "
        "prompts_per_step completions, K / gpu_count per GPU (TRL's per_device_train_batch_size), generated together. "
        "1 keeps one step = one prompt and its rollouts_per_prompt completions.",
    )
    kl_coef: Annotated[float, TRL("beta")] = Field(
        0.0,
        ge=0,
        description="KL penalty weight (TRL's beta); 0 means no KL term, no reference model loaded and no kl metric.",
    )
    max_prompt_length: Annotated[Int, TRL(also=("max_prompt_length",))] = Field(
        1024,
        ge=1,
        description="Prompt truncation length, only with use_unsloth (TRL's GRPO does not truncate prompts); "
        "setting it without use_unsloth is rejected.",
        # The Prefect form fills in every default it is shown, and this field's mere presence is rejected without
        # use_unsloth: the form shows no default (the spec's stays 1024).
        json_schema_extra=no_form_default,
    )
    max_response_length: Annotated[Int, TRL("max_completion_length")] = Field(
        2048, ge=1, description="Completions are truncated to this many tokens (TRL's max_completion_length)."
    )
    global_batch_size: Annotated[Int | None, GRPOFLOW_ONLY] = Field(
        None,
        description="Not supported by GRPO, setting it is rejected: a step's batch is prompts_per_step prompts' "
        "groups of rollouts_per_prompt completions; set prompts_per_step.",
    )
    seed: Annotated[int, TRL("seed", "data_seed")] = Field(
        42, ge=0, le=MAX_SEED, description="Random seed: the same seed, data and machine give the same metrics."
    )
    system_prompt: Annotated[str | None, GRPOFLOW_ONLY] = Field(
        None,
        description="When set, each string prompt becomes a system + user chat through the model's chat template.",
    )
    lora_rank: Annotated[Int | None, GRPOFLOW_ONLY] = Field(
        None,
        ge=1,
        description="LoRA rank, for LoRA on every attention and MLP projection of the model's architecture (or "
        "lora_target_modules); null means a full fine-tune.",
    )
    lora_alpha: Annotated[Int | None, GRPOFLOW_ONLY] = Field(
        None, ge=1, description="LoRA alpha; null means lora_rank. Requires lora_rank."
    )
    lora_target_modules: Annotated[list[str] | Literal["all-linear"] | None, GRPOFLOW_ONLY] = Field(
        None,
        description="The modules that get LoRA adapters: null means every attention and MLP projection, whatever the "
        "architecture names them (q_proj... for Llama, c_attn/c_fc/c_proj for GPT-2: every linear layer but the "
        "output head; in a mixture of experts also the stacked expert parameters, e.g. experts.gate_up_proj and "
        "experts.down_proj, through PEFT target_parameters); or a list of module or parameter names (a name matches "
        "each whose name ends with it; a router such as gate is adapted only when named); or "
        '"all-linear" (as PEFT expands it: the linear modules; in a transformers 5 mixture of experts PEFT adds the '
        "experts and the router). A name the model lacks is rejected, naming those it "
        "has. Requires lora_rank.",
    )
    load_in_4bit: Annotated[bool, GRPOFLOW_ONLY] = Field(
        False, description="QLoRA: an NF4 base (bitsandbytes) plus LoRA adapters; requires lora_rank, single GPU only."
    )
    use_unsloth: Annotated[bool, GRPOFLOW_ONLY] = Field(
        False, description="Train with Unsloth (opt-in); single GPU only."
    )
    use_liger: Annotated[bool, TRL("use_liger_kernel")] = Field(
        False,
        description="Liger kernels (opt-in); rejected with gpu_count > 1, with use_unsloth, and for GPT-NeoX/Pythia, "
        "Gemma 2, Cohere and Granite models (wrong log-probs).",
    )
    temperature: Annotated[float, TRL("temperature")] = Field(
        1.0,
        ge=MIN_TEMPERATURE,
        description="Sampling temperature of the rollouts. Near 0 sampling is greedy: a group's completions are all "
        "alike and GRPO has nothing to compare (from ~1e-38 down, the logits divided by it overflow to inf/NaN).",
    )
    skip_zero_variance_groups: Annotated[bool, GRPOFLOW_ONLY] = Field(
        False,
        description=(
            "Skip the forward/backward pass and optimizer step of steps whose completions all got the same reward "
            "(all advantages 0: no gradient when kl_coef = 0; no effect otherwise). Parameters and Adam state stay "
            "unchanged on a skipped step, where plain TRL still moves them by momentum; the LR schedule advances."
        ),
    )

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _module_names(cls, value: Any) -> Any:
        # One message per shape, instead of one per member of the union.
        if value is None or value == "all-linear":
            return value
        if not isinstance(value, list):
            raise ValueError('must be a list of module names, "all-linear", or null for every projection')
        if not value:
            raise ValueError("must name at least one module (or be null for every attention and MLP projection)")
        if not all(isinstance(name, str) and name.strip() for name in value):
            raise ValueError("each module name must be a non-empty string")
        return value

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature_floor(cls, value: Any) -> Any:
        # Before the field's own bound, so that the message says why (1e-300 was accepted and broke sampling).
        if isinstance(value, int | float) and not isinstance(value, bool) and value < MIN_TEMPERATURE:
            raise ValueError(
                f"must be >= {MIN_TEMPERATURE:g}: near 0 sampling is greedy, so every completion of a group is the "
                "same and GRPO has nothing to compare, and from ~1e-38 down the logits divided by it overflow to "
                "inf/NaN (TRL's default is 1.0)"
            )
        return value

    @field_validator("load_in_4bit")
    @classmethod
    def _bitsandbytes_installed(cls, value: bool) -> bool:
        # As tracking.report_to's trackers: without the package, QLoRA would only fail once the model loads.
        if value and not importlib.util.find_spec("bitsandbytes"):
            raise ValueError("needs the bitsandbytes package, which is not installed: pip install 'grpoflow[qlora]'")
        return value

    @field_validator("global_batch_size", mode="before")
    @classmethod
    def _no_global_batch_size(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "not supported by GRPO: a step's batch is groups of rollouts_per_prompt completions; set "
                "hyperparameters.prompts_per_step (prompts per optimizer step) instead"
            )
