"""Where LoRA adapters go in a causal LM, read from its config alone: no weights are loaded.

The model is built on the meta device from its `config.json` (a 7B config takes well under a second) and PEFT's own
"all-linear" rule lists its Linear and Conv1D leaves, minus the output head: every attention and MLP projection,
whatever the architecture calls them (q/k/v/o_proj and gate/up/down_proj for Llama, c_attn/c_fc/c_proj for GPT-2,
query_key_value/dense/dense_h_to_4h/dense_4h_to_h for GPT-NeoX and Falcon, qkv_proj/gate_up_proj for Phi-3...).

    python -m grpoflow.trainers.architecture MODEL_PATH     # prints the model's default LoRA targets
"""

import functools
import sys

ALL_LINEAR = "all-linear"  # PEFT's INCLUDE_LINEAR_LAYERS_SHORTHAND


class ConfigUnavailable(OSError):
    """The model's config.json cannot be read here (a hub id not in the local cache while offline, say)."""


@functools.cache
def _linear_modules(model_path: str, local_only: bool) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(model_type, full names of every Linear/Conv1D leaf but the output head, the output head's name), from a
    meta-device build."""
    import torch
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=local_only)
    except (OSError, ValueError) as e:
        raise ConfigUnavailable(f"cannot read the config of {model_path!r}: {e}") from e
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # PEFT's rule, exactly as get_peft_model applies it to target_modules="all-linear".
    probe = _maybe_include_all_linear_layers(LoraConfig(target_modules=ALL_LINEAR, task_type="CAUSAL_LM"), model)
    head = model.get_output_embeddings()
    heads = tuple(name for name, module in model.named_modules() if head is not None and module is head)
    return config.model_type, tuple(sorted(probe.target_modules)), heads


def _suffixes(names) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name in names})


def default_lora_targets(model_path: str, local_only: bool = False) -> list[str]:
    """The module names LoRA adapts by default: every attention and MLP projection (PEFT's "all-linear" minus the
    output head), as the last component of their names.

    Args:
        model_path (`str`): a local model folder or a hub id (what `grpoflow.trainers.tiny.resolve_model_path` gives).
        local_only (`bool`, *optional*, defaults to `False`): read the config from local files only.

    Returns:
        `list[str]`: sorted names, e.g. `["c_attn", "c_fc", "c_proj"]` for GPT-2.

    Raises:
        `ConfigUnavailable`: the config cannot be read.
    """
    return _suffixes(_linear_modules(model_path, local_only)[1])


def resolve_lora_targets(model_path: str, requested: list[str] | str | None) -> list[str] | str:
    """PEFT's `target_modules` for the spec's `lora_target_modules`.

    Args:
        model_path (`str`): a local model folder or a hub id.
        requested (`list[str]`, `"all-linear"` or `None`): the spec's value; None means `default_lora_targets`.

    Returns:
        `list[str] | str`: the default names, the requested list as is, or `"all-linear"` for PEFT to expand.
    """
    if requested is None:
        return default_lora_targets(model_path)
    return list(requested) if not isinstance(requested, str) else requested


def _present(name: str, modules: tuple[str, ...]) -> bool:
    # PEFT's matching of a list entry: the module's full name, or its tail after a dot.
    return any(module == name or module.endswith("." + name) for module in modules)


def lora_target_problem(model_path: str, requested: list[str] | str | None, local_only: bool = True) -> str | None:
    """Why `lora_target_modules` cannot work on this model, as one line naming the field; None when it can, or when
    the model's config cannot be read offline (the run then reports the model itself).

    Args:
        model_path (`str`): a local model folder or a hub id.
        requested (`list[str]`, `"all-linear"` or `None`): the spec's value.
        local_only (`bool`, *optional*, defaults to `True`): never download the config (validate-time checks).

    Returns:
        `str | None`: e.g. "hyperparameters.lora_target_modules: 'q_proj' not in this model (gpt2); its linear modules
        are c_attn, c_fc, c_proj".
    """
    try:
        model_type, modules, heads = _linear_modules(model_path, local_only)
    except ConfigUnavailable:
        return None
    available = ", ".join(_suffixes(modules))
    if not modules:
        return f"hyperparameters.lora_target_modules: this model ({model_type}) has no linear modules for LoRA"
    if requested is None or isinstance(requested, str):
        return None
    # The output head is no default target, but PEFT adapts it when asked for by name.
    missing = [name for name in requested if not _present(name, modules + heads)]
    if not missing:
        return None
    names = ", ".join(repr(name) for name in missing)
    return (
        f"hyperparameters.lora_target_modules: {names} not in this model ({model_type}); "
        f"its linear modules are {available}"
    )


def adapter_summary(model) -> dict:
    """Which modules got LoRA adapters and how many parameters train, from the model the trainer holds.

    Args:
        model: a `PeftModel` (LoRA/QLoRA) or a plain `PreTrainedModel` (full fine-tune).

    Returns:
        `dict`: `lora_target_modules` (sorted names, None for a full fine-tune), `trainable_parameters`,
        `total_parameters` (PEFT's count, which counts a 4-bit weight's packed values).
    """
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        targets = _suffixes(model.base_model.targeted_module_names)
    else:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        targets = None
    return {"lora_target_modules": targets, "trainable_parameters": trainable, "total_parameters": total}


if __name__ == "__main__":
    from grpoflow.trainers.tiny import resolve_model_path

    print(", ".join(default_lora_targets(resolve_model_path(sys.argv[1]))))
