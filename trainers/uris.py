"""URIs grpoflow accepts (`dataset.uri`, `output_uri`, spec files, the watcher's `uri`, webhook and endpoint URLs):
one place that reads their scheme, says whether fsspec can open it, and refuses what must not be in a spec: a
credential inside a URL, a link-local or cloud-metadata address.

    >>> url_scheme("s3://bucket/prefix"), url_scheme("runs"), is_remote("file:///tmp/x")
    ('s3', '', False)
    >>> url_credentials("s3://AKIA123:abc@bucket/runs"), url_credentials("https://h/hook?token=x&a=1")
    ('user:password@', '?token=')
    >>> link_local_address("http://169.254.169.254/latest"), link_local_address("http://127.0.0.1:8000/v1")
    ('169.254.169.254 is a link-local address (where clouds serve instance metadata and credentials)', None)
"""

import ipaddress
import os
import re
import socket
from urllib.parse import parse_qsl, urlsplit

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


# Query parameters that carry a credential (`?token=`, `?api_key=`, `?sig=`, `?X-Amz-Signature=`...).
CREDENTIAL_PARAM = re.compile(
    r"(?i)(.*[_-])?(token|key|apikey|sig|signature|secret|password|passwd|pwd|auth|credentials?)"
)
# Where each scheme's credentials belong instead of the URL.
CREDENTIALS_INSTEAD = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an instance role) in the worker's environment",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or workload identity) in the worker's environment",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS (or workload identity) in the worker's environment",
    "az": "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN in the worker's environment",
    "abfs": "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN in the worker's environment",
    "hf": "HF_TOKEN in the worker's environment",
}
# The operator's switch for endpoints on link-local addresses (a work pool's environment variable).
ALLOW_LINK_LOCAL_ENV = "GRPOFLOW_ALLOW_LINK_LOCAL_URLS"
# Cloud metadata services by name (their addresses are link-local, or Alibaba's 100.100.100.200).
METADATA_HOSTS = {"metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal"}
METADATA_ADDRESSES = {ipaddress.ip_address("100.100.100.200"), ipaddress.ip_address("fd00:ec2::254")}


def url_credentials(uri: str | os.PathLike) -> str | None:
    """Where a URL carries a credential (`"user:password@"`, or the query parameters that look like one, as
    `"?token=, ?sig="`); None for a URL without one and for a plain path."""
    text = str(uri)
    if not SCHEME.match(text):
        return None
    parts = urlsplit(text)
    if "@" in parts.netloc:
        return "user:password@"
    secret = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True) if CREDENTIAL_PARAM.fullmatch(name)]
    return "?" + "=, ?".join(secret) + "=" if secret else None


def credentials_instead(uri: str | os.PathLike) -> str:
    """Where the credentials of `uri`'s scheme go instead of the URL."""
    return CREDENTIALS_INSTEAD.get(url_scheme(uri), "the environment of the worker (or a Prefect Secret block)")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address, in any spelling the network stack accepts (`169.254.169.254`, `2852039166`,
    `0xa9fea9fe`, `[::ffff:169.254.169.254]`); None for a name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.inet_aton(host))  # the shorthand IPv4 forms curl and libc accept
        except OSError:
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _link_local(address) -> bool:
    return address.is_link_local or address in METADATA_ADDRESSES


def link_local_address(url: str, resolve: bool = False) -> str | None:
    """Why `url` points at a link-local or cloud-metadata address (where a cloud machine's credentials are served),
    or None. With `resolve`, a host name is looked up too (what a request would reach); the operator allows such
    URLs with GRPOFLOW_ALLOW_LINK_LOCAL_URLS=1."""
    if os.environ.get(ALLOW_LINK_LOCAL_ENV) == "1":
        return None
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host in METADATA_HOSTS:
        return f"{host} is a cloud metadata service"
    address = _address(host)
    if address is None and resolve and host:
        try:
            found = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            return None  # unreachable: the request itself will say so
        bad = [a for a in found if _link_local(_address(a.split("%")[0]))]
        return f"{host} resolves to {bad[0]}, a link-local address" if bad else None
    if address is not None and _link_local(address):
        return f"{host} is a link-local address (where clouds serve instance metadata and credentials)"
    return None
