"""The built-in tiny model, `builtin:tiny`: a small Qwen2 causal LM with a byte-level tokenizer and a chat template.

It is built offline and deterministically (fixed seed, no download) on first use and cached, so tests and the demo
never touch the Hugging Face Hub. Everything downstream loads it with plain `from_pretrained` from the cached folder.

    python -m grpoflow.trainers.model.tiny            # builds (if needed) and prints the folder
"""

import tempfile
from pathlib import Path

from grpoflow.trainers.model.hub import cache_root

BUILTIN_PREFIX = "builtin:"
# Bump when the architecture or tokenizer changes, so an old cache is never reused.
TINY_VERSION = "v1"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# For tool rollouts (grpoflow.trainers.agents.tool_tokenizer): the same turns, plus the tools in the system turn and
# the calls in Qwen's format, which TRL parses with its Qwen response template. It lists each tool as
# `name(arguments)`, not its JSON schema: a byte-level model reads one token a character, and Qwen2.5's template with
# the schemas of examples/agents.py is ~1,400 tokens, beyond the 512 positions and slow to train on CPU; this one is
# ~100. Without tools it renders exactly as CHAT_TEMPLATE.
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n' }}{%- endif %}"
    "{{- 'Tools:' }}"
    "{%- for tool in tools %}"
    "{%- set tool = tool.function if tool.function is defined else tool %}"
    "{{- ' ' + tool.name + '(' + (tool.parameters.properties | list | join(', ')) + ')' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls %}"
    "{%- set call = call.function if call.function is defined else call %}"
    '{{- \'<tool_call>\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{{- (call.arguments | tojson) + '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

TINY_CONFIG = dict(
    hidden_size=96,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def is_builtin(model_id: str) -> bool:
    return model_id.startswith(BUILTIN_PREFIX)


def resolve_model_path(model_id: str) -> str:
    """Turns `builtin:tiny` into its cached local folder (building it if needed), and a GGUF file into the model folder
    it is converted to (converting it if needed: `grpoflow.trainers.model.gguf`); other ids pass through unchanged."""
    from grpoflow.core.uris import is_gguf
    from grpoflow.trainers.model.gguf import convert_gguf

    if is_gguf(model_id):
        return str(convert_gguf(model_id))
    if not is_builtin(model_id):
        return model_id
    name = model_id[len(BUILTIN_PREFIX) :]
    if name != "tiny":
        raise ValueError(f"unknown built-in model {model_id!r}; the only built-in model is 'builtin:tiny'")
    return str(build_tiny())


def build_tokenizer():
    """A byte-level tokenizer (256 byte tokens, no merges) with Qwen-style chat special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny(path: Path | None = None) -> Path:
    """Builds the tiny model into `path` (default: the cache) unless it is already there; returns the folder."""
    path = Path(path or cache_root() / f"builtin-tiny-{TINY_VERSION}")
    if (path / "config.json").exists():
        return path  # without importing torch: the CLI and the preflight resolve builtin:tiny too
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_CONFIG,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    # Build beside the target and rename, so a concurrent or interrupted build never leaves a half folder.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tiny-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(path)
    except OSError:  # another process won the race; its copy is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return path


if __name__ == "__main__":
    print(build_tiny())
