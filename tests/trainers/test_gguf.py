"""A GGUF file as base_model (trainers/model/gguf.py): transformers reads it, the job converts it once into an ordinary
model folder that every stage loads and merge writes safetensors from, and what cannot be read is refused before
anything runs, naming why. The files are tiny ones the tests write (tests/gguf_files.py)."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoflow.trainers import grpo
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model import merge
from grpoflow.trainers.model.gguf import INSTALL, convert_gguf, gguf_config, gguf_folder, gguf_problem
from grpoflow.trainers.model.load import SetupError
from grpoflow.trainers.model.tiny import CHAT_TEMPLATE, resolve_model_path
from tests.gguf_files import write_gguf


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GRPOFLOW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_converted_folder_computes_what_the_gguf_file_does(gguf_file, tmp_path):
    folder = convert_gguf(str(gguf_file), tmp_path / "converted")
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in folder.iterdir()
    }
    assert {t.dtype for t in load_file(folder / "model.safetensors").values()} == {torch.float32}  # dequantized
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    chat = [{"role": "user", "content": "What is 2+3?"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"  # the file's chat template
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, from_gguf(ids).logits, atol=1e-6)
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids.shape[1]


def test_the_header_gives_the_config_transformers_builds(gguf_file):
    from transformers import AutoConfig

    config = gguf_config(str(gguf_file))
    built = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name).to_dict()
    assert config["model_type"] == "llama" and config["max_position_embeddings"] == 256
    assert config == built  # transformers' own reading, no table of grpoflow's
    assert config["num_hidden_layers"] == 2


def test_a_job_converts_the_file_once_into_the_cache(gguf_file, cache, tmp_path):
    copy = tmp_path / "model.gguf"
    copy.write_bytes(gguf_file.read_bytes())
    folder = Path(resolve_model_path(str(copy)))
    assert folder.parent == cache / "gguf" and folder.name.startswith("model-") and folder == gguf_folder(str(copy))
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(str(copy)) == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == written  # not converted again
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 10**9))  # the file changed
    assert Path(resolve_model_path(str(copy))) not in (folder, None)
    assert len(list((cache / "gguf").iterdir())) == 2


def test_a_lora_job_trains_from_the_converted_folder_and_merges_to_safetensors(gguf_file, cache, make_job):
    job, _ = make_job("gguf", base_model=str(gguf_file), hyperparameters={"max_steps": 2, "lora_rank": 4})
    assert grpo.main(str(job.root)) == 0  # the GRPO child: it converts the file, then trains as on any folder
    folder = gguf_folder(str(gguf_file))
    assert json.loads((job.adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(folder)
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]

    assert merge.main(str(job.root)) == 0
    base, merged = load_file(folder / "model.safetensors"), load_file(job.merged / "model.safetensors")
    assert merged.keys() == base.keys()  # ordinary weights, no lora_A/lora_B: what publish and serve take
    model, tokenizer = AutoModelForCausalLM.from_pretrained(job.merged), AutoTokenizer.from_pretrained(job.merged)
    assert tokenizer.chat_template == CHAT_TEMPLATE  # the file's template, carried to merged/
    ids = tokenizer("2+3?", return_tensors="pt")["input_ids"]
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] > ids.shape[1]


def _folder(tmp: Path) -> str:
    (tmp / "model.gguf").mkdir()
    return str(tmp / "model.gguf")


def _file(tmp: Path, name: str, data: bytes) -> str:
    (tmp / name).write_bytes(data)
    return str(tmp / name)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda tmp, ok: str(ok), None),  # a GGUF file transformers reads
        (lambda tmp, ok: str(tmp / "SmolLM2.gguf"), "SmolLM2.gguf does not exist"),  # a typo in the path
        (lambda tmp, ok: _folder(tmp), "is a folder, not a GGUF file"),  # a folder named like one
        # a safetensors file renamed .gguf
        (lambda tmp, ok: _file(tmp, "w.gguf", b"\x08\x00\x00\x00\x00\x00\x00\x00{}"), "is not a GGUF file"),
        (lambda tmp, ok: _file(tmp, "cut.gguf", ok.read_bytes()[:40]), "cannot read"),  # a download cut short
        # an architecture transformers has no GGUF loader for, refused in its own words
        (lambda tmp, ok: str(write_gguf(tmp / "rwkv.gguf", "rwkv6")), "holds a 'rwkv6' model, which transformers"),
    ],
)
def test_what_validate_refuses(tmp_path, gguf_file, make, expected):
    problem = gguf_problem(make(tmp_path, gguf_file))
    if expected is None:
        assert problem is None
    else:
        assert problem.startswith("base_model: ") and expected in problem, problem
    if expected and "rwkv6" in expected:
        assert "is not supported yet" in problem  # transformers' own word, quoted


def test_without_the_gguf_package_validate_and_the_training_child_say_what_to_install(gguf_file, cache, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    problem = gguf_problem(str(gguf_file))
    assert problem == f"base_model: {gguf_file} is a GGUF file, and reading one needs the gguf package: {INSTALL}"
    with pytest.raises(SetupError, match=r"pip install 'grpoflow\[gguf\]'"):
        resolve_model_path(str(gguf_file))  # a worker without it: the child's setup problem, exit 2, no retry


def test_the_model_card_links_no_hub_repo_for_a_gguf_file():
    from grpoflow.jobs.publish import _card_base_model

    # Relative, and not here (publish runs elsewhere): it still reads as owner/name, which the Hub would link.
    assert _card_base_model("models/SmolLM2-135M-Instruct.Q4_1.gguf") is None
    assert _card_base_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
