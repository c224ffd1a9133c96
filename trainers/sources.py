"""Where a dataset URI points, resolved without reading it: a local file or folder, `file://`, `s3://` (anything
fsspec opens) or `hf://datasets/<repo>[/<split>]`, and which `datasets` builder reads it (`json`, `csv`, `parquet`,
`hub`, or `disk` for a `save_to_disk` folder). A URI no builder reads is a `DatasetError` naming what is supported."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from grpoflow.core.errors import DatasetError
from grpoflow.core.spec import REPO_ID_PATTERN
from grpoflow.core.uris import CHAINED, url_scheme

SUPPORTED_SCHEMES = ("local path", "file://", "s3://", "hf://datasets/")
# The files `save_to_disk` writes at the top of its folder: a Dataset's (state.json) or a DatasetDict's.
SAVED_MARKERS = ("state.json", "dataset_dict.json")
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
# Compressed text files are extracted by `datasets`; a compressed Parquet file makes no sense, so not for it.
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


@dataclass
class Source:
    uri: str  # as the user gave it, for messages
    location: str  # local absolute path, remote URL, or Hub repo id
    builder: str  # "json", "csv", "parquet", "hub", or "disk" (a save_to_disk folder)
    split: str | None = "train"  # of a Hub dataset, or of a saved DatasetDict (None: train)

    @property
    def is_local(self) -> bool:
        return self.builder != "hub" and "://" not in self.location


def resolve_source(uri: str, split: str | None) -> Source:
    if CHAINED.search(uri):  # fsspec would open `/x/cache::http://host/...`'s second half as a URL
        raise DatasetError(f"{uri}: a chained URL (fsspec's `cache::s3://...`) is refused: give the store's own URL")
    src = _resolve_hf(uri, split) if uri.lower().startswith("hf://") else _resolve_file(uri)
    if src.builder == "disk":
        src.split = split
    elif split is not None and src.builder != "hub":
        raise DatasetError(
            f"split={split!r} applies only to hf://datasets/<owner>/<name> sources and save_to_disk folders, not to "
            f"{uri}"
        )
    return src


def _resolve_file(uri: str) -> Source:
    scheme = url_scheme(uri)
    if scheme == "":
        location = str(Path(uri).expanduser().absolute())
    elif scheme == "file":
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost"):
            raise DatasetError(f"file:// URI {uri} names host {parsed.netloc!r}; use file:///absolute/path")
        location = unquote(parsed.path)
    elif scheme == "s3":
        location = uri
    else:
        raise DatasetError(f"unsupported scheme {scheme}:// in {uri}; supported: {', '.join(SUPPORTED_SCHEMES)}")
    if scheme != "s3" and os.path.isdir(location) and not has_data_extension(location):
        if not any(os.path.isfile(os.path.join(location, name)) for name in SAVED_MARKERS):
            raise DatasetError(
                f"dataset {uri} is a folder, but not one written by datasets' save_to_disk (it has none of "
                f"{', '.join(SAVED_MARKERS)}); give the path of one data file, or such a folder"
            )
        return Source(uri, location, "disk")
    return Source(uri, location, _builder_for(uri, location))


def _resolve_hf(uri: str, split: str | None) -> Source:
    rest = uri.split("://", 1)[1]
    if not rest.startswith("datasets/"):
        raise DatasetError(f"{uri}: only Hub datasets are supported, as hf://datasets/<owner>/<name>[/<split>]")
    parts = [p for p in rest[len("datasets/") :].split("/") if p]
    if len(parts) >= 2 and not re.fullmatch(REPO_ID_PATTERN, repo := "/".join(parts[:2])):
        # `datasets.load_dataset("../..")` would read a local folder instead.
        raise DatasetError(
            f"{uri}: {repo!r} is not a Hub dataset id (owner/name of letters, digits, '-', '_' and '.', without '..')"
        )
    if len(parts) > 3 or (parts and has_data_extension(parts[-1])):
        # A file inside a Hub repo (hf://datasets/owner/name/data/train.jsonl): fsspec reads it like any URL.
        return Source(uri, uri, _builder_for(uri, uri))
    if len(parts) not in (2, 3):
        raise DatasetError(f"{uri}: expected hf://datasets/<owner>/<name>[/<split>]")
    uri_split = parts[2] if len(parts) == 3 else None
    if uri_split and split and uri_split != split:
        raise DatasetError(f"{uri} names split {uri_split!r} but split={split!r} was also given; keep one")
    return Source(uri, "/".join(parts[:2]), "hub", uri_split or split or "train")


def has_data_extension(name: str) -> bool:
    return any(name.lower().endswith(ext + comp) for ext in FORMATS for comp in ("", *COMPRESSIONS))


def _builder_for(uri: str, location: str) -> str:
    name = location.rstrip("/").rsplit("/", 1)[-1].lower()
    stem, compression = name, ""
    for comp in COMPRESSIONS:
        if stem.endswith(comp):
            stem, compression = stem[: -len(comp)], comp
    ext = os.path.splitext(stem)[1]
    if ext in FORMATS and not (compression and FORMATS[ext] == "parquet"):
        return FORMATS[ext]
    shown = (ext + compression) or "(none)"
    supported = ", ".join(FORMATS) + f" (JSON and CSV also compressed: {', '.join(COMPRESSIONS)})"
    raise DatasetError(f"unsupported file extension {shown} for dataset {uri}; supported: {supported}")
