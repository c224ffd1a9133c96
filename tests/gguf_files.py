"""Tiny GGUF files the tests write with the `gguf` package's writer, as llama.cpp's converter lays them out: a
2-layer Llama (64 wide) whose matrices are stored in Q8_0 blocks, with a byte-level (GPT-2 style) vocabulary, its
special tokens and builtin:tiny's chat template. ~100 kB; transformers loads it in a second or two."""

from pathlib import Path

import numpy as np

from grpoflow.trainers.model.tiny import CHAT_TEMPLATE

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 64, 2, 4, 2, 128, 256


def write_gguf(path: Path, architecture: str = "llama", chat_template: bool = True) -> Path:
    """Writes a tiny GGUF model to `path` and returns it. `architecture` is what the file says
    (`general.architecture`); the tensors are a Llama's whatever it says."""
    import gguf
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # One merge: transformers' GGUF tokenizer wants merges, or scores to derive them from.
    tokens = [*alphabet, "Ġt", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * (len(alphabet) + 1) + [gguf.TokenType.CONTROL] * 3
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("grpoflow test model")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    if chat_template:
        writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)

    def matrix(name: str, rows: int, columns: int) -> None:
        weights = (rng.standard_normal((rows, columns)) * 0.05).astype(np.float32)
        blocks = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(HIDDEN, dtype=np.float32))

    kv = KV_HEADS * HIDDEN // HEADS
    matrix("token_embd.weight", len(tokens), HIDDEN)  # no output.weight: the head is tied to the embeddings
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        matrix(f"blk.{i}.attn_k.weight", kv, HIDDEN)
        matrix(f"blk.{i}.attn_v.weight", kv, HIDDEN)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
