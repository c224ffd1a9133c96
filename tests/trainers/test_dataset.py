"""Tests for trainers/dataset.py: real files in tmp_path, loaded, checked and saved for real."""

import gzip
import hashlib
import json
import math
import os
import re
import socket
import tracemalloc

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import grpoflow.trainers.dataset
import grpoflow.trainers.sources
from grpoflow.core.errors import DatasetError
from grpoflow.trainers.dataset import ValidationSet, check_dataset, ingest_dataset, load_ingested

ROWS = [{"prompt": f"What is {i}+7?", "answer": str(i + 7)} for i in range(10)]
CHAT = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{i}+1?"}]} for i in range(4)
]


def jsonl(*rows: dict) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def write(path, rows: list[dict]) -> None:
    if path.suffix.lower() == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix.lower() == ".csv":
        lines = [",".join(rows[0])] + [",".join(str(v) for v in row.values()) for row in rows]
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_bytes(jsonl(*rows))


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "job" / "dataset"


# --- datasets that load -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["data.jsonl", "data.json", "data.csv", "DATA.PARQUET"])
def test_each_format_loads_and_saves(tmp_path, dest, name):
    source = tmp_path / name
    write(source, ROWS)

    result = ingest_dataset(str(source), dest, required_columns={"answer": "reward 'exact_answer'"})

    saved = load_ingested(dest)
    assert list(saved) == ["train"]
    assert saved["train"]["prompt"] == [row["prompt"] for row in ROWS]
    # CSV infers integers for "17": what a user gets from their CSV, kept as the loader reads it.
    assert [str(a) for a in saved["train"]["answer"]] == [row["answer"] for row in ROWS]
    assert (result.num_train, result.num_eval, result.columns) == (10, 0, ["prompt", "answer"])
    assert result.prompt_format == "text"
    assert result.fingerprint == hashlib.sha256(source.read_bytes()).hexdigest()
    # The loader's cache and the temporary save folder are gone; only the dataset is left.
    assert os.listdir(dest.parent) == ["dataset"]


def test_file_uri_is_the_same_as_the_path(tmp_path, dest):
    source = tmp_path / "data.jsonl"
    write(source, ROWS)

    by_uri = ingest_dataset(source.as_uri(), dest)

    assert by_uri.num_train == 10
    assert by_uri.fingerprint == ingest_dataset(str(source), tmp_path / "other").fingerprint
    assert load_ingested(dest)["train"]["prompt"] == [row["prompt"] for row in ROWS]


def test_compressed_jsonl_loads(tmp_path, dest):
    source = tmp_path / "data.jsonl.gz"
    source.write_bytes(gzip.compress(jsonl(*ROWS)))

    assert ingest_dataset(str(source), dest).num_train == 10


def test_chat_prompts(tmp_path, dest):
    source = tmp_path / "chat.jsonl"
    write(source, CHAT)

    result = ingest_dataset(str(source), dest)

    assert result.prompt_format == "chat"
    assert load_ingested(dest)["train"]["prompt"] == [row["prompt"] for row in CHAT]


def test_the_saved_folder_is_save_to_disks_with_train_test_splits_rows(tmp_path, dest):
    # The ingest saves through `datasets` itself: `load_from_disk` reads it, and the held-out rows are the ones
    # `train_test_split(seed=...)` picks, nested columns and all.
    rows = [{**row, "meta": {"id": i, "tags": ["a", "b"][: i % 3]}} for i, row in enumerate(CHAT * 5)]
    source = tmp_path / "chat.jsonl"
    write(source, rows)

    ingest_dataset(str(source), dest, holdout=0.25, seed=7)

    saved = datasets.load_from_disk(str(dest))
    expected = datasets.load_dataset("json", data_files=str(source), split="train").train_test_split(
        test_size=math.ceil(0.25 * len(rows)), seed=7
    )
    assert list(saved) == ["train", "eval"]
    assert saved["train"].to_list() == expected["train"].to_list()
    assert saved["eval"].to_list() == expected["test"].to_list()
    assert saved["train"].features == expected["train"].features
    assert saved["train"].num_rows + saved["eval"].num_rows == len(rows)


def test_fingerprint_follows_the_content(tmp_path, dest):
    source = tmp_path / "data.jsonl"
    write(source, ROWS)
    before = ingest_dataset(str(source), dest).fingerprint
    write(source, ROWS[:-1])

    after = ingest_dataset(str(source), dest)

    assert after.fingerprint != before
    # Ingesting again replaces the earlier folder.
    assert after.num_train == 9 and load_ingested(dest)["train"].num_rows == 9


# --- holdout ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "holdout, sizes",
    [
        (0.2, (8, 2)),  # a fraction of the rows
        (0.25, (7, 3)),  # a fraction rounds the eval set up, as train_test_split does
        (3, (7, 3)),  # a count of rows
        (9, (1, 9)),  # all but one row
    ],
)
def test_holdout_sizes(tmp_path, dest, holdout, sizes):
    source = tmp_path / "data.jsonl"
    write(source, ROWS)

    result = ingest_dataset(str(source), dest, holdout=holdout)

    saved = load_ingested(dest)
    assert (result.num_train, result.num_eval) == sizes == (saved["train"].num_rows, saved["eval"].num_rows)
    # Every row lands in exactly one split.
    assert sorted([*saved["train"]["prompt"], *saved["eval"]["prompt"]]) == sorted(row["prompt"] for row in ROWS)


def test_holdout_is_deterministic_and_matches_train_test_split(tmp_path):
    source = tmp_path / "data.jsonl"
    rows = [{"prompt": f"p{i}"} for i in range(200)]
    write(source, rows)

    def eval_prompts(seed: int, name: str) -> list[str]:
        ingest_dataset(str(source), tmp_path / name, holdout=0.1, seed=seed)
        return load_ingested(tmp_path / name)["eval"]["prompt"]

    assert eval_prompts(1, "a") == eval_prompts(1, "b")
    assert eval_prompts(1, "a") != eval_prompts(2, "c")
    reference = datasets.Dataset.from_list(rows).train_test_split(test_size=0.1, seed=1, shuffle=True)
    assert eval_prompts(1, "a") == reference["test"]["prompt"]
    assert load_ingested(tmp_path / "a")["train"]["prompt"] == reference["train"]["prompt"]


# --- datasets that are rejected -----------------------------------------------------------------------------------

GOOD = jsonl(*ROWS[:3])
ANSWER = {"answer": "reward 'exact_answer'"}

BAD_DATASETS = [
    # the prompt column is named differently: say which columns exist, and guess the close one
    (
        "a.jsonl",
        jsonl({"Prompts": "hi"}),
        {},
        ["prompt column 'prompt' not found", "'Prompts'", "did you mean 'Prompts'?"],
    ),
    # numbers are not prompts: name the column and its Arrow type
    ("a.jsonl", jsonl({"prompt": 1}, {"prompt": 2}), {}, ["prompt column 'prompt' has Arrow type int64"]),
    # some rows a string, some a list: datasets makes the column JSON, which is no prompt either
    ("a.jsonl", jsonl({"prompt": "hi"}, *CHAT[:1]), {}, ["has Arrow type extension<arrow.json>", "mix types"]),
    # a chat message without content is not a chat prompt
    ("a.jsonl", jsonl({"prompt": [{"role": "user"}]}), {}, ["prompt column 'prompt' has Arrow type list<"]),
    # a missing key (null) and an empty string, on data rows 2 and 4
    ("a.jsonl", jsonl(ROWS[0], {"answer": "1"}, ROWS[1], {"prompt": ""}), {}, ["null or empty in 2 rows (rows 2, 4;"]),
    # seven bad rows: the first five are named, with the total
    ("a.jsonl", jsonl(*[{"prompt": ""}] * 7, ROWS[0]), {}, ["in 7 rows (rows 1, 2, 3, 4, 5 and 2 more;"]),
    # an empty chat, and a message whose content is null
    (
        "a.jsonl",
        jsonl(*CHAT[:2], {"prompt": []}, {"prompt": [{"role": "user", "content": None}]}),
        {},
        ["null or empty message list", "in 2 rows (rows 3, 4;"],
    ),
    # a user message of whitespace alone, or empty, is no question either (a system message may be empty)
    (
        "a.jsonl",
        jsonl(
            *CHAT[:1],
            {"prompt": [{"role": "system", "content": ""}, {"role": "user", "content": " \n\t"}]},
            {"prompt": [{"role": "user", "content": ""}]},
        ),
        {},
        ["has a user message that is empty or only whitespace", "in 2 rows (rows 2, 3;"],
    ),
    # a column a reward needs is missing: name it, the reward, and the columns there are
    (
        "a.jsonl",
        jsonl({"prompt": "hi", "answr": "1"}),
        {"required_columns": ANSWER},
        ["column 'answer' (needed by reward 'exact_answer') not found", "did you mean 'answr'?"],
    ),
    # a column a reward needs has nulls
    (
        "a.jsonl",
        jsonl(ROWS[0], {"prompt": "hi"}),
        {"required_columns": ANSWER},
        ["column 'answer' (needed by reward 'exact_answer') is null in 1 row (row 2;"],
    ),
    # every problem is reported at once, not just the first
    (
        "a.jsonl",
        jsonl({"prompt": ""}),
        {"required_columns": {**ANSWER, "completion": "the SFT warm-up (sft.completion_column)"}},
        ["has 3 problems", "null or empty in 1 row", "'answer' (needed by reward", "'completion' (needed by the SFT"],
    ),
    # a broken line among good ones is named by its line number, with the parser's reason
    (
        "a.jsonl",
        jsonl(*ROWS, *ROWS[:6]) + b'{"prompt": "q" "answer": 1}\n',
        {},
        ["line 17: invalid JSON (Expecting ',' delimiter)"],
    ),
    # a line that is JSON but not an object
    ("a.jsonl", GOOD + b"[1, 2]\n", {}, ["line 4: not a JSON object (got an array)"]),
    # a number Arrow cannot hold, located (Python's json alone reads it as inf)
    ("a.jsonl", GOOD + b'{"prompt": "q", "n": 1e999}\n', {}, ["line 4: number 1e999 is too large for a double"]),
    # nesting past Arrow's 64 levels, found before the loader (which recursed, then crashed, on deeper rows)
    ("a.jsonl", GOOD + b'{"prompt": "q", "t": ' + b"[" * 80 + b"]" * 80 + b"}\n", {}, ["line 4 nests JSON 81 levels"]),
    # a line over max_row_bytes, in a compressed file too
    (
        "a.jsonl",
        GOOD + jsonl({"prompt": "x" * 200}),
        {"max_row_bytes": 100},
        ["line 4 is longer than max_row_bytes=100"],
    ),
    (
        "a.jsonl.gz",
        gzip.compress(GOOD + jsonl({"prompt": "x" * 200}), mtime=0),
        {"max_row_bytes": 100},
        ["line 4 is longer than max_row_bytes=100"],
    ),
    (
        "a.csv",
        b"prompt\nhi\n" + b"x" * 200 + b"\n",
        {"max_row_bytes": 100},
        ["line 3 is longer than max_row_bytes=100"],
    ),
    # at most three bad lines are listed
    ("a.jsonl", GOOD + b"{\n" * 5, {}, ["line 4: invalid JSON", "line 6: invalid JSON", "first 3 bad lines"]),
    # bytes that are not UTF-8 (the JSON reader alone would let them through)
    ("a.jsonl", GOOD + b'{"prompt": "caf\xe9"}\n', {}, ["line 4: not valid UTF-8 (byte 0xe9 at column 16)"]),
    # the same in a CSV
    ("a.csv", b"prompt,answer\nhi,1\ncaf\xe9,2\n", {}, ["line 3: not valid UTF-8"]),
    # a CSV row with too many fields: the parser's message names the line
    ("a.csv", b"prompt,answer\nhi,1\nx,2,3\n", {}, ["Expected 2 fields in line 3, saw 3"]),
    # a CSV column named twice (pandas loaded the second as 'prompt.1'), behind a BOM and quotes too
    ("a.csv", b'\xef\xbb\xbfprompt,"answer",prompt\nhi,1,ho\n', {}, ["the CSV header repeats column(s) 'prompt'"]),
    ("a.csv.gz", gzip.compress(b"a,b,a,b\n1,2,3,4\n", mtime=0), {}, ["repeats column(s) 'a', 'b'"]),
    # a key twice in one JSON line (was "Trailing data at position 55"), in a nested object too
    ("a.jsonl", GOOD + b'{"prompt": "q", "prompt": "r"}\n', {}, ["line 4: key 'prompt' appears twice in one object"]),
    ("a.jsonl", GOOD + b'{"prompt": "q", "m": {"k": 1, "k": 2}}\n', {}, ["line 4: key 'k' appears twice"]),
    # prompts of whitespace alone, as empty ones, each kind named by its rows
    (
        "a.jsonl",
        jsonl(ROWS[0], {"prompt": " "}, {"prompt": ""}, {"prompt": "\t\n\u00a0"}),
        {},
        ["has 2 problems", "null or empty in 1 row (row 3;", "only whitespace in 2 rows (rows 2, 4;"],
    ),
    # an empty file, blank lines only, a CSV header only
    ("a.jsonl", b"", {}, ["has no rows"]),
    ("a.jsonl", b"\n\n  \n", {}, ["has no rows"]),
    ("a.csv", b"prompt,answer\n", {}, ["has no rows"]),
    # a format that is not supported: name the extension and the supported ones
    ("a.txt", GOOD, {}, ["unsupported file extension .txt", ".jsonl, .json, .csv, .parquet"]),
    # a holdout that leaves nothing to train on (3 rows), or is not a fraction or a count
    ("a.jsonl", GOOD, {"holdout": 3}, ["holdout=3 leaves no training rows", "has 3"]),
    ("a.jsonl", GOOD, {"holdout": 0.9}, ["holdout=0.9 leaves no training rows"]),
    (
        "a.jsonl",
        GOOD,
        {"holdout": 1.5},
        ["holdout=1.5 for dataset", "give a fraction in [0, 1) or a whole number of rows"],
    ),
    # a split only means something for a Hub dataset
    ("a.jsonl", GOOD, {"split": "test"}, ["split='test' applies only to hf://datasets/"]),
]


@pytest.mark.parametrize("name, content, kwargs, fragments", BAD_DATASETS)
def test_bad_datasets_are_rejected_and_leave_nothing(tmp_path, dest, name, content, kwargs, fragments):
    source = tmp_path / name
    source.write_bytes(content)

    with pytest.raises(DatasetError) as error:
        ingest_dataset(str(source), dest, **kwargs)

    for fragment in fragments:
        assert fragment in str(error.value)
    assert str(source) in str(error.value)
    assert not dest.exists()
    assert not dest.parent.exists() or os.listdir(dest.parent) == []


@pytest.mark.parametrize(
    "uri, fragment",
    [
        ("{tmp}/missing.jsonl", "dataset not found: {tmp}/missing.jsonl"),  # a path that is not there
        ("file://{tmp}/missing.jsonl", "dataset not found: file://{tmp}/missing.jsonl"),  # nor as a file:// URI
        ("{tmp}/folder.jsonl", "is a directory"),  # a folder, not a file
        ("ftp://host/data.jsonl", "unsupported scheme ftp://"),  # schemes the loader does not take
        ("http://host/data.jsonl", "supported: local path, file://, s3://, hf://datasets/"),
        # fsspec's chained URL: as a path it would still open its second half (http) as a URL
        ("simplecache::http://169.254.169.254/x.jsonl", "a chained URL (fsspec's `cache::s3://...`) is refused"),
        ("hf://models/org/name", "only Hub datasets are supported"),  # a Hub model is not a dataset
        # `datasets.load_dataset("../..")` would read a local folder
        ("hf://datasets/../..", "'../..' is not a Hub dataset id"),
        ("hf://datasets/./data/train.jsonl", "'./data' is not a Hub dataset id"),
    ],
)
def test_bad_uris(tmp_path, dest, uri, fragment):
    (tmp_path / "folder.jsonl").mkdir()

    with pytest.raises(DatasetError) as error:
        ingest_dataset(uri.format(tmp=tmp_path), dest)

    assert fragment.format(tmp=tmp_path) in str(error.value)
    assert not dest.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path, dest):
    source = tmp_path / "data.jsonl"
    write(source, ROWS)
    source.chmod(0)

    with pytest.raises(DatasetError, match="permission denied"):
        ingest_dataset(str(source), dest)


def test_empty_parquet(tmp_path, dest):
    source = tmp_path / "data.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), source)

    with pytest.raises(DatasetError, match="has no rows"):
        ingest_dataset(str(source), dest)
    assert not dest.exists()


def test_rejected_dataset_keeps_the_earlier_ingest(tmp_path, dest):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write(good, ROWS)
    write(bad, [{"prompt": ""}])
    ingest_dataset(str(good), dest)

    with pytest.raises(DatasetError):
        ingest_dataset(str(bad), dest)

    assert load_ingested(dest)["train"].num_rows == 10


# --- the line scan: max_row_bytes and nesting, before the loader ------------------------------------------------


def test_an_oversized_line_is_rejected_without_reading_it_whole(tmp_path, dest):
    source = tmp_path / "data.jsonl"
    with source.open("wb") as f:
        f.write(GOOD)
        f.write(b'{"prompt": "' + b"x" * 30_000_000 + b'"}\n')

    tracemalloc.start()
    try:
        with pytest.raises(DatasetError) as error:
            ingest_dataset(str(source), dest, max_row_bytes=1_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert "line 4 is longer than max_row_bytes=1,000,000 bytes" in str(error.value)
    # One chunk and at most max_row_bytes of the line in progress, never the 30 MB line.
    assert peak < 8_000_000, peak
    assert not dest.exists()


def test_a_line_of_exactly_max_row_bytes_is_accepted(tmp_path, dest):
    row = jsonl({"prompt": "x" * 100}).rstrip(b"\n")  # the longest line
    source = tmp_path / "data.jsonl"
    source.write_bytes(GOOD + row + b"\n")

    assert ingest_dataset(str(source), dest, max_row_bytes=len(row)).num_train == 4
    with pytest.raises(DatasetError, match="line 4 is longer than"):
        ingest_dataset(str(source), tmp_path / "other", max_row_bytes=len(row) - 1)


def test_brackets_inside_strings_do_not_nest(tmp_path, dest):
    source = tmp_path / "data.jsonl"
    # 100 "[" in a prompt, and real nesting of 60 levels: both fine for the loader.
    source.write_bytes(jsonl({"prompt": "[" * 100 + "]]"}, {"prompt": "ok", "t": json.loads("[" * 60 + "]" * 60)}))

    assert ingest_dataset(str(source), dest).num_train == 2


def test_a_json_document_is_not_held_to_the_line_limit(tmp_path, dest):
    # One line holding the whole array: its rows are not lines, and the loader reads a JSON document whole anyway.
    source = tmp_path / "data.json"
    source.write_text(json.dumps(ROWS))

    assert ingest_dataset(str(source), dest, max_row_bytes=100).num_train == 10


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_is_rejected_not_waited_on(tmp_path, dest):
    os.mkfifo(tmp_path / "data.jsonl")

    with pytest.raises(DatasetError, match="is not a regular file"):
        ingest_dataset(str(tmp_path / "data.jsonl"), dest)


@settings(max_examples=150, deadline=None, database=None)
@given(
    lines=st.lists(st.integers(0, 40), max_size=12),
    trailing_newline=st.booleans(),
    limit=st.integers(1, 30),
    chunk=st.integers(1, 17),
)
def test_the_scan_names_the_first_long_line_whatever_the_chunking(
    tmp_path_factory, lines, trailing_newline, limit, chunk
):
    # Lines of x's, scanned in tiny chunks so that lines start, end and span chunk boundaries everywhere.
    source = tmp_path_factory.mktemp("scan") / "data.csv"
    source.write_bytes(b"\n".join(b"x" * n for n in lines) + (b"\n" if trailing_newline and lines else b""))
    expected = next((i + 1 for i, n in enumerate(lines) if n > limit), None)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grpoflow.trainers.row_size, "SCAN_CHUNK", chunk)
        try:
            grpoflow.trainers.row_size.check_lines(
                grpoflow.trainers.sources.resolve_source(str(source), None), limit, None
            )
            found = None
        except DatasetError as e:
            found = int(str(e).split("line ")[1].split(" ")[0])

    assert found == expected


# --- save_to_disk folders: a Dataset, or a DatasetDict's split, through the same checks ------------------------------


@pytest.fixture
def saved(tmp_path):
    """A Dataset and a DatasetDict (train: ROWS, test: the first 3) as `save_to_disk` writes them."""
    rows = datasets.Dataset.from_list(ROWS)
    rows.save_to_disk(str(tmp_path / "saved-dataset"))
    datasets.DatasetDict({"train": rows, "test": rows.select(range(3))}).save_to_disk(str(tmp_path / "saved-dict"))
    return tmp_path


@pytest.mark.parametrize(
    "folder, split, rows",
    [
        ("saved-dataset", None, 10),  # a Dataset: its rows
        ("saved-dict", None, 10),  # a DatasetDict: its train split by default
        ("saved-dict", "test", 3),  # or dataset.split
    ],
)
def test_a_save_to_disk_folder_is_ingested(saved, dest, folder, split, rows):
    result = ingest_dataset(str(saved / folder), dest, split=split, required_columns={"answer": "reward 'exact'"})

    assert (result.num_train, result.columns, result.prompt_format) == (rows, ["prompt", "answer"], "text")
    assert load_ingested(dest)["train"]["prompt"] == [row["prompt"] for row in ROWS[:rows]]
    assert result.fingerprint == ingest_dataset(f"file://{saved / folder}", dest, split=split).fingerprint


@pytest.mark.parametrize(
    "folder, kwargs, fragment",
    [
        # the same column checks as a file's
        ("saved-dataset", {"prompt_column": "question"}, "prompt column 'question' not found"),
        ("saved-dict", {"split": "validation"}, "has no split 'validation'; its splits are 'train', 'test'"),
        ("saved-dataset", {"split": "train"}, "is one saved Dataset, without splits; remove dataset.split"),
        # a folder save_to_disk did not write
        ("plain-folder", {}, "is a folder, but not one written by datasets' save_to_disk"),
    ],
)
def test_a_bad_save_to_disk_folder_is_named(saved, dest, folder, kwargs, fragment):
    (saved / "plain-folder").mkdir()

    with pytest.raises(DatasetError, match=re.escape(fragment)) as error:
        ingest_dataset(str(saved / folder), dest, **kwargs)

    assert str(saved / folder) in str(error.value)
    assert not dest.exists()


# --- hf:// datasets while the Hub is offline or out of reach ---------------------------------------------------------


@pytest.mark.parametrize(
    "uri", ["hf://datasets/grpoflow-tests/nowhere", "hf://datasets/grpoflow-tests/nowhere/a.jsonl"]
)
def test_an_hf_dataset_offline_is_one_line(tmp_path, monkeypatch, uri):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(datasets, "load_dataset", None)  # named before any loader (and its retries) runs

    with pytest.raises(DatasetError) as error:
        check_dataset(uri)

    assert str(error.value) == (
        f"dataset {uri}: the Hugging Face Hub is offline (HF_HUB_OFFLINE=1), and hf:// datasets are read from the Hub "
        "at each ingest, not from a local cache; where it is reachable, download the files (hf download --repo-type "
        "dataset grpoflow-tests/nowhere --local-dir DIR) and give one of them as dataset.uri, or unset HF_HUB_OFFLINE"
    )
    assert not (tmp_path / "hf").exists()


@pytest.fixture
def hub_online(monkeypatch):
    """The Hub not offline, its endpoint a loopback port that listens (set `ENDPOINT` again to one that does not)."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    with socket.create_server(("127.0.0.1", 0)) as listening:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{listening.getsockname()[1]}")
        yield huggingface_hub.constants


def test_an_hf_dataset_out_of_reach_is_one_line_without_retries(hub_online, monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    monkeypatch.setattr(hub_online, "ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there
    monkeypatch.setattr(datasets, "load_dataset", None)  # one connection tried, never the loader's 5 tries (~24 s)

    with pytest.raises(DatasetError) as error:
        check_dataset("hf://datasets/grpoflow-tests/nowhere")

    assert str(error.value).startswith(
        f"dataset hf://datasets/grpoflow-tests/nowhere: cannot reach the Hugging Face Hub at http://127.0.0.1:{port} "
        "(ConnectionRefusedError: "
    )
    assert "\n" not in str(error.value)


def test_an_hf_dataset_the_hub_fails_to_serve_is_one_line(hub_online, monkeypatch):
    def unreachable(*args, **kwargs):  # what `datasets` raises after its 5 tries
        raise ConnectionError("Couldn't reach 'grpoflow-tests/nowhere' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)

    with pytest.raises(DatasetError, match="cannot reach the Hugging Face Hub at ") as error:
        check_dataset("hf://datasets/grpoflow-tests/nowhere")

    assert "Couldn't reach 'grpoflow-tests/nowhere' on the Hub" in str(error.value)
    assert "\n" not in str(error.value)


def test_validate_lists_each_dataset_problem_on_its_own_line(tmp_path, capsys):
    """`grpoflow validate` on chat data with a whitespace-only question and a reward's column null: two problems,
    counted once ("2 problems", not "1 problem(s):" then "has 2 problems:"), each a line naming its row."""
    from grpoflow.flows.cli import main

    rows = [{**chat, "answer": "1"} for chat in CHAT[:3]]
    rows[1]["prompt"] = [{"role": "user", "content": "   "}]
    rows[2]["answer"] = None
    (tmp_path / "chats.jsonl").write_bytes(jsonl(*rows))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: chats\nbase_model: builtin:tiny\ndataset: {{uri: {tmp_path / 'chats.jsonl'}}}\n"
        "rewards: [{name: exact_answer}]\nevaluation: {holdout: 0}\n"
    )
    assert main(["validate", str(spec)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "grpoflow: spec rejected: 2 problems:", lines
    assert "user message that is empty or only whitespace" in lines[1] and "(row 2;" in lines[1]
    assert "column 'answer' (needed by reward 'exact_answer') is null in 1 row (row 3;" in lines[2]
    assert len(lines) == 3 and all(line.startswith("  - dataset: ") for line in lines[1:])


# --- a separate validation set (evaluation.dataset), saved as the eval split -----------------------------------------

QUESTIONS = [{"question": f"What is {i}*2?", "answer": str(i * 2)} for i in range(3)]


@pytest.mark.parametrize("kind", ["jsonl", "save_to_disk"])
def test_a_validation_set_is_saved_as_the_eval_split(tmp_path, dest, kind):
    write(tmp_path / "train.jsonl", ROWS)
    if kind == "jsonl":
        write(tmp_path / "validation.jsonl", QUESTIONS)
        vs = ValidationSet(str(tmp_path / "validation.jsonl"), "question", {"answer": "evaluation.metric"})
    else:  # a DatasetDict's split, as dataset.split picks one
        extra = datasets.Dataset.from_list(QUESTIONS[:1])
        datasets.DatasetDict({"train": extra, "validation": datasets.Dataset.from_list(QUESTIONS)}).save_to_disk(
            str(tmp_path / "saved")
        )
        vs = ValidationSet(str(tmp_path / "saved"), "question", {"answer": "evaluation.metric"}, split="validation")

    result = ingest_dataset(str(tmp_path / "train.jsonl"), dest, validation=vs)

    saved = load_ingested(dest)
    # Every training row is trained on, and the validation rows are the eval split, prompts under the training column.
    assert (result.num_train, result.num_eval) == (10, 3)
    assert saved["train"]["prompt"] == [row["prompt"] for row in ROWS]
    assert saved["eval"]["prompt"] == [row["question"] for row in QUESTIONS]
    assert saved["eval"]["answer"] == [row["answer"] for row in QUESTIONS]
    # The ingest's fingerprint covers both sources: a changed validation set is a different ingest.
    alone = ingest_dataset(str(tmp_path / "train.jsonl"), tmp_path / "alone").fingerprint
    assert result.fingerprint != alone
    if kind == "jsonl":
        write(tmp_path / "validation.jsonl", QUESTIONS[:2])
        again = ingest_dataset(str(tmp_path / "train.jsonl"), dest, validation=vs)
        assert again.num_eval == 2 and again.fingerprint != result.fingerprint


# (validation rows, ValidationSet arguments, ingest arguments, fragment of the one problem)
BAD_VALIDATION_SETS = [
    # chat prompts against a training set of text prompts
    pytest.param(CHAT, {}, {}, "evaluation.dataset.prompt_column: the validation set's prompts", id="format"),
    # the metric reads a column the validation set lacks
    pytest.param(
        [{"prompt": "1+1?"}],
        {"required_columns": {"answer": "evaluation.metric 'exact_answer'"}},
        {},
        "evaluation.dataset: dataset ",
        id="metric-column",
    ),
    # its prompt column is not there
    pytest.param(QUESTIONS, {}, {}, "evaluation.dataset: dataset ", id="prompt-column"),
    # saved under the training set's prompt column, which it already has for something else
    pytest.param(
        [{"question": "1+1?", "prompt": "x"}],
        {"prompt_column": "question"},
        {},
        "evaluation.dataset: ",
        id="prompt-column-clash",
    ),
    # one or the other: a holdout of the training set, or a validation set
    pytest.param(
        QUESTIONS, {"prompt_column": "question"}, {"holdout": 0.2}, "holdout=0.2 with the validation set", id="holdout"
    ),
]


@pytest.mark.parametrize("rows, vs_kwargs, kwargs, fragment", BAD_VALIDATION_SETS)
def test_a_bad_validation_set_is_rejected_and_leaves_nothing(tmp_path, dest, rows, vs_kwargs, kwargs, fragment):
    write(tmp_path / "train.jsonl", ROWS)
    write(tmp_path / "validation.jsonl", rows)
    vs = ValidationSet(str(tmp_path / "validation.jsonl"), **vs_kwargs)

    with pytest.raises(DatasetError) as error:
        ingest_dataset(str(tmp_path / "train.jsonl"), dest, validation=vs, **kwargs)

    assert len(error.value.problems) == 1 and error.value.problems[0].startswith(fragment), error.value.problems
    assert not dest.exists()


def test_validate_names_a_missing_validation_set(tmp_path, capsys):
    """`grpoflow validate`: a validation file that is not there is exit 2, naming evaluation.dataset.uri, before any
    model loads; one that is there and fits passes."""
    from grpoflow.flows.cli import main

    write(tmp_path / "train.jsonl", ROWS)
    spec = tmp_path / "spec.yaml"
    text = (
        f"name: valset\nbase_model: builtin:tiny\ndataset: {{uri: {tmp_path / 'train.jsonl'}}}\n"
        "rewards: [{name: exact_answer}]\n"
        f"evaluation: {{dataset: {{uri: {tmp_path / 'validation.jsonl'}, prompt_column: question}}}}\n"
    )
    spec.write_text(text)
    assert main(["validate", str(spec)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    missing = f"  - evaluation.dataset.uri: dataset not found: {tmp_path / 'validation.jsonl'}"
    assert lines[-2:] == ["grpoflow: spec rejected: 1 problem:", missing], lines

    write(tmp_path / "validation.jsonl", QUESTIONS)
    assert main(["validate", str(spec)]) == 0, capsys.readouterr().err


# --- Parquet read whole by Arrow, and the loader's and save's record batches ----------------------------------------


def test_a_parquet_file_over_the_in_memory_bound_goes_through_the_loader_alike(tmp_path, monkeypatch):
    """A small file is read by Arrow into memory, a large one by `datasets`' loader: the same rows and features
    (datasets' own, from the schema's metadata: a ClassLabel stays one), the same fingerprint."""
    source = tmp_path / "data.parquet"
    features = datasets.Features({"prompt": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict({"prompt": ["p0", "p1", "p2"], "label": [0, 1, 0]}, features).to_parquet(source)
    small = ingest_dataset(str(source), tmp_path / "small")
    monkeypatch.setattr(grpoflow.trainers.dataset, "PARQUET_IN_MEMORY_BYTES", 0)
    large = ingest_dataset(str(source), tmp_path / "large")

    a, b = load_ingested(tmp_path / "small")["train"], load_ingested(tmp_path / "large")["train"]
    assert a.features == b.features == features
    assert a.to_list() == b.to_list() == [{"prompt": f"p{i}", "label": i % 2} for i in range(3)]
    assert small == large


def test_a_corrupt_parquet_file_is_explained_by_the_loaders_failure(tmp_path, dest):
    source = tmp_path / "data.parquet"
    source.write_bytes(b"PAR1 not really parquet PAR1")

    with pytest.raises(DatasetError, match=r"could not read dataset .*data.parquet as parquet"):
        ingest_dataset(str(source), dest)
    assert not dest.exists()


@pytest.mark.parametrize("name", ["data.jsonl", "data.parquet"])
def test_rows_are_written_in_large_record_batches(tmp_path, dest, name):
    """`datasets` writes 1,000 rows per record batch unless `datasets.config.DEFAULT_MAX_BATCH_SIZE` says otherwise:
    the ingest has it write them 100,000 at a time (two thirds of a million-row Parquet ingest's time went to the
    per-batch work), and puts the default back."""
    source = tmp_path / name
    write(source, [{"prompt": f"What is {i}+7?", "answer": str(i + 7)} for i in range(2500)])
    default = datasets.config.DEFAULT_MAX_BATCH_SIZE

    ingest_dataset(str(source), dest)

    (arrow,) = (dest / "train").glob("*.arrow")
    with pa.memory_map(str(arrow)) as f:
        assert [batch.num_rows for batch in pa.ipc.open_stream(f)] == [2500]
    assert datasets.config.DEFAULT_MAX_BATCH_SIZE == default
