"""Where LoRA adapters go in a causal LM, read from its config alone: no weights are loaded.

The model is built on the meta device from its `config.json` (a 7B config takes well under a second) and PEFT's own
"all-linear" rule lists its Linear and Conv1D leaves, minus the output head: every attention and MLP projection,
whatever the architecture calls them (q/k/v/o_proj and gate/up/down_proj for Llama, c_attn/c_fc/c_proj for GPT-2,
query_key_value/dense/dense_h_to_4h/dense_4h_to_h for GPT-NeoX and Falcon, qkv_proj/gate_up_proj for Phi-3...).

A mixture-of-experts model (Qwen3-MoE, Mixtral, Llama 4, gpt-oss...) keeps its experts' projections as one stacked
3-D parameter per layer (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) rather than as Linear modules, so
"all-linear" never reaches them: those parameters are adapted through PEFT's `target_parameters` (one LoRA per
parameter, merged like any other). The router (`mlp.gate.weight`) is a 2-D parameter of its own module: it can be
named, it is not a default target.

    python -m grpoflow.trainers.model.architecture MODEL_PATH     # prints the model's default LoRA targets
"""

# torch, transformers and peft are imported inside the functions that use them: `grpoflow validate` imports this
# module.
import functools
import sys
from typing import NamedTuple

ALL_LINEAR = "all-linear"  # PEFT's INCLUDE_LINEAR_LAYERS_SHORTHAND


class ConfigUnavailable(OSError):
    """The model's config.json cannot be read here (a hub id not in the local cache while offline, say)."""


class Layout(NamedTuple):
    """What LoRA can adapt in one architecture, by full name."""

    model_type: str
    linear: tuple[str, ...]  # every Linear/Conv1D leaf but the output head (PEFT's "all-linear")
    heads: tuple[str, ...]  # the output head(s): linear, adapted only when named
    parameters: tuple[str, ...]  # matrices held by a module that is not a layer (experts, routers): target_parameters
    experts: tuple[str, ...]  # those of `parameters` stacked one matrix per expert (3-D): default targets


class LoraTargets(NamedTuple):
    """PEFT's `target_modules` and `target_parameters` for one job."""

    modules: list[str] | str
    parameters: list[str]


def _is_layer(module) -> bool:
    # A module PEFT adapts (or must leave alone) as a whole: torch's own layers, their subclasses (Falcon's Linear,
    # Gemma's scaled Embedding) and transformers' Conv1D; not a model's own containers of parameters.
    from torch.nn import Module
    from transformers.pytorch_utils import Conv1D

    mro = type(module).__mro__
    return isinstance(module, Conv1D) or any(c is not Module and c.__module__.startswith("torch.nn.") for c in mro)


def _free_parameters(model) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every matrix held directly by a module that is not a layer, those of them that are 3-D)."""
    found = [
        (f"{name}.{param_name}", param.ndim)
        for name, module in model.named_modules()
        if not _is_layer(module)
        for param_name, param in module.named_parameters(recurse=False)
        if param.ndim >= 2
    ]
    return tuple(sorted(n for n, _ in found)), tuple(sorted(n for n, ndim in found if ndim == 3))


@functools.cache
def _layout(model_path: str, local_only: bool) -> Layout:
    """The model's `Layout`, from a meta-device build of its config."""
    import torch
    from peft import LoraConfig, LoraModel
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=local_only)
    except (OSError, ValueError) as e:
        raise ConfigUnavailable(f"cannot read the config of {model_path!r}: {e}") from e
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    heads = tuple(name for name, module in model.named_modules() if head is not None and module is head)
    parameters, experts = _free_parameters(model)
    # PEFT's own "all-linear" rule, applied as get_peft_model applies it (last: it adds LoRA layers to the model).
    lora = LoraModel(
        model, LoraConfig(target_modules=ALL_LINEAR, task_type="CAUSAL_LM"), "default", low_cpu_mem_usage=True
    )
    return Layout(config.model_type, tuple(sorted(lora.targeted_module_names)), heads, parameters, experts)


def _suffixes(names) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name in names})


def _parameter_suffixes(names) -> list[str]:
    # A parameter by its module's last name and its own: "experts.gate_up_proj", "gate.weight".
    return sorted({".".join(name.split(".")[-2:]) for name in names})


def default_lora_targets(model_path: str, local_only: bool = False) -> list[str]:
    """The names LoRA adapts by default: every attention and MLP projection (PEFT's "all-linear" minus the output
    head) as the last component of their names, then a mixture of experts' stacked expert parameters.

    Args:
        model_path (`str`): a local model folder or a hub id (what `grpoflow.trainers.model.tiny.resolve_model_path`
            gives).
        local_only (`bool`, *optional*, defaults to `False`): read the config from local files only.

    Returns:
        `list[str]`: e.g. `["c_attn", "c_fc", "c_proj"]` for GPT-2, `["k_proj", "o_proj", "q_proj", "v_proj",
        "experts.down_proj", "experts.gate_up_proj"]` for Qwen3-MoE.

    Raises:
        `ConfigUnavailable`: the config cannot be read.
    """
    layout = _layout(model_path, local_only)
    return _suffixes(layout.linear) + _parameter_suffixes(layout.experts)


def _present(name: str, names: tuple[str, ...]) -> bool:
    # PEFT's matching of a list entry: the full name, or its tail after a dot.
    return any(full == name or full.endswith("." + name) for full in names)


def _owned(name: str, parameters: tuple[str, ...]) -> list[str]:
    # The parameters of the modules `name` matches, as target_parameters entries: "gate" -> ["gate.weight"].
    return sorted(
        {f"{name}.{full.rsplit('.', 1)[1]}" for full in parameters if _present(name, (full.rsplit(".", 1)[0],))}
    )


def resolve_lora_targets(model_path: str, requested: list[str] | str | None) -> LoraTargets:
    """PEFT's `target_modules` and `target_parameters` for the spec's `lora_target_modules`.

    Args:
        model_path (`str`): a local model folder or a hub id.
        requested (`list[str]`, `"all-linear"` or `None`): the spec's value; None means `default_lora_targets`.

    Returns:
        `LoraTargets`: names of Linear modules go to `modules`, names of a parameter (or of the module holding it,
        a router say) to `parameters`; `"all-linear"` is left to PEFT (which, on a transformers 5 mixture of experts,
        converts it to the linear modules, the experts and the router).
    """
    if isinstance(requested, str):
        return LoraTargets(requested, [])
    layout = _layout(model_path, False)
    if requested is None:
        return LoraTargets(_suffixes(layout.linear), _parameter_suffixes(layout.experts))
    modules = [name for name in requested if _present(name, layout.linear + layout.heads)]
    parameters = [name for name in requested if _present(name, layout.parameters)]
    parameters += [
        p for name in requested if name not in modules + parameters for p in _owned(name, layout.parameters)
    ]
    return LoraTargets(modules, parameters)


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
        layout = _layout(model_path, local_only)
    except ConfigUnavailable:
        return None
    if not layout.linear and not layout.parameters:
        return f"hyperparameters.lora_target_modules: this model ({layout.model_type}) has no linear modules for LoRA"
    if requested is None or isinstance(requested, str):
        return None
    # The output head is no default target, but PEFT adapts it when asked for by name.
    owners = tuple(full.rsplit(".", 1)[0] for full in layout.parameters)
    known = layout.linear + layout.heads + layout.parameters + owners
    missing = [name for name in requested if not _present(name, known)]
    if not missing:
        return None
    names = ", ".join(repr(name) for name in missing)
    available = f"its linear modules are {', '.join(_suffixes(layout.linear))}"
    if layout.parameters:
        available += f"; its expert and router parameters are {', '.join(_parameter_suffixes(layout.parameters))}"
    return f"hyperparameters.lora_target_modules: {names} not in this model ({layout.model_type}); {available}"


def untargeted_parameters(model_path: str, adapted: list[str]) -> list[str]:
    """The expert and router parameters of the model that no LoRA adapts (`adapted`: `adapter_summary`'s
    `lora_target_parameters`), by the names `_parameter_suffixes` gives; [] when the config cannot be read."""
    try:
        layout = _layout(model_path, True)
    except ConfigUnavailable:
        return []
    return [name for name in _parameter_suffixes(layout.parameters) if name not in adapted]


def adapter_summary(model) -> dict:
    """Which modules and parameters got LoRA adapters and how many parameters train, from the model the trainer holds.

    Args:
        model: a `PeftModel` (LoRA/QLoRA) or a plain `PreTrainedModel` (full fine-tune).

    Returns:
        `dict`: `lora_target_modules` (sorted names, None for a full fine-tune), `lora_target_parameters` (the
        parameters adapted through `target_parameters`, e.g. `experts.gate_up_proj`; None for a full fine-tune),
        `trainable_parameters`, `total_parameters` (PEFT's count, which counts a 4-bit weight's packed values).
    """
    if not hasattr(model, "get_nb_trainable_parameters"):
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        return {
            "lora_target_modules": None,
            "lora_target_parameters": None,
            "trainable_parameters": trainable,
            "total_parameters": total,
        }
    trainable, total = model.get_nb_trainable_parameters()
    parameters = getattr(model.base_model, "targeted_parameter_names", [])
    # A module holding an adapted parameter is listed among PEFT's targeted modules too: it is no module target.
    holders = {name.rsplit(".", 1)[0] for name in parameters}
    modules = [name for name in model.base_model.targeted_module_names if name not in holders]
    return {
        "lora_target_modules": _suffixes(modules),
        "lora_target_parameters": _parameter_suffixes(parameters),
        "trainable_parameters": trainable,
        "total_parameters": total,
    }


def adapter_line(summary: dict, model_path: str) -> str | None:
    """The training child's phase line saying exactly what LoRA adapts (in a mixture of experts, what it leaves)."""
    modules, parameters = summary.get("lora_target_modules"), summary.get("lora_target_parameters") or []
    if modules is None:
        return None
    line = f"LoRA adapters on {', '.join(modules) or 'no module'}"
    if parameters:
        line += f"; on the parameters {', '.join(parameters)} (PEFT target_parameters)"
    if left := untargeted_parameters(model_path, parameters):
        line += f"; not adapted: {', '.join(left)} (name them in lora_target_modules to adapt them)"
    return line


if __name__ == "__main__":
    from grpoflow.trainers.model.tiny import resolve_model_path

    print(", ".join(default_lora_targets(resolve_model_path(sys.argv[1]))))
