"""Tiny causal LMs of many architectures, built offline from their transformers configs, for any test.

Each is a random model at a tiny size (hidden 32-64, 2 layers, a vocabulary of ~400) with a tokenizer of the kind its
family ships, trained here in milliseconds with the `tokenizers` library: byte-level BPE (GPT-2, GPT-NeoX, Falcon,
Phi, OPT, Qwen, OLMo, Granite, StableLM, StarCoder2, BLOOM) or SentencePiece-style BPE with byte fallback and a
leading BOS (Llama, Mistral, Phi-3, Gemma). Models are built once per test session into a temporary folder:

    from tests.architectures import tiny_model
    path = tiny_model("gpt2")          # a folder that AutoModelForCausalLM / AutoTokenizer load

`ARCHITECTURES` maps each name to its config (model_type and tiny sizes) and its tokenizer's special tokens.
"""

import atexit
import functools
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# A corpus the tokenizers learn their merges from: the test prompts' words and digits, some English.
CORPUS = [f"What is {a}+{b}? The answer is {a + b}." for a in range(10) for b in range(10)] + [
    "The quick brown fox jumps over the lazy dog.",
    "Reward functions score completions; the policy learns from the group's advantages.",
]

GPT2_SPECIALS = {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}
LLAMA_SPECIALS = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}


@dataclass(frozen=True)
class Architecture:
    model_type: str
    config: dict  # the tiny sizes, in this config class's own names
    tokenizer: str = "bytelevel"  # "bytelevel" or "sentencepiece"
    specials: dict = field(default_factory=lambda: dict(GPT2_SPECIALS))
    pad: str | None = None  # a pad token of its own; None: the tokenizer has none (training pads with eos)


_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

ARCHITECTURES = {
    "gpt2": Architecture("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    "gpt_neox": Architecture(
        "gpt_neox", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    ),
    "falcon": Architecture("falcon", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)),
    "phi": Architecture(
        "phi", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    ),
    "phi3": Architecture(
        "phi3",
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
        "sentencepiece",
        {**LLAMA_SPECIALS, "eos": "<|endoftext|>"},
        pad="<|endoftext|>",
    ),
    "opt": Architecture(
        "opt",
        dict(hidden_size=64, word_embed_proj_dim=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4),
        specials={"bos": "</s>", "eos": "</s>"},
        pad="<pad>",
    ),
    "llama": Architecture("llama", _LLAMA, "sentencepiece", LLAMA_SPECIALS),
    "mistral": Architecture("mistral", _LLAMA, "sentencepiece", LLAMA_SPECIALS),
    "gemma": Architecture(
        "gemma", {**_LLAMA, "head_dim": 16}, "sentencepiece", {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}, "<pad>"
    ),
    "gemma2": Architecture(
        "gemma2",
        {**_LLAMA, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64},
        "sentencepiece",
        {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>"},
        "<pad>",
    ),
    "qwen2": Architecture("qwen2", _LLAMA, specials={"eos": "<|endoftext|>"}, pad="<|endoftext|>"),
    "qwen3": Architecture("qwen3", {**_LLAMA, "head_dim": 16}, specials={"eos": "<|im_end|>"}, pad="<|endoftext|>"),
    # More families a user is likely to bring, as cheap as the above.
    "granite": Architecture("granite", _LLAMA),
    "stablelm": Architecture("stablelm", _LLAMA),
    "olmo2": Architecture("olmo2", _LLAMA, pad="<|padding|>"),
    "starcoder2": Architecture(
        "starcoder2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    ),
    "bloom": Architecture("bloom", dict(hidden_size=64, n_layer=2, n_head=4), pad="<pad>"),
    # Mixtures of experts: each layer's experts are stacked 3-D parameters, not Linear modules.
    "qwen3_moe": Architecture(
        "qwen3_moe",
        {**_LLAMA, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
        specials={"eos": "<|im_end|>"},
        pad="<|endoftext|>",
    ),
    "mixtral": Architecture(
        "mixtral", {**_LLAMA, "num_local_experts": 4, "num_experts_per_tok": 2}, "sentencepiece", LLAMA_SPECIALS
    ),
}


def build_tokenizer(arch: Architecture):
    """A tokenizer of the architecture's kind, trained on `CORPUS`, wrapped in `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys([*arch.specials.values(), *([arch.pad] if arch.pad else [])]))
    if arch.tokenizer == "bytelevel":
        core = Tokenizer(models.BPE())
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        core.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=specials, initial_alphabet=alphabet)
    else:
        # SentencePiece's layout as transformers converts it: "▁" for spaces, <0xNN> byte tokens for the rest.
        core = Tokenizer(models.BPE(unk_token=arch.specials["unk"], byte_fallback=True))
        core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        core.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        trainer = trainers.BpeTrainer(vocab_size=192, special_tokens=specials)
    core.train_from_iterator(CORPUS, trainer)
    if arch.tokenizer == "sentencepiece":
        # The <0xNN> byte tokens are ordinary vocabulary (not special tokens, which decoding would skip).
        data = json.loads(core.to_str())
        vocab = data["model"]["vocab"]
        vocab.update({f"<0x{i:02X}>": len(vocab) + i for i in range(256)})
        core = Tokenizer.from_str(json.dumps(data))
        bos = arch.specials["bos"]
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, core.token_to_id(bos))]
        )
    names = {"bos": "bos_token", "eos": "eos_token", "unk": "unk_token"}
    kwargs = {names[k]: v for k, v in arch.specials.items()}
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=arch.pad, **kwargs)


def build_tiny_model(name: str, folder: Path) -> Path:
    """Builds the architecture `name` of `ARCHITECTURES` into `folder` (weights and tokenizer); returns it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    arch = ARCHITECTURES[name]
    tokenizer = build_tokenizer(arch)
    ids = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = AutoConfig.for_model(arch.model_type, **arch.config, **ids)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


@functools.cache
def _session_cache() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="grpoflow-architectures-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def tiny_model(name: str) -> Path:
    """The tiny model of architecture `name`, built on first use in this test session's cache folder."""
    return build_tiny_model(name, _session_cache() / name)


def rank_reward(completions, **kwargs) -> list[float]:
    """Rewards 0, 1, 2... by position: every group has distinct rewards, hence non-zero advantages and gradients,
    whatever a random model writes (the training tests need the weights to move, not to learn anything).

    >>> rank_reward(["a", "b", "c"])
    [0.0, 1.0, 2.0]
    """
    return [float(i) for i in range(len(completions))]
