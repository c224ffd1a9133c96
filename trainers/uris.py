"""URIs grpoflow accepts (`dataset.uri`, `output_uri`, spec files, the watcher's `uri`): one place that reads their
scheme and says whether fsspec can open it.

    >>> url_scheme("s3://bucket/prefix"), url_scheme("runs"), is_remote("file:///tmp/x")
    ('s3', '', False)
"""

import os
import re

# RFC 3986's scheme: a letter, then letters, digits, "+", "-" or ".".
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(uri: str | os.PathLike) -> str:
    """The lowercased scheme of `uri` (`"s3"`, `"file"`, `"hf"`), or `""` for a plain path."""
    m = SCHEME.match(str(uri))
    return m.group(1).lower() if m else ""


def is_remote(uri: str | os.PathLike) -> bool:
    """True for URLs fsspec resolves remotely (`s3://...`); False for local paths and `file://`."""
    return url_scheme(uri) not in ("", "file", "local")


def unopenable(uri: str | os.PathLike) -> str | None:
    """Why fsspec cannot open `uri`'s scheme (an unknown protocol, or its package missing); None when it can."""
    scheme = url_scheme(uri)
    if not scheme:
        return None
    import fsspec

    try:
        fsspec.get_filesystem_class(scheme)
    except (ValueError, ImportError) as exc:
        return f"cannot open {scheme}:// ({exc}); give a local folder or e.g. s3://bucket/prefix"
    return None
