"""A GGUF file as base_model (trainers/model/gguf.py): transformers reads it, the job converts it once into an ordinary
model folder that every stage loads and merge writes safetensors from, and what cannot be read is refused before
anything runs, naming why. The files are tiny ones the tests write (tests/gguf_files.py)."""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoflow.core.errors import SetupError
from grpoflow.trainers import grpo
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model import merge
from grpoflow.trainers.model.gguf import (
    INSTALL,
    content_key,
    convert_gguf,
    gguf_config,
    gguf_folder,
    gguf_problem,
    read_header,
    scan_header,
)
from grpoflow.trainers.model.tiny import CHAT_TEMPLATE, resolve_model_path
from tests.gguf_files import write_gguf
from tests.s3_server import bucket, s3_env  # noqa: F401  (fixtures)


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


def test_the_header_gives_the_config_transformers_builds_once_per_content(gguf_file, cache, tmp_path):
    from transformers import AutoConfig

    config = gguf_config(str(gguf_file))
    built = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name).to_json_string(use_diff=False)
    assert config["model_type"] == "llama" and config["max_position_embeddings"] == 256
    assert config == json.loads(built)  # transformers' own reading, as config.json holds it; no table of grpoflow's
    assert config["num_hidden_layers"] == 2
    [memo] = (cache / "gguf" / "keys").glob("*.config.json")
    memo.write_text(json.dumps(config | {"num_hidden_layers": 7}))  # what a later validate reads: not built again
    (copy := tmp_path / "copy.gguf").write_bytes(gguf_file.read_bytes())
    assert gguf_config(str(copy)) == config | {"num_hidden_layers": 7, "_name_or_path": str(tmp_path)}


def _folders(cache: Path) -> list[Path]:
    """The converted folders in the cache (not its memo of content keys, locks or staging folders)."""
    return sorted(p for p in (cache / "gguf").iterdir() if p.is_dir() and p.name != "keys" and p.name[0] != ".")


def test_a_job_converts_the_file_once_into_the_cache_and_every_path_to_its_bytes_shares_it(gguf_file, cache, tmp_path):
    original = tmp_path / "model.gguf"
    original.write_bytes(gguf_file.read_bytes())
    folder = Path(resolve_model_path(str(original)))
    assert folder.parent == cache / "gguf" and folder == gguf_folder(str(original))
    weights = (folder / "model.safetensors").stat()
    (tmp_path / "project").mkdir()
    (copy := tmp_path / "project" / "SmolLM2.gguf").write_bytes(original.read_bytes())  # copied into a project
    os.link(original, hard := tmp_path / "hard.gguf")
    (symlink := tmp_path / "link.gguf").symlink_to(original)
    for path in (original, copy, hard, symlink):
        assert resolve_model_path(str(path)) == str(folder)
    assert _folders(cache) == [folder]
    after = (folder / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (weights.st_ino, weights.st_mtime_ns)  # nothing converted again
    assert gguf_problem(str(copy)) is None

    copy.write_bytes(original.read_bytes() + b"\0" * 32)  # other bytes: converted anew
    changed = Path(resolve_model_path(str(copy)))
    assert changed != folder and _folders(cache) == sorted([folder, changed])
    os.utime(original, ns=(original.stat().st_atime_ns, original.stat().st_mtime_ns + 10**9))  # touched, same bytes
    assert gguf_folder(str(original)) == folder


def test_an_unchanged_file_is_hashed_once_and_a_rewritten_one_again(gguf_file, cache, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_file.read_bytes())
    key = content_key(path)
    assert key == hashlib.sha256(path.read_bytes()).hexdigest()
    [memo] = (cache / "gguf" / "keys").iterdir()
    assert memo.read_text() == key
    memo.write_text("f" * 64)  # what the memo holds is what an unchanged file's key is: it was not hashed again
    assert content_key(path) == "f" * 64 and content_key(tmp_path / "." / "model.gguf") == "f" * 64
    path.write_bytes(gguf_file.read_bytes())  # written anew, the same bytes: hashed again, the same key
    assert content_key(path) == key and len(list((cache / "gguf" / "keys").iterdir())) == 2


@pytest.mark.slow  # two processes importing torch: ~35 s on 2 busy cores
def test_two_processes_converting_the_same_file_at_once_convert_it_once(gguf_file, cache):
    command = [sys.executable, "-m", "grpoflow.trainers.model.gguf", str(gguf_file)]
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [child.communicate(timeout=120)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0]
    folder = gguf_folder(str(gguf_file))
    assert [out.splitlines()[-1] for out in outputs] == [str(folder)] * 2 and _folders(cache) == [folder]
    assert sum("converting tiny.Q8_0.gguf" in out for out in outputs) == 1  # the other waited, then found it done
    assert AutoModelForCausalLM.from_pretrained(folder).num_parameters() > 0


def test_the_header_is_read_as_the_gguf_package_reads_it(gguf_file):
    from gguf import GGUFReader

    reader, header = GGUFReader(str(gguf_file)), read_header(gguf_file)
    fields = reader.fields
    assert header.architecture == "llama" and header.name == "grpoflow test model" and header.chat_template
    assert header.metadata == {key: fields[key].contents() for key in fields if key.startswith("llama.")}
    assert header.parameters == sum(int(t.n_elements) for t in reader.tensors) and header.quantization == "Q8_0"
    scanned, tensors = scan_header(gguf_file)
    assert scanned["tokenizer.ggml.tokens"] is None  # the vocabulary stepped over, unread
    assert tensors == [(t.tensor_type.name, int(t.n_elements)) for t in reader.tensors]


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


# --- a remote GGUF file: a Hub repo's (the loopback Hub, tests/hub_server.py), a store's (moto, tests/s3_server.py)


def test_a_hub_gguf_validates_from_its_metadata_and_a_missing_one_is_refused_naming_it(gguf_hub, cache):
    from tests.publishing import GGUF_REPO, GGUF_URI

    assert gguf_problem(GGUF_URI) is None
    assert gguf_hub.hits("HEAD", f"/{GGUF_REPO}/resolve/main/tiny.Q8_0.gguf") == 1
    assert gguf_hub.hits("GET", "/resolve/") == 0  # no byte of the file downloaded
    assert gguf_config(GGUF_URI) == {}  # its header is read once it is here: the training child downloads it
    missing = {
        "hf://grpo-org/no-such-GGUF/tiny.Q8_0.gguf": "grpo-org/no-such-GGUF is no model repo on the Hub at",
        f"hf://{GGUF_REPO}/tiny.Q4_K_M.gguf": f"{GGUF_REPO} has no file 'tiny.Q4_K_M.gguf' (at main) on the Hub at",
        f"hf://{GGUF_REPO}@0123abc/tiny.Q8_0.gguf": f"{GGUF_REPO} has no revision '0123abc' on the Hub at",
        f"hf://datasets/{GGUF_REPO}/tiny.Q8_0.gguf": "is not a file of a Hub model repo; write hf://<owner>/<name>",
    }
    for uri, expected in missing.items():
        problem = gguf_problem(uri)
        assert problem.startswith(f"base_model: {uri}") and expected in problem, problem


def test_validate_takes_a_hub_gguf_and_refuses_a_missing_one_with_exit_2(gguf_hub, cache, tmp_path):
    from tests.conftest import cli, write_jsonl
    from tests.publishing import GGUF_REPO, GGUF_URI

    rows = [{"prompt": [{"role": "user", "content": f"{i}+1?"}], "answer": str(i + 1)} for i in range(8)]
    spec = {"name": "hub-gguf", "dataset": {"uri": str(write_jsonl(tmp_path / "chat.jsonl", rows))}}
    spec |= {"rewards": [{"name": "exact_answer"}], "evaluation": {"holdout": 0}}
    for name, base_model in (("ok", GGUF_URI), ("missing", f"hf://{GGUF_REPO}/tiny.Q4_K_M.gguf")):
        (tmp_path / f"{name}.yaml").write_text(json.dumps({**spec, "base_model": base_model}))
    code, _, err = cli("validate", tmp_path / "ok.yaml")
    assert code == 0, err
    [note] = [line for line in err.splitlines() if line.startswith("warning: base_model:")]
    assert note.startswith(f"warning: base_model: {GGUF_URI} is a remote GGUF file (0.1 MB, not downloaded yet): ")
    assert str(gguf_folder(GGUF_URI)) in note and gguf_hub.hits("GET", "/resolve/") == 0
    code, _, err = cli("validate", tmp_path / "missing.yaml")
    assert code == 2
    assert f"base_model: hf://{GGUF_REPO}/tiny.Q4_K_M.gguf: {GGUF_REPO} has no file 'tiny.Q4_K_M.gguf'" in err


def test_a_lora_job_trains_from_a_hub_gguf_downloaded_once(gguf_hub, cache, make_job):
    from huggingface_hub import constants

    from tests.publishing import GGUF_REPO, GGUF_URI

    job, _ = make_job("hub-gguf", base_model=GGUF_URI, hyperparameters={"max_steps": 2, "lora_rank": 4})
    assert grpo.main(str(job.root)) == 0  # downloads the file, converts it, trains on the folder
    assert gguf_hub.hits("GET", f"/{GGUF_REPO}/resolve/") == 1
    [downloaded] = Path(constants.HF_HUB_CACHE).rglob("tiny.Q8_0.gguf")  # in the Hub cache, as hf download puts it
    folder = gguf_folder(GGUF_URI)
    assert folder.parent == cache / "gguf" and folder.name.startswith("tiny.Q8_0-")
    assert json.loads((job.adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(folder)
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]
    assert gguf_problem(GGUF_URI) is None  # now here: its header is checked too
    assert gguf_config(GGUF_URI)["model_type"] == "llama"
    assert resolve_model_path(GGUF_URI) == str(folder)  # a later stage: the same folder, nothing downloaded again
    assert gguf_hub.hits("GET", f"/{GGUF_REPO}/resolve/") == 1
    with pytest.MonkeyPatch.context() as offline:  # a worker without the Hub: the cached copy, the same key (its etag)
        offline.setattr(constants, "HF_HUB_OFFLINE", True)
        offline.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # another key for the metadata held a minute
        assert gguf_folder(GGUF_URI) == folder and resolve_model_path(GGUF_URI) == str(folder)

    # A new version of the file (another etag) is another conversion.
    repo = gguf_hub.repos[GGUF_REPO]
    gguf_hub._commit(repo, "requantize", "", {"tiny.Q8_0.gguf": downloaded.read_bytes() + b"\0" * 32}, [])
    from grpoflow.trainers.model import gguf as gguf_module

    gguf_module._metadata.clear()  # a minute later, as a new process sees it
    assert gguf_folder(GGUF_URI) != folder


def test_an_s3_gguf_validates_downloads_once_and_converts(gguf_file, cache, bucket):  # noqa: F811 - the fixture
    import s3fs

    uri = f"s3://{bucket}/models/tiny.Q8_0.gguf"
    problem = gguf_problem(uri)
    assert problem == f"base_model: {uri} does not exist (a GGUF file; a model folder or a Hub model id also do)"
    s3fs.S3FileSystem().put_file(str(gguf_file), uri)
    from grpoflow.trainers.model import gguf as gguf_module

    gguf_module._metadata.clear()
    assert gguf_problem(uri) is None and gguf_config(uri) == {}  # its metadata only, until it is downloaded
    folder = Path(resolve_model_path(uri))
    assert folder == gguf_folder(uri) and (folder / "model.safetensors").is_file()
    [copy] = (cache / "gguf" / "downloads").iterdir()
    assert copy.read_bytes() == gguf_file.read_bytes()
    config, local = gguf_config(uri), gguf_config(str(gguf_file))
    assert config.pop("_name_or_path") != local.pop("_name_or_path") and config == local  # the copy's header


@pytest.mark.parametrize(
    "uri",
    [
        "http://169.254.169.254/latest/meta-data/model.gguf",  # a cloud metadata service, through fsspec's http
        "https://example.invalid/model.gguf",  # any web address the worker reaches
        "ftp://127.0.0.1/model.gguf",
    ],
)
def test_a_remote_gguf_comes_only_from_the_hub_or_an_object_store(uri):
    problem = gguf_problem(uri)
    assert problem is not None and "hf://" in problem and "s3://" in problem and uri in problem
