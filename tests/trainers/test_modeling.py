"""Model-side glue: LoRA and QLoRA configs, the accelerator checks, prompt formatting, and where GRPO starts from."""

import shutil

import pytest
import torch
from datasets import Dataset
from peft import get_peft_model
from transformers import AutoModelForCausalLM

from grpoflow.core.errors import SetupError
from grpoflow.core.spec import load_spec
from grpoflow.trainers.model.load import (
    LORA_TARGETS,
    check_accelerators,
    load_tokenizer,
    lora_config,
    prepare_prompts,
    quantization_config,
    start_model,
    to_prompt,
    torch_dtype,
    use_cpu,
)
from grpoflow.trainers.model.tiny import build_tiny, build_tokenizer

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")


def spec_with(**hyperparameters):
    spec, _ = load_spec(
        {
            "name": "m",
            "base_model": "builtin:tiny",
            "dataset": {"uri": "d.jsonl"},
            "rewards": [{"name": "exact_answer"}],
            "hyperparameters": hyperparameters,
        }
    )
    return spec


def test_full_finetune_has_no_lora_or_quantization():
    hp = spec_with().hyperparameters
    assert lora_config(hp, str(build_tiny())) is None and quantization_config(hp) is None


@pytest.mark.parametrize(
    "hyperparameters, r, alpha, targets",
    [
        ({"lora_rank": 8}, 8, 8, LORA_TARGETS),  # lora_alpha defaults to lora_rank; the architecture's projections
        ({"lora_rank": 8, "lora_alpha": 32}, 8, 32, LORA_TARGETS),  # or as given
        ({"lora_rank": 8, "lora_target_modules": ["q_proj", "v_proj"]}, 8, 8, ["q_proj", "v_proj"]),  # as listed
        ({"lora_rank": 8, "lora_target_modules": ["self_attn.o_proj"]}, 8, 8, ["self_attn.o_proj"]),  # a dotted tail
        ({"lora_rank": 8, "lora_target_modules": "all-linear"}, 8, 8, "all-linear"),  # PEFT expands it
    ],
)
def test_lora_config(hyperparameters, r, alpha, targets):
    config = lora_config(spec_with(**hyperparameters).hyperparameters, str(build_tiny()))
    assert (config.r, config.lora_alpha, config.lora_dropout, config.task_type) == (r, alpha, 0.0, "CAUSAL_LM")
    assert config.target_modules == (set(targets) if isinstance(targets, list) else targets)


@pytest.mark.parametrize(
    "names, message",
    [
        # A name from another architecture (GPT-2's), with the names this one has.
        (["c_attn"], "'c_attn' not in this model (qwen2); its linear modules are " + ", ".join(sorted(LORA_TARGETS))),
        (["q_proj", "qkv_proj", "fc1"], "'qkv_proj', 'fc1' not in this model (qwen2)"),  # every missing name, once
        (["input_layernorm"], "'input_layernorm' not in this model"),  # a module, but not a linear one
    ],
)
def test_a_missing_lora_target_is_a_setup_error(names, message):
    with pytest.raises(SetupError) as caught:
        lora_config(spec_with(lora_rank=4, lora_target_modules=names).hyperparameters, str(build_tiny()))
    assert str(caught.value).startswith("hyperparameters.lora_target_modules: ") and message in str(caught.value)


def test_lora_adapts_every_attention_and_mlp_projection():
    model = AutoModelForCausalLM.from_pretrained(build_tiny())
    layers = model.config.num_hidden_layers
    peft_model = get_peft_model(model, lora_config(spec_with(lora_rank=4).hyperparameters, str(build_tiny())))
    adapted = {name.split(".lora_A")[0] for name, _ in peft_model.named_parameters() if ".lora_A" in name}
    assert len(adapted) == layers * len(LORA_TARGETS)  # q/k/v/o and gate/up/down in every layer
    assert {name.rsplit(".", 1)[-1] for name in adapted} == set(LORA_TARGETS)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)  # the base stays frozen


def test_qlora_is_nf4_with_double_quantization():
    pytest.importorskip("bitsandbytes")
    config = quantization_config(spec_with(lora_rank=8, load_in_4bit=True).hyperparameters)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch_dtype()


@no_cuda
@pytest.mark.parametrize(
    "hyperparameters, message",
    [
        ({"use_liger": True}, "use_liger=true needs a CUDA GPU and none is visible; set use_liger: false to run here"),
        (
            {"use_unsloth": True},
            "use_unsloth=true needs a CUDA GPU and none is visible; set use_unsloth: false to run here",
        ),
    ],
)
def test_accelerators_without_cuda_are_a_setup_error(hyperparameters, message):
    with pytest.raises(SetupError) as caught:
        check_accelerators(spec_with(**hyperparameters))
    assert str(caught.value) == message


def test_no_accelerator_asked_for_passes():
    assert check_accelerators(spec_with()) is None


@no_cuda
def test_cpu_answers():
    assert torch_dtype() is torch.float32  # no bf16 without a GPU
    assert use_cpu(2) is True  # several processes on a CPU machine: accelerate's gloo group
    assert use_cpu(1) is False  # one process picks its device itself


SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "2+3?"}


@pytest.mark.parametrize(
    "value, system_prompt, expected",
    [
        ("2+3?", None, "2+3?"),  # no system prompt: a string stays a string
        ([USER], None, [USER]),  # and a chat stays the chat
        ("2+3?", "Be brief.", [SYSTEM, USER]),  # a string with a system prompt becomes a system + user chat
        ([USER], "Be brief.", [SYSTEM, USER]),  # a chat gets the system message first
        ([{"role": "system", "content": "Mine."}, USER], "Be brief.", [{"role": "system", "content": "Mine."}, USER]),
        # a chat that has a system message keeps its own
    ],
)
def test_to_prompt(value, system_prompt, expected):
    assert to_prompt(value, system_prompt) == expected


def test_prepare_prompts_renames_the_prompt_column():
    rows = Dataset.from_list([{"question": "2+3?", "prompt": "stale", "answer": "5"}])
    out = prepare_prompts(rows, "question", None)
    assert out.column_names == ["prompt", "answer"] and out[0]["prompt"] == "2+3?"  # the spec's column wins


def test_prepare_prompts_applies_the_system_prompt():
    out = prepare_prompts(Dataset.from_list([{"prompt": "2+3?"}]), "prompt", "Be brief.")
    assert out[0]["prompt"] == [SYSTEM, USER]


def test_start_model(tmp_path, make_job):
    job, spec = make_job("s", sft={"enabled": True})
    assert start_model(spec, job) == str(build_tiny())  # the warm-up has not run (yet): the base
    shutil.copytree(build_tiny(), job.sft)
    assert start_model(spec, job) == str(job.sft)  # after it ran: its output
    off = spec.model_copy(update={"sft": spec.sft.model_copy(update={"enabled": False})})
    assert start_model(off, job) == str(build_tiny())  # an sft/ left by an earlier spec is not used


def test_load_tokenizer_pads_with_eos_when_it_has_no_pad_token(tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"
    assert load_tokenizer("builtin:tiny").pad_token == "<|endoftext|>"  # its own pad token is kept
