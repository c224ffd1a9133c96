"""The row-size guard of the dataset ingest (`grpoflow.trainers.dataset`): a JSON Lines or CSV file is streamed, before
any loader parses it, and its first line longer than `max_row_bytes` or nested deeper than the JSON loader takes is
rejected, naming the line. By hand:

    python -c 'from grpoflow.trainers.row_size import check_lines; import grpoflow.trainers.sources as s;
               check_lines(s.resolve_source("examples/data/arithmetic.jsonl", None), 1_000_000, None)'
"""

import re

import fsspec
import numpy as np

from grpoflow.core.errors import DatasetError
from grpoflow.trainers.sources import Source

# JSON Lines and CSV files are streamed in chunks of this size before the loader sees them, so a line over
# `max_row_bytes` is rejected after reading that much of it, never the whole line (which the loader would buffer).
SCAN_CHUNK = 1 << 20
# A JSON document ([...]) cannot be streamed row by row: the loader parses it whole, taking several times its size in
# memory. So the row-size guard holds it as a whole, to as many bytes as this many maximal rows (16 MB by default);
# larger data belongs in JSON Lines.
JSON_DOCUMENT_ROWS = 16
# Arrow's JSON reader gives up at 64 levels; deeper lines make `datasets` recurse in Python (RecursionError from ~1,000
# levels) and overflow the C stack of Arrow's parser (a segfault, from ~30,000). The same scan stops them first.
MAX_JSON_NESTING = 64


def check_lines(src: Source, max_row_bytes: int, storage_options: dict | None) -> None:
    """Streams a JSON Lines or CSV file and rejects its first line longer than `max_row_bytes` or nested too deeply.

    Holds one chunk and the line in progress (at most `max_row_bytes`); numpy finds the newlines, so a million short
    rows cost ~50 ms. A JSON document (`[...]`) has lines that are not rows, and the loader reads it whole: it is
    held to `JSON_DOCUMENT_ROWS` times `max_row_bytes` as a whole instead.
    """
    json_lines = src.builder == "json"
    lineno, pending, pending_len = 1, [], 0  # the line in progress: its number and its bytes so far
    with fsspec.open(src.location, "rb", compression="infer", **(storage_options or {})) as f:
        chunk = f.read(SCAN_CHUNK)
        if json_lines and re.match(rb"(?:\xef\xbb\xbf)?\s*\[", chunk):
            _check_document_size(src, f, len(chunk), max_row_bytes)
            return
        while chunk:
            arr = np.frombuffer(chunk, np.uint8)
            ends = np.flatnonzero(arr == ord("\n"))
            if len(ends) == 0:
                pending.append(chunk)
                pending_len += len(chunk)
                if pending_len > max_row_bytes:
                    raise _long_line(src, lineno, max_row_bytes)
            else:
                _check_line(src, b"".join([*pending, chunk[: ends[0]]]), lineno, max_row_bytes, json_lines)
                # The lines wholly inside this chunk: lengths first, then nesting for lines that could be deep.
                too_long = np.flatnonzero(np.diff(ends) - 1 > max_row_bytes)
                if len(too_long):
                    raise _long_line(src, lineno + 1 + int(too_long[0]), max_row_bytes)
                for i in _maybe_deep(arr, ends) if json_lines else ():
                    _check_line(src, chunk[ends[i] + 1 : ends[i + 1]], lineno + 1 + int(i), max_row_bytes, True)
                lineno += len(ends)
                pending = [chunk[ends[-1] + 1 :]]
                pending_len = len(pending[0])
            chunk = f.read(SCAN_CHUNK)
    _check_line(src, b"".join(pending), lineno, max_row_bytes, json_lines)


def _check_document_size(src: Source, f, read: int, max_row_bytes: int) -> None:
    """Rejects a JSON document over `JSON_DOCUMENT_ROWS * max_row_bytes` bytes (uncompressed), counted by reading at
    most that far."""
    limit = JSON_DOCUMENT_ROWS * max_row_bytes
    while read <= limit and (chunk := f.read(SCAN_CHUNK)):
        read += len(chunk)
    if read > limit:
        raise DatasetError(
            f"dataset {src.uri}: a JSON document (one [...] array) is read whole, not row by row, so it may hold at "
            f"most {JSON_DOCUMENT_ROWS} x max_row_bytes = {limit:,} bytes, and this one is larger; convert it to JSON "
            "Lines (.jsonl, one object per line: streamed, each line held to max_row_bytes), or raise "
            "dataset.max_row_bytes in the job spec"
        )


def _maybe_deep(arr: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Indices i of the lines between ends[i] and ends[i + 1] with more than MAX_JSON_NESTING '[' and '{' in all."""
    long = np.flatnonzero(np.diff(ends) > MAX_JSON_NESTING)
    if len(long) == 0:
        return long
    opens = np.flatnonzero((arr | 0x20) == ord("{"))  # "[" is 0x5b, "{" is 0x7b
    counts = np.searchsorted(opens, ends[long + 1]) - np.searchsorted(opens, ends[long])
    return long[counts > MAX_JSON_NESTING]


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = np.zeros(256, np.int8)
_BRACKETS[[ord("["), ord("{")]], _BRACKETS[[ord("]"), ord("}")]] = 1, -1


def _check_line(src: Source, line: bytes, lineno: int, max_row_bytes: int, json_lines: bool) -> None:
    if len(line) > max_row_bytes:
        raise _long_line(src, lineno, max_row_bytes)
    if not json_lines or line.count(b"[") + line.count(b"{") <= MAX_JSON_NESTING:
        return
    structure = _JSON_STRING.sub(b"", line)  # brackets inside strings do not nest
    depth = int(np.cumsum(_BRACKETS[np.frombuffer(structure, np.uint8)], dtype=np.int64).max(initial=0))
    if depth > MAX_JSON_NESTING:
        raise DatasetError(
            f"dataset {src.uri}: line {lineno} nests JSON {depth} levels deep; the loader takes at most "
            f"{MAX_JSON_NESTING}, so flatten that row"
        )


def _long_line(src: Source, lineno: int, max_row_bytes: int) -> DatasetError:
    return DatasetError(
        f"dataset {src.uri}: line {lineno} is longer than max_row_bytes={max_row_bytes:,} bytes; shorten or drop "
        "that row, or raise dataset.max_row_bytes in the job spec"
    )
