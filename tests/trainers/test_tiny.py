"""builtin:tiny: built offline and deterministically, cached, and an ordinary model folder for every stage."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoflow.trainers.model.tiny import build_tiny, is_builtin, resolve_model_path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny") / "builtin-tiny")


def test_loads_with_from_pretrained_and_generates(tiny):
    model = AutoModelForCausalLM.from_pretrained(tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000  # tiny: CPU tests train it in seconds
    enc = tokenizer("What is 2+3?", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > enc["input_ids"].shape[1]


@pytest.mark.parametrize(
    "text",
    [
        "What is 2+3?",  # ASCII
        "Größe: 3 €",  # multi-byte UTF-8
        "答案是 5 🎉",  # CJK and an emoji: byte-level, so nothing is unknown
        "  leading spaces\nand a newline",  # whitespace kept as is
    ],
)
def test_tokenizer_round_trips_any_text(tiny, text):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_chat_template_and_special_tokens(tiny):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id  # padding is never mistaken for the end


def test_builds_are_identical(tiny, tmp_path):
    again = build_tiny(tmp_path / "again")
    a, b = load_file(tiny / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_built_folder_is_reused(tiny):
    before = {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()}
    assert build_tiny(tiny) == tiny
    assert {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()} == before  # not rebuilt


def test_builtin_resolves_to_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOFLOW_CACHE", str(tmp_path / "cache"))
    path = resolve_model_path("builtin:tiny")
    assert path.startswith(str(tmp_path / "cache")) and (tmp_path / "cache").exists()
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "qwen2"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [path.rsplit("/", 1)[-1]]  # no temp folder


@pytest.mark.parametrize(
    "model_id, expected",
    [
        ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B"),  # a Hub id passes through
        ("/models/mine", "/models/mine"),  # a local path too
    ],
)
def test_other_ids_pass_through(model_id, expected):
    assert not is_builtin(model_id)
    assert resolve_model_path(model_id) == expected


def test_an_unknown_builtin_is_named():
    with pytest.raises(ValueError, match="unknown built-in model 'builtin:huge'; the only built-in model is"):
        resolve_model_path("builtin:huge")
