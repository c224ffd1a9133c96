"""URIs grpoflow accepts: their scheme, whether they are remote, and why fsspec cannot open one
(`grpoflow.trainers.uris`)."""

import doctest
from pathlib import Path

import pytest

from grpoflow.trainers import uris
from grpoflow.trainers.uris import is_remote, unopenable, url_scheme


def test_doctest():
    assert doctest.testmod(uris).failed == 0


@pytest.mark.parametrize(
    "uri, scheme, remote",
    [
        ("runs", "", False),  # a relative folder: the default output_uri
        ("/data/prompts.jsonl", "", False),  # an absolute path
        (Path("/data/prompts.jsonl"), "", False),  # a Path, not only a str
        ("C:/data/prompts.jsonl", "", False),  # a drive letter has no "//": a path, not a scheme
        ("file:///tmp/x", "file", False),  # file:// reads the local disk
        ("local:///tmp/x", "local", False),  # fsspec's other name for the local disk
        ("s3://bucket/prefix", "s3", True),  # the remote output_uri and dataset.uri
        ("S3://Bucket/Key", "s3", True),  # schemes are case-insensitive (RFC 3986); the scheme comes back lowercased
        ("hf://datasets/org/name", "hf", True),  # Hugging Face datasets
        ("git+https://host/repo", "git+https", True),  # "+", "-" and "." may follow the first letter
        ("3s://bucket", "", False),  # a scheme starts with a letter: this is a path
        ("s3:/bucket", "", False),  # one slash is not a URL
        ("prefix/s3://x", "", False),  # a scheme only at the start
    ],
)
def test_scheme_and_remote(uri, scheme, remote):
    assert url_scheme(uri) == scheme
    assert is_remote(uri) is remote


@pytest.mark.parametrize(
    "uri, fragment",
    [
        ("runs", None),  # a plain path always opens
        ("file:///tmp/x", None),  # fsspec's local filesystem
        ("s3://bucket/prefix", None),  # s3fs is a dependency
        ("memory://x", None),  # any protocol fsspec knows
        ("nosuchproto://x", "cannot open nosuchproto://"),  # unknown to fsspec: named, with what to give instead
    ],
)
def test_unopenable(uri, fragment):
    reason = unopenable(uri)
    if fragment is None:
        assert reason is None
    else:
        assert reason.startswith(fragment) and "s3://bucket/prefix" in reason
