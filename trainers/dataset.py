"""Ingest a prompt dataset: load it from a file or the Hub, check it, and save it as Arrow in the job folder.

Sources: a local path, `file://`, `s3://bucket/key` (anything fsspec opens, with `storage_options`) or
`hf://datasets/<repo>[/<split>]`. Files are JSON Lines / JSON, CSV or Parquet (optionally compressed: `.jsonl.gz`);
a local folder written by `datasets`' `save_to_disk` (a Dataset, or a DatasetDict's `split`, default `train`) is read
with `datasets.load_from_disk`; a local Parquet file of up to `PARQUET_IN_MEMORY_BYTES` decoded is read whole by
Arrow (as `pandas.read_parquet` reads it). Every other source goes through `datasets.load_dataset`. Checks run on
the Arrow table with `pyarrow.compute`, never row by row: a million short rows take a fraction of a second. Only when
the loader fails is the file read again, line by line, to name the lines at fault.

Pure functions, no Prefect: `tasks/ingest.py` wraps `ingest_dataset` in a Prefect task. By hand:

    python -c 'from pathlib import Path; from grpoflow.trainers.dataset import ingest_dataset;
               print(ingest_dataset("examples/data/arithmetic.jsonl", Path("/tmp/job/dataset"), holdout=0.1))'
"""

from __future__ import annotations

import collections
import contextlib
import csv
import gzip
import hashlib
import json
import logging
import lzma
import math
import os
import shutil
import tempfile
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import datasets
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import LocalEntryNotFoundError

from grpoflow.core.errors import DatasetError
from grpoflow.core.jobdir import replace_dir
from grpoflow.trainers.columns import check_columns
from grpoflow.trainers.model.hub import hub_not_answering, hub_offline
from grpoflow.trainers.row_size import check_lines
from grpoflow.trainers.sources import Source, has_data_extension, resolve_source

# The JSON loader parses its first chunk a second time in Python (ujson) to find fields whose type varies; with its
# 10 MB default that costs ~0.7 s per ingest. With 1 MB chunks it costs a tenth; later chunks are cast to the first
# chunk's types, so a number among strings further down becomes a string rather than making the column JSON.
JSON_CHUNKSIZE = 1 << 20
# Rows per Arrow record batch as the loader and `save_to_disk` write them. `datasets` writes 1,000 at a time by
# default, and each batch costs it a schema cast and an embedding pass in Python (~0.7 ms): two thirds of a million-row
# Parquet ingest. It still caps each batch at ~100 MB of data by itself (`get_writer_batch_size_from_data_size`), so
# long rows keep small batches. The knob is `datasets.config.DEFAULT_MAX_BATCH_SIZE` (named in its API reference as
# the default of `to_parquet`'s and `to_json`'s batch_size); `tests/trainers/test_dataset.py` checks it takes effect.
WRITER_BATCH_ROWS = 100_000
# A local Parquet file of at most this many bytes of decoded data (its footer says) is read whole by Arrow's
# multi-threaded reader into memory, as `pandas.read_parquet` does; `datasets`' Parquet loader decodes each row group
# on one thread and copies the rows into an Arrow cache file first (half of a million-row ingest). Larger files go
# through the loader, whose memory-mapped cache keeps memory flat.
PARQUET_IN_MEMORY_BYTES = 256 << 20
MAX_BAD_LINES = 3
# What a loader raises because of a file's content (explained to the user as a DatasetError). Anything else, a
# network error or a bug, propagates as is, so that the task's retries and tracebacks see it.
_DATA_ERRORS = (
    ValueError,  # ArrowInvalid, UnicodeDecodeError, pandas' ParserError and EmptyDataError, JSONDecodeError
    StopIteration,  # the JSON loader on a file with no lines
    EOFError,  # a truncated .gz or .xz
    gzip.BadGzipFile,
    zlib.error,
    lzma.LZMAError,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
)


@dataclass
class IngestResult:
    """What `ingest_dataset` saved.

    Args:
        uri (`str`): the source, as given.
        num_train (`int`): rows in the `train` split.
        num_eval (`int`): rows in the `eval` split (0 without holdout).
        columns (`list[str]`): the dataset's columns.
        prompt_format (`str`): `"text"` (string prompts) or `"chat"` (lists of `{role, content}` messages).
        fingerprint (`str`): sha256 hex of the source bytes for local files; of the object's etag, size and mtime
            for remote files; of the Hub dataset's fingerprint for `hf://datasets/` repos, and of the saved one's for
            a `save_to_disk` folder. A cache key.
    """

    uri: str
    num_train: int
    num_eval: int
    columns: list[str]
    prompt_format: str
    fingerprint: str


@dataclass(frozen=True)
class ValidationSet:
    """A separate validation set (the spec's `evaluation.dataset`), ingested as the `eval` split instead of a holdout.

    Args:
        uri (`str`): as `ingest_dataset`'s.
        prompt_column (`str`, *optional*, defaults to `"prompt"`): its prompt column, saved under the training set's.
        required_columns (`dict[str, str]`, *optional*): the columns the held-out metric reads, each with who reads it.
        split (`str`, *optional*), storage_options (`dict`, *optional*), max_row_bytes (`int`, *optional*): as
            `ingest_dataset`'s.
    """

    uri: str
    prompt_column: str = "prompt"
    required_columns: dict[str, str] | None = None
    split: str | None = None
    storage_options: dict | None = None
    max_row_bytes: int = 1_000_000


# --- checking the file is there ----------------------------------------------------------------------------------


def _check_file(src: Source, storage_options: dict | None) -> None:
    if src.location.lower().startswith("hf://") and hub_offline():
        raise _hub_unreachable(src)  # fsspec's HfFileSystem would only say "not found"
    fs, path = fsspec.core.url_to_fs(src.location, **(storage_options or {}))
    try:
        if not fs.exists(path):
            raise DatasetError(f"dataset not found: {src.uri}")
        if fs.isdir(path):
            raise DatasetError(f"dataset {src.uri} is a directory; give the path of one data file")
        if src.is_local and not os.path.isfile(path):
            # Opening a named pipe waits for a writer forever.
            raise DatasetError(f"dataset {src.uri} is not a regular file (a pipe, socket or device)")
        if src.is_local and not has_data_extension(os.path.realpath(path)):
            # A link named data.csv to /etc/shadow: its lines would come back in the errors about its "columns".
            raise DatasetError(
                f"dataset {src.uri} is a link to {os.path.realpath(path)}, which is not a data file (.jsonl, .json, "
                ".csv, .parquet); link the data file itself"
            )
        with fs.open(path, "rb"):
            size = fs.size(path)
    except PermissionError as e:
        raise DatasetError(f"dataset {src.uri} cannot be read (permission denied); check its permissions") from e
    if size == 0:
        raise DatasetError(f"dataset {src.uri} has no rows (the file is empty)")


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fingerprint(src: Source, ds: datasets.Dataset, storage_options: dict | None) -> str:
    if src.builder in ("hub", "disk"):
        # The content of the Arrow files the rows were loaded into (or saved as): the same bytes for the same rows.
        files = [_file_digest(cache_file["filename"]) for cache_file in ds.cache_files]
        return hashlib.sha256("\n".join([src.location, str(src.split), *files]).encode()).hexdigest()
    if src.is_local:
        return _file_digest(src.location)
    # Hashing remote bytes would mean a second download; the store's own change markers are enough for a cache key.
    fs, path = fsspec.core.url_to_fs(src.location, **(storage_options or {}))
    info = fs.info(path)
    keys = ("ETag", "etag", "blob_id", "size", "LastModified", "last_modified", "mtime")
    marker = {k: info[k] for k in keys if info.get(k) is not None}
    return hashlib.sha256(json.dumps([src.location, marker], sort_keys=True, default=str).encode()).hexdigest()


# --- loading, and explaining why a load failed -------------------------------------------------------------------


# The json builder logs "Failed to load JSON from file ..." at ERROR before raising; the raise is explained below,
# naming the lines, so that line would only say the same thing twice, worse.
JSON_READER_LOGGER = "datasets.packaged_modules.json.json"


@contextlib.contextmanager
def _quiet(logger_name: str):
    """Silences one library logger for the block (its level restored after)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _large_batches():
    """Has `datasets` write `WRITER_BATCH_ROWS` rows per record batch in the block (its default restored after)."""
    default = datasets.config.DEFAULT_MAX_BATCH_SIZE
    datasets.config.DEFAULT_MAX_BATCH_SIZE = max(default, WRITER_BATCH_ROWS)
    try:
        yield
    finally:
        datasets.config.DEFAULT_MAX_BATCH_SIZE = default


def _load(src: Source, cache_dir: str, storage_options: dict | None) -> datasets.Dataset:
    with _large_batches():
        return _load_source(src, cache_dir, storage_options)


def _load_source(src: Source, cache_dir: str, storage_options: dict | None) -> datasets.Dataset:
    if src.builder == "disk":
        return _load_saved(src)
    if src.builder == "hub":
        if (refused := hub_not_answering()) is not None:
            raise _hub_unreachable(src, refused)
        try:
            return datasets.load_dataset(
                src.location, split=src.split, cache_dir=cache_dir, storage_options=storage_options
            )
        except datasets.exceptions.DatasetNotFoundError as e:
            raise DatasetError(f"dataset not found: {src.uri} ({e})") from e
        except (ConnectionError, LocalEntryNotFoundError) as e:  # offline, or the Hub not reached after 5 tries
            raise _hub_unreachable(src, e) from e
        except ValueError as e:  # an unknown split, or files the Hub loader cannot read
            raise DatasetError(f"could not load {src.uri}: {e}") from e
    if src.builder == "parquet" and src.is_local and (ds := _read_parquet(src.location)) is not None:
        return ds
    kwargs = {"chunksize": JSON_CHUNKSIZE} if src.builder == "json" else {}
    data_files = src.location
    if not src.is_local:
        # `datasets` refuses every URL in offline mode (HF_HUB_OFFLINE=1, usual on an air-gapped worker that still
        # reaches its S3 store), so the file is fetched through fsspec first; it is downloaded once either way.
        fs, path = fsspec.core.url_to_fs(src.location, **(storage_options or {}))
        os.makedirs(source := os.path.join(cache_dir, "source"), exist_ok=True)
        data_files = os.path.join(source, path.rsplit("/", 1)[-1])
        fs.get_file(path, data_files)
    try:
        with _quiet(JSON_READER_LOGGER):
            return datasets.load_dataset(
                src.builder,
                data_files=data_files,  # a local file by now, so no storage_options (`datasets` would add to them)
                split="train",
                cache_dir=cache_dir,
                **kwargs,
            )
    except Exception as e:
        if not isinstance(_root_cause(e), _DATA_ERRORS):
            raise
        raise _diagnose(src, e, storage_options) from e


def _read_parquet(path: str) -> datasets.Dataset | None:
    """The rows of a local Parquet file of at most `PARQUET_IN_MEMORY_BYTES` decoded, held in memory; None for a
    larger file or one Arrow cannot read (the loader reads it then, and its failure is explained like any other)."""
    try:
        footer = pq.read_metadata(path)
        if sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups)) > PARQUET_IN_MEMORY_BYTES:
            return None
        table = pq.read_table(path)
    except (pa.ArrowException, OSError):
        return None
    # Features from the schema, as the loader takes them; the file's digest as `datasets`' fingerprint (without one it
    # would hash the whole table, 0.2 s a million rows).
    return datasets.Dataset(datasets.table.InMemoryTable(table), fingerprint=_file_digest(path))


def _load_saved(src: Source) -> datasets.Dataset:
    """The Dataset of a folder `save_to_disk` wrote, or the split `src.split` (default `train`) of a DatasetDict's."""
    try:
        saved = datasets.load_from_disk(src.location)
    except (OSError, ValueError, KeyError) as e:  # a folder with the markers but torn or foreign files
        raise DatasetError(
            f"could not load dataset {src.uri} with datasets.load_from_disk: {type(e).__name__}: {e}"
        ) from e
    if isinstance(saved, datasets.Dataset):
        if src.split is not None:
            raise DatasetError(
                f"dataset {src.uri} is one saved Dataset, without splits; remove dataset.split ({src.split!r})"
            )
        return saved
    split = src.split or "train"
    if split not in saved:
        raise DatasetError(
            f"dataset {src.uri} (a saved DatasetDict) has no split {split!r}; its splits are "
            f"{', '.join(map(repr, saved))}: set dataset.split to one of them"
        )
    return saved[split]


def _hub_unreachable(src: Source, error: BaseException | None = None) -> DatasetError:
    """The one-line reason an hf:// dataset cannot be read here: the Hub is offline (HF_HUB_OFFLINE), or was not
    reached (`error`, after `datasets`' own retries)."""
    repo = "/".join(src.uri.split("://", 1)[1].split("/")[1:3])
    local = f"hf download --repo-type dataset {repo} --local-dir DIR"
    if hub_offline():
        return DatasetError(
            f"dataset {src.uri}: the Hugging Face Hub is offline (HF_HUB_OFFLINE=1), and hf:// datasets are read "
            f"from the Hub at each ingest, not from a local cache; where it is reachable, download the files "
            f"({local}) and give one of them as dataset.uri, or unset HF_HUB_OFFLINE"
        )
    cause = f"{type(error).__name__}: {error}" if error is not None else "no answer"
    return DatasetError(
        f"dataset {src.uri}: cannot reach the Hugging Face Hub at {hf_constants.ENDPOINT} ({cause}); check the "
        f"network (and HF_ENDPOINT), or download the files where the Hub is reachable ({local}) and give one of "
        "them as dataset.uri"
    )


def _root_cause(e: BaseException) -> BaseException:
    while (inner := e.__cause__ or e.__context__) is not None and inner is not e:
        e = inner
    return e


def _diagnose(src: Source, error: Exception, storage_options: dict | None) -> DatasetError:
    """Turns a failed load into a message that names the lines at fault, re-reading the file only now."""
    if src.builder == "parquet":
        if _parquet_rows(src, storage_options) == 0:
            return DatasetError(f"dataset {src.uri} has no rows")
    else:
        try:
            problems, data_lines = _scan_lines(src, storage_options)
        except _DATA_ERRORS:  # e.g. a truncated .gz, which the loader's own message names
            problems, data_lines = [], -1
        if problems:
            return _lines_error(src, problems)
        if 0 <= data_lines <= (1 if src.builder == "csv" else 0):  # a CSV header alone has no rows either
            return DatasetError(f"dataset {src.uri} has no rows")
    root = _root_cause(error)
    return DatasetError(f"could not read dataset {src.uri} as {src.builder}: {type(root).__name__}: {root}")


def _parquet_rows(src: Source, storage_options: dict | None) -> int | None:
    try:
        with fsspec.open(src.location, "rb", **(storage_options or {})) as f:
            return pq.ParquetFile(f).metadata.num_rows
    except (pa.ArrowException, OSError):
        return None  # not Parquet at all: the loader's own message says so


def _scan_lines(src: Source, storage_options: dict | None) -> tuple[list[str], int]:
    """Streams the file line by line; returns up to MAX_BAD_LINES problems and the count of non-blank lines."""
    problems, data_lines, check_json = [], 0, src.builder == "json"
    with fsspec.open(src.location, "rb", compression="infer", **(storage_options or {})) as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM, which the loader strips too
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                problems.append(f"line {lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
            else:
                if not text.strip():
                    continue
                data_lines += 1
                if data_lines == 1 and text.lstrip().startswith("["):
                    check_json = False  # a JSON array, not JSON Lines: its lines are not documents
                if check_json and (problem := _json_line_problem(text)):
                    problems.append(f"line {lineno}: {problem}")
            if len(problems) == MAX_BAD_LINES:
                break
    return problems, data_lines


def _finite_float(text: str) -> float:
    # Python reads 1e999 as inf; Arrow's reader refuses it ("Number too big to be stored in double").
    if math.isinf(value := float(text)):
        raise ValueError(f"number {text} is too large for a double")
    return value


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    # Arrow's reader refuses a key given twice in one object; pandas, which `datasets` tries next, says only
    # "Trailing data at position 55".
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} appears twice in one object; keep one")
        seen.add(key)
    return dict(pairs)


def _json_line_problem(text: str) -> str | None:
    try:
        value = json.loads(text, parse_float=_finite_float, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        return f"invalid JSON ({e.msg})"
    except ValueError as e:
        return str(e)
    if not isinstance(value, dict):
        return f"not a JSON object (got {_JSON_KINDS.get(type(value), 'null')})"
    return None


def _lines_error(src: Source, problems: list[str]) -> DatasetError:
    kind = "JSON Lines (one {...} object per line)" if src.builder == "json" else "UTF-8 CSV"
    more = f"\n  (stopped at the first {MAX_BAD_LINES} bad lines)" if len(problems) == MAX_BAD_LINES else ""
    listing = "\n".join(f"  {p}" for p in problems)
    return DatasetError(f"dataset {src.uri} is not valid {kind}; fix these lines:\n{listing}{more}")


def _check_loaded(src: Source, ds: datasets.Dataset, storage_options: dict | None) -> None:
    if ds.num_rows == 0:
        raise DatasetError(f"dataset {src.uri} has no rows")
    try:
        # The JSON reader passes invalid UTF-8 through into string columns; a full validation catches it (~20 ms
        # per million rows).
        ds.with_format("arrow")[:].validate(full=True)
    except pa.ArrowInvalid as e:
        if src.builder in ("json", "csv") and (problems := _scan_lines(src, storage_options)[0]):
            raise _lines_error(src, problems) from e
        raise DatasetError(f"dataset {src.uri} holds text that is not valid UTF-8, or corrupt data: {e}") from e


# --- holdout and saving ------------------------------------------------------------------------------------------


def _check_holdout(holdout: float, uri: str) -> None:
    if not (math.isfinite(holdout) and holdout >= 0) or (holdout >= 1 and holdout != int(holdout)):
        raise DatasetError(f"holdout={holdout} for dataset {uri}: give a fraction in [0, 1) or a whole number of rows")


def _split(ds: datasets.Dataset, holdout: float, seed: int, uri: str) -> datasets.DatasetDict:
    if holdout == 0:
        return datasets.DatasetDict({"train": ds})
    num_eval = math.ceil(holdout * ds.num_rows) if holdout < 1 else int(holdout)  # as `train_test_split` rounds
    if num_eval >= ds.num_rows:
        raise DatasetError(
            f"holdout={holdout} leaves no training rows: dataset {uri} has {ds.num_rows}; lower the holdout"
        )
    split = ds.train_test_split(test_size=num_eval, seed=seed)
    return datasets.DatasetDict({"train": split["train"], "eval": split["test"]})


def _save_atomic(splits: datasets.DatasetDict, dest: Path) -> None:
    """Saves beside `dest`, then swaps it in, so `dest` is either absent, the old folder, or the complete new one."""
    # Not `mkdtemp`: its 0700 mode would stick to `dest` after the rename.
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex}")
    tmp.mkdir()
    try:
        with _large_batches():
            splits.save_to_disk(str(tmp))
        replace_dir(tmp, dest)  # a retried task replaces the earlier ingest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _validation_split(
    vs: ValidationSet, cache: str, prompt_column: str, prompt_format: str | None
) -> tuple[datasets.Dataset, str]:
    """The validation set loaded and checked as the training set is, its prompts in the training set's column (of
    the training set's format, unless that is None: not known), and its fingerprint. Problems name the spec field."""
    problems = []
    try:
        src = _checked_source(vs.uri, vs.split, 0.0, vs.storage_options, vs.max_row_bytes)
        ds = _load(src, cache, vs.storage_options)
        _check_loaded(src, ds, vs.storage_options)
        found = check_columns(vs.uri, ds.with_format("arrow")[:], vs.prompt_column, vs.required_columns)
    except DatasetError as e:
        problems = [
            f"evaluation.dataset{'.uri' if p.startswith('dataset not found') else ''}: {p}" for p in e.problems
        ]
    if not problems and prompt_format is not None and found != prompt_format:
        problems.append(
            f"evaluation.dataset.prompt_column: the validation set's prompts ('{vs.prompt_column}' in {vs.uri}) are "
            f"{found} prompts, the training set's are {prompt_format} prompts; give both the same format"
        )
    if not problems and vs.prompt_column != prompt_column and prompt_column in ds.column_names:
        problems.append(
            f"evaluation.dataset: {vs.uri} has a column '{prompt_column}' besides its prompt column "
            f"'{vs.prompt_column}'; its prompts are saved under the training set's prompt column: rename or drop it"
        )
    if problems:
        raise DatasetError("\n".join(problems), problems)
    if vs.prompt_column != prompt_column:
        ds = ds.rename_column(vs.prompt_column, prompt_column)
    return ds, _fingerprint(src, ds, vs.storage_options)


def check_validation_set(vs: ValidationSet, prompt_column: str, prompt_format: str | None) -> int:
    """Loads and checks a validation set exactly as `ingest_dataset(validation=vs)` does, but saves nothing.

    Args:
        vs (`ValidationSet`): the validation set.
        prompt_column (`str`): the training set's prompt column.
        prompt_format (`str` or `None`): the training set's prompt format; None skips that comparison.

    Returns:
        `int`: its rows. Raises `DatasetError` (each problem naming `evaluation.dataset`) as `ingest_dataset` does.
    """
    with tempfile.TemporaryDirectory(prefix="grpoflow-check-", ignore_cleanup_errors=True) as cache:
        return _validation_split(vs, cache, prompt_column, prompt_format)[0].num_rows


# --- the entry points --------------------------------------------------------------------------------------------


def _checked_source(
    uri: str, split: str | None, holdout: float, storage_options: dict | None, max_row_bytes: int
) -> Source:
    """The source of `uri`, checked before any loader reads it: the holdout, the file, and its lines' size."""
    src = resolve_source(uri, split)
    _check_holdout(holdout, uri)
    if src.builder == "hub" and hub_offline():
        # `datasets` would look in this ingest's private cache, always empty, after a traceback's worth of tries.
        raise _hub_unreachable(src)
    if src.builder not in ("hub", "disk"):
        _check_file(src, storage_options)
    if src.builder in ("json", "csv"):
        try:
            check_lines(src, max_row_bytes, storage_options)
            if src.builder == "csv":
                _check_csv_header(src, storage_options)
        except (EOFError, OSError, zlib.error, lzma.LZMAError):
            pass  # a corrupt or truncated archive: the loader fails on it too, and its diagnosis names the problem
    return src


def _check_csv_header(src: Source, storage_options: dict | None) -> None:
    """Refuses a CSV header that names a column twice: pandas, under `datasets`' CSV loader, would rename the second
    `prompt.1` and load both without a word, so a reward could read the wrong one."""
    with fsspec.open(src.location, "rb", compression="infer", **(storage_options or {})) as f:
        first = f.readline()  # at most max_row_bytes long, `check_lines` saw to that
    try:
        header = next(csv.reader([first.removeprefix(b"\xef\xbb\xbf").decode("utf-8")]), [])
    except (UnicodeDecodeError, csv.Error):
        return  # the loader fails on it, and its diagnosis names the line
    repeated = [name for name, count in collections.Counter(header).items() if count > 1]
    if repeated:
        raise DatasetError(
            f"dataset {src.uri}: the CSV header repeats column(s) {', '.join(map(repr, repeated))}; the loader would "
            f"rename the repeats ('{repeated[0]}.1') and read both: rename or drop them"
        )


def ingest_dataset(
    uri: str,
    dest: Path,
    *,
    prompt_column: str = "prompt",
    required_columns: dict[str, str] | None = None,
    holdout: float = 0.0,
    seed: int = 42,
    split: str | None = None,
    storage_options: dict | None = None,
    max_row_bytes: int = 1_000_000,
    validation: ValidationSet | None = None,
) -> IngestResult:
    """Loads a prompt dataset, checks it, and saves it to `dest` as a `DatasetDict`: `train`, and `eval` with holdout
    or a validation set.

    Every problem with the data is reported at once as one `DatasetError`; nothing is written to `dest` then.

    Args:
        uri (`str`):
            A local path, `file:///path`, `s3://bucket/key`, or `hf://datasets/<owner>/<name>[/<split>]`. Files are
            `.jsonl`/`.json`, `.csv` or `.parquet` (JSON and CSV may be compressed, e.g. `.jsonl.gz`); a local
            folder may be one `datasets`' `save_to_disk` wrote.
        dest (`Path`):
            The folder to save to (created; replaced if it exists). Temporary files go beside it.
        prompt_column (`str`, *optional*, defaults to `"prompt"`):
            The column of prompts: strings, or lists of `{"role", "content"}` messages.
        required_columns (`dict[str, str]`, *optional*):
            Further columns that must exist without nulls, each mapped to who needs it, for the message
            (e.g. `{"answer": "reward 'exact_answer'"}`).
        holdout (`float`, *optional*, defaults to `0.0`):
            Rows held out as the `eval` split: a fraction if below 1, else a row count. 0 means no `eval` split.
        seed (`int`, *optional*, defaults to `42`):
            Seed of the holdout shuffle; the same seed and data give the same split.
        split (`str`, *optional*):
            The split of an `hf://datasets/` repo or of a saved DatasetDict (default `"train"`); not allowed with
            files.
        storage_options (`dict`, *optional*):
            fsspec options for remote sources (e.g. `{"key": ..., "secret": ..., "endpoint_url": ...}` for s3).
        max_row_bytes (`int`, *optional*, defaults to `1_000_000`):
            The longest line a JSON Lines or CSV file may have; checked by streaming the file before it is parsed.
            Lines nested more than `row_size.MAX_JSON_NESTING` levels deep are rejected by the same pass.
        validation (`ValidationSet`, *optional*):
            A separate validation set, checked as the dataset is, saved as the `eval` split (needs holdout 0).

    Returns:
        `IngestResult`: row counts, columns, prompt format and a fingerprint of the source (of both sources with a
        validation set).
    """
    dest = Path(dest)
    src = _checked_source(uri, split, holdout, storage_options, max_row_bytes)
    if validation is not None and holdout != 0:
        raise DatasetError(f"holdout={holdout} with the validation set {validation.uri}: give one or the other")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A private cache beside `dest` keeps ~/.cache clean and goes away with the loader's intermediate Arrow files.
    with tempfile.TemporaryDirectory(
        dir=dest.parent, prefix=f".{dest.name}.cache-", ignore_cleanup_errors=True
    ) as cache:
        ds = _load(src, cache, storage_options)
        _check_loaded(src, ds, storage_options)
        prompt_format = check_columns(uri, ds.with_format("arrow")[:], prompt_column, required_columns)
        splits = _split(ds, holdout, seed, uri)
        fingerprint = _fingerprint(src, ds, storage_options)
        if validation is not None:
            splits["eval"], eval_fingerprint = _validation_split(validation, cache, prompt_column, prompt_format)
            fingerprint = hashlib.sha256(f"{fingerprint}\n{eval_fingerprint}".encode()).hexdigest()
        _save_atomic(splits, dest)
    return IngestResult(
        uri=uri,
        num_train=splits["train"].num_rows,
        num_eval=splits["eval"].num_rows if "eval" in splits else 0,
        columns=list(ds.column_names),
        prompt_format=prompt_format,
        fingerprint=fingerprint,
    )


def check_dataset(
    uri: str,
    *,
    prompt_column: str = "prompt",
    required_columns: dict[str, str] | None = None,
    holdout: float = 0.0,
    seed: int = 42,
    split: str | None = None,
    storage_options: dict | None = None,
    max_row_bytes: int = 1_000_000,
    sample_rows: int = 4,
) -> tuple[str, datasets.Dataset]:
    """Loads and checks a prompt dataset exactly as `ingest_dataset` does, but saves nothing (the preflight check).

    Takes `ingest_dataset`'s arguments (less `dest`) and raises the same `DatasetError`. The loader's files go to a
    temporary folder that is removed before it returns.

    Args:
        sample_rows (`int`, *optional*, defaults to `4`): how many of the training rows to return.

    Returns:
        `tuple[str, datasets.Dataset]`: the prompt format (`"text"` or `"chat"`) and the first `sample_rows` rows of
        the `train` split the ingest would save (the rows its reward dry run sees), held in memory.
    """
    src = _checked_source(uri, split, holdout, storage_options, max_row_bytes)
    with tempfile.TemporaryDirectory(prefix="grpoflow-check-", ignore_cleanup_errors=True) as cache:
        ds = _load(src, cache, storage_options)
        _check_loaded(src, ds, storage_options)
        prompt_format = check_columns(uri, ds.with_format("arrow")[:], prompt_column, required_columns)
        train = _split(ds, holdout, seed, uri)["train"]
        # Copied out of the loader's memory-mapped files, which go away with the temporary folder.
        rows = train.select(range(min(sample_rows, len(train)))).to_list()
        sample = datasets.Dataset.from_list(rows, train.features)
    return prompt_format, sample


def read_dataset(
    uri: str,
    *,
    prompt_column: str = "prompt",
    split: str | None = None,
    storage_options: dict | None = None,
    max_row_bytes: int = 1_000_000,
    rows: int | None = None,
) -> datasets.Dataset:
    """Loads and checks a prompt dataset as `ingest_dataset` does, whole and in its own row order (no hold-out split),
    and returns its first `rows` rows (all when None) held in memory; saves nothing.

    Raises:
        DatasetError: as `ingest_dataset`.
    """
    src = _checked_source(uri, split, 0.0, storage_options, max_row_bytes)
    with tempfile.TemporaryDirectory(prefix="grpoflow-read-", ignore_cleanup_errors=True) as cache:
        ds = _load(src, cache, storage_options)
        _check_loaded(src, ds, storage_options)
        check_columns(uri, ds.with_format("arrow")[:], prompt_column, None)
        kept = ds.select(range(min(rows, len(ds)))) if rows is not None else ds
        return datasets.Dataset.from_list(kept.to_list(), kept.features)


def load_ingested(dest: Path) -> datasets.DatasetDict:
    """Loads what `ingest_dataset` saved.

    Args:
        dest (`Path`): the folder given to `ingest_dataset`.

    Returns:
        `datasets.DatasetDict`: `train`, and `eval` when the ingest held rows out.
    """
    return datasets.load_from_disk(str(dest))
