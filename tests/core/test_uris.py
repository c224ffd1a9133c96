"""URIs grpoflow accepts: their scheme, whether they are remote, why fsspec cannot open one, and the credentials and
link-local addresses refused in them (`grpoflow.core.uris`)."""

import doctest
import socket
from pathlib import Path

import pytest

from grpoflow.core import uris
from grpoflow.core.uris import (
    OBJECT_STORES,
    is_remote,
    link_local_address,
    outside_stores,
    unopenable,
    url_credentials,
    url_scheme,
)


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


@pytest.mark.parametrize(
    "uri, stores, refused",
    [
        ("runs", OBJECT_STORES, False),  # a local path
        ("file:///tmp/x", OBJECT_STORES, False),
        ("s3://bucket/runs", OBJECT_STORES, False),
        ("GS://bucket/runs", OBJECT_STORES, False),  # schemes are case-insensitive
        ("hf://owner/name/spec.yaml", OBJECT_STORES, True),  # the Hub only where a caller allows it
        ("hf://owner/name/spec.yaml", uris.STORES, False),
        ("http://169.254.169.254/latest/meta-data/", uris.STORES, True),  # fsspec's http would fetch it
        ("HTTPS://example.com/spec.yaml", uris.STORES, True),
        ("ftp://10.0.0.1/x", uris.STORES, True),
        ("memory://x", uris.STORES, True),  # fsspec knows it, a spec has no use for it
        ("simplecache::http://127.0.0.1/x", uris.STORES, True),  # fsspec's chained URL hides its protocol
        ("simplecache::s3://bucket/x", uris.STORES, True),
        ("runs::2024", uris.STORES, False),  # "::" alone is part of a name
    ],
)
def test_outside_stores(uri, stores, refused):
    reason = outside_stores(uri, stores)
    assert (reason is not None) is refused
    if refused and "::" in uri:
        assert reason.startswith("a chained URL")
    elif refused:
        assert reason.startswith(f"{url_scheme(uri)}:// is refused: a local path, or a URL of s3://")


@pytest.mark.parametrize(
    "url, where",
    [
        ("s3://AKIAEXAMPLE:secret@bucket/runs", "user:password@"),
        ("https://user@host/hook", "user:password@"),
        ("https://h/x?X-Amz-Signature=abc&a=1", "?X-Amz-Signature="),
        ("https://h/x?api_key=1&token=2", "?api_key=, ?token="),
        ("s3://bucket/runs", None),
        ("runs/a@b", None),  # a path, not a URL
        ("https://h/x?page=2", None),
    ],
)
def test_url_credentials(url, where):
    assert url_credentials(url) == where


@pytest.mark.parametrize(
    "url, link_local",
    [
        ("http://169.254.169.254/latest/meta-data/", True),
        ("http://2852039166/", True),  # 169.254.169.254 as one number
        ("http://0xa9fea9fe/", True),
        ("http://[::ffff:169.254.169.254]/", True),
        ("http://[fe80::1]/", True),
        # IPv6 spellings that carry 169.254.169.254, which a gateway or the host's stack reaches instead
        ("http://[64:ff9b::a9fe:a9fe]/", True),  # NAT64's well-known prefix
        ("http://[64:ff9b::169.254.169.254]/", True),  # the same, its last 32 bits written as IPv4
        ("http://[2002:a9fe:a9fe::]/", True),  # 6to4
        ("http://[::a9fe:a9fe]/", True),  # IPv4-compatible (deprecated, still parsed)
        ("http://[::ffff:0:a9fe:a9fe]/", True),  # IPv4-translated (SIIT)
        ("http://[2001:0:4136:e378:8000:63bf:5601:5601]/", True),  # Teredo, whose client is 169.254.169.254
        ("http://[64:ff9b::6464:64c8]/", True),  # Alibaba's 100.100.100.200 through NAT64
        ("http://[64:ff9b::7f00:1]/", False),  # NAT64 of 127.0.0.1: not link-local
        ("http://[2002:7f00:1::]/", False),  # 6to4 of 127.0.0.1
        ("http://[::1]:8000/v1", False),  # loopback, though inside ::/96
        ("http://metadata.google.internal/computeMetadata/v1/", True),
        ("http://100.100.100.200/latest/meta-data/", True),  # Alibaba Cloud's
        ("http://127.0.0.1:8000/v1", False),
        ("https://hooks.example.com/x", False),  # a name, not looked up unless asked
    ],
)
def test_link_local_address(url, link_local):
    assert (link_local_address(url) is not None) == link_local


@pytest.mark.parametrize(
    "found, why",
    [
        (["127.0.0.1", "169.254.169.254"], "rebind.example resolves to 169.254.169.254, a link-local address"),
        (["10.0.0.7", "64:ff9b::a9fe:a9fe"], "resolves to 64:ff9b::a9fe:a9fe, which carries 169.254.169.254"),
        (["2002:a9fe:a9fe::"], "resolves to 2002:a9fe:a9fe::, which carries 169.254.169.254"),
        (["127.0.0.1", "::1"], None),  # every address checked, none link-local
    ],
)
def test_every_address_a_name_resolves_to_is_checked(monkeypatch, found, why):
    infos = [(None, None, None, "", (a, 0, 0, 0) if ":" in a else (a, 0)) for a in found]
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port: infos)
    got = link_local_address("https://rebind.example/x", resolve=True)
    assert got is None if why is None else why in got


def test_link_local_by_name_and_the_operators_switch(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port: [(None, None, None, "", ("169.254.10.1", 0))])
    assert link_local_address("https://rebind.example/x", resolve=True) == (
        "rebind.example resolves to 169.254.10.1, a link-local address"
    )
    monkeypatch.setenv("GRPOFLOW_ALLOW_LINK_LOCAL_URLS", "1")
    assert link_local_address("http://169.254.169.254/", resolve=True) is None
