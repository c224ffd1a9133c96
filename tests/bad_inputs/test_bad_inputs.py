"""The bad-input corpus (cases.yaml): every rejected input exits 2, names its culprit, shows no traceback, and leaves
no job folder behind.

Each case runs `grpoflow.flows.cli.main` in-process with stdout and stderr redirected (not capsys: Prefect's log
handler keeps the first stderr it sees). Cases marked `flow` (`grpoflow run` on a bad dataset, reward or dataset URI)
get the session's Prefect server, though `run`'s preflight (jobs/preflight.py) now rejects them before Prefect
starts, as it rejects everything else. No case trains: the SFT and GRPO tasks are replaced by a guard that fails the
run, so an input that wrongly got through shows up as exit 1 with "reached training". Each case's time until the user
was told is recorded as the `seconds_until_told` property (see `--junitxml`), never asserted.
"""

import contextlib
import io
import json
import os
import shutil
import time
import traceback
from pathlib import Path

import pytest
import yaml

from grpoflow.flows.cli import main

HERE = Path(__file__).parent
# cases.yaml, then each cases-<topic>.yaml beside it (same fields), in name order.
CASES = [case for path in sorted(HERE.glob("cases*.yaml")) for case in yaml.safe_load(path.read_text()) or []]
CATEGORIES = ("spec", "model", "dataset", "reward", "uri", "cli")
FIELDS = {
    "id",
    "why",
    "argv",
    "spec",
    "dataset",
    "make",
    "flow",
    "env",
    "expect",
    "spec_output",
    "never_shown",
    "skip_if_root",
    "xfail",
}


# --- generated inputs: binary, huge or special files, made in the case folder rather than committed


def latin1_spec(case: Path) -> dict:
    spec = case / "latin1.yaml"
    spec.write_bytes((HERE / "specs" / "base.yaml").read_bytes().replace(b"name: bad-input", b"name: caf\xe9", 1))
    return {"spec": spec}


def huge_spec(case: Path) -> dict:
    spec = case / "huge.yaml"
    text = (HERE / "specs" / "base.yaml").read_text()
    spec.write_text(text + f"hyperparameters: {{system_prompt: '{'x' * 2_000_000}'}}\n")
    return {"spec": spec}


def huge_override(case: Path) -> dict:
    return {"text": "x" * 10_000_000}


def latin1_dataset(case: Path) -> dict:
    dataset = case / "latin1.jsonl"
    good = (HERE / "datasets" / "good.jsonl").read_bytes().splitlines(keepends=True)
    dataset.write_bytes(b"".join([*good[:2], b'{"prompt": "Caf\xe9 au lait?", "answer": "1"}\n', *good[2:]]))
    return {"dataset": dataset}


def long_line_dataset(case: Path) -> dict:
    dataset = case / "long.jsonl"
    good = (HERE / "datasets" / "good.jsonl").read_bytes().splitlines(keepends=True)
    long_row = b'{"prompt": "' + b"x" * 40_000 + b'", "answer": "1"}\n'
    dataset.write_bytes(b"".join([*good[:4], long_row, *good[4:]]))
    return {"dataset": dataset}


def json_document_dataset(case: Path) -> dict:
    dataset = case / "data.json"  # one line, a JSON array: 40 rows of ~1 KB, over 16 x max_row_bytes=2000
    rows = [{"prompt": f"What is {i}+1? " + "x" * 1000, "answer": str(i + 1)} for i in range(40)]
    dataset.write_text(json.dumps(rows))
    return {"dataset": dataset}


def pipe_spec(case: Path) -> dict:
    os.mkfifo(case / "spec.yaml")
    return {"spec": case / "spec.yaml"}


def pipe_dataset(case: Path) -> dict:
    os.mkfifo(case / "data.jsonl")
    return {"dataset": case / "data.jsonl"}


def unreadable_dataset(case: Path) -> dict:
    dataset = case / "data.jsonl"
    shutil.copy(HERE / "datasets" / "good.jsonl", dataset)
    dataset.chmod(0)
    return {"dataset": dataset}


def directory_dataset(case: Path) -> dict:
    (case / "data.jsonl").mkdir()
    return {"dataset": case / "data.jsonl"}


def spec_beside_root(case: Path) -> dict:
    (case / "runs").mkdir()  # the output root of earlier jobs: "runs/.." only resolves when it exists
    shutil.copy(HERE / "specs" / "base.yaml", case / "spec.yaml")
    return {"spec": case / "spec.yaml"}


def file_as_root(case: Path) -> dict:
    (case / "runs.txt").write_text("not a folder\n")
    return {}


def tiny_model_copy(case: Path, leave_out: tuple[str, ...]) -> Path:
    """builtin:tiny's folder copied to {case}/model, less the files in `leave_out`."""
    from grpoflow.trainers.model.tiny import build_tiny

    shutil.copytree(build_tiny(), case / "model", ignore=lambda folder, names: [n for n in names if n in leave_out])
    return case / "model"


def model_without_config(case: Path) -> dict:
    tiny_model_copy(case, ("config.json",))  # weights and tokenizer, but no config.json: no model folder
    return {}


def model_without_chat_template(case: Path) -> dict:
    model = tiny_model_copy(case, ("chat_template.jinja",))  # a base model's tokenizer: no chat template
    assert "chat_template" not in (model / "tokenizer_config.json").read_text()
    return {}


def causal_lm_as_reward_model(case: Path) -> dict:
    tiny_model_copy(case, ())  # builtin:tiny is a Qwen2ForCausalLM: a policy, not a sequence classifier
    return {}


def model_with_learned_positions(case: Path) -> dict:
    # builtin:tiny's tokenizer on a GPT-2 config with 16 learned positions: no position row past the 16th.
    import json

    from transformers import GPT2Config

    model = tiny_model_copy(case, ("model.safetensors",))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    config = GPT2Config(vocab_size=vocab, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    (model / "config.json").write_text(config.to_json_string())
    return {}


def model_without_weights(case: Path) -> dict:
    tiny_model_copy(case, ("model.safetensors",))  # config and tokenizer, as a save without the model leaves them
    return {}


def seq2seq_model(case: Path) -> dict:
    # A tiny T5, an encoder-decoder, with builtin:tiny's tokenizer beside it: what GRPO cannot train.
    from transformers import AutoModelForSeq2SeqLM, T5Config

    model = tiny_model_copy(case, ("config.json", "model.safetensors"))
    config = T5Config(vocab_size=64, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2)
    AutoModelForSeq2SeqLM.from_config(config).save_pretrained(model)
    return {}


def saved_dataset_dict(case: Path) -> dict:
    import datasets

    rows = datasets.load_dataset("json", data_files=str(HERE / "datasets" / "good.jsonl"), split="train")
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(case / "saved"))
    return {"dataset": case / "saved"}


def read_only_root(case: Path) -> dict:
    (case / "runs").mkdir(mode=0o555)
    return {}


def root_inside_a_file(case: Path) -> dict:
    (case / "runs.txt").write_text("not a folder\n")
    return {"root": case / "runs.txt" / "runs"}


def dataset_linked_to_a_system_file(case: Path) -> dict:
    (case / "data.csv").symlink_to("/etc/passwd")  # a name with a data extension, the content of a system file
    return {"dataset": case / "data.csv"}


MAKERS = {
    maker.__name__: maker
    for maker in (
        dataset_linked_to_a_system_file,
        latin1_spec,
        huge_spec,
        huge_override,
        latin1_dataset,
        long_line_dataset,
        json_document_dataset,
        pipe_spec,
        pipe_dataset,
        unreadable_dataset,
        directory_dataset,
        spec_beside_root,
        file_as_root,
        model_without_config,
        model_without_chat_template,
        causal_lm_as_reward_model,
        model_with_learned_positions,
        model_without_weights,
        seq2seq_model,
        saved_dataset_dict,
        read_only_root,
        root_inside_a_file,
    )
}


# --- running a case


def cli(argv: list[str]) -> tuple[int | str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except Exception:  # what the user would see: a traceback, which the assertions below reject
            code = "raised"
            traceback.print_exc()
    return code, out.getvalue(), err.getvalue()


def fill(text: str, values: dict) -> str:
    """`text` with its {placeholders} replaced (not str.format: argv holds YAML braces such as "kwargs={a: 1}")."""
    for name, value in values.items():
        text = text.replace("{" + name + "}", str(value))
    return text


def no_training(monkeypatch) -> None:
    import grpoflow.flows.pipeline

    def reached_training(*args, **kwargs):
        raise AssertionError("a rejected input reached training")

    for name in ("sft_task", "train_task"):
        monkeypatch.setattr(grpoflow.flows.pipeline, name, reached_training)


def params():
    for case in CASES:
        marks = []
        if case.get("skip_if_root"):
            marks.append(pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file"))
        if case.get("xfail"):
            marks.append(pytest.mark.xfail(reason=case["xfail"], strict=True))
        yield pytest.param(case, id=case["id"], marks=marks)


def test_the_table_is_well_formed():
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    for case in CASES:
        assert case["id"].split("-")[0] in CATEGORIES, case["id"]
        assert case.get("why") and case.get("expect"), f"{case['id']}: every case says why and what it expects"
        assert set(case) <= FIELDS, f"{case['id']}: unknown fields {set(case) - FIELDS}"
        for key in ("spec", "dataset"):
            assert key not in case or (HERE / case[key]).is_file(), f"{case['id']}: {case[key]} is missing"
        assert case.get("make") is None or case["make"] in MAKERS, case["id"]
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", list(params()))
def test_bad_input_is_rejected(case, tmp_path, monkeypatch, request):
    folder = tmp_path / "case"
    folder.mkdir()
    values = {"case": folder, "root": folder / "runs"}
    for key in ("spec", "dataset"):
        if key in case:
            values[key] = Path(shutil.copy(HERE / case[key], folder))
    if "make" in case:
        values.update(MAKERS[case["make"]](folder))
    monkeypatch.delenv("GRPOFLOW_OUTPUT_URI", raising=False)
    for name, value in case.get("env", {}).items():
        monkeypatch.setenv(name, fill(value, values))
    if case.get("flow"):
        request.getfixturevalue("prefect_server")
        no_training(monkeypatch)
    monkeypatch.chdir(folder)  # relative paths in a case stay inside its folder
    before = set(folder.rglob("*"))

    output = [] if case.get("spec_output") else ["--output-uri", str(values["root"])]
    started = time.monotonic()
    code, out, err = cli([*output, *(fill(arg, values) for arg in case["argv"])])
    # How long until the user was told, in the JUnit XML (--junitxml); recorded, never asserted.
    request.node.user_properties.append(("seconds_until_told", round(time.monotonic() - started, 2)))

    assert code == 2, f"{case['why']}\nexit code {code}; stderr:\n{err}"
    for fragment in case["expect"]:
        assert fill(fragment, values) in err, f"{case['why']}\nmissing {fragment!r} in:\n{err}"
    assert "Traceback" not in err + out
    for secret in case.get("never_shown", []):  # a credential, or a line of a file that is not the dataset
        assert secret not in err + out, f"{case['why']}\n{secret!r} shown in:\n{err}"
    # No job folder, half-written or whole, and no stray temporary files: nothing new at all in the case folder.
    assert not list(values["root"].glob("*/spec.yaml"))
    assert sorted(str(p.relative_to(folder)) for p in set(folder.rglob("*")) - before if not p.is_dir()) == []
    assert sorted(p.name for p in values["root"].glob(".*")) == []
