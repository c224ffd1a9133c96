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
from urllib.parse import parse_qsl, unquote, urlsplit

# RFC 3986's scheme: a letter, then letters, digits, "+", "-" or ".".
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(uri: str | os.PathLike) -> str:
    """The lowercased scheme of `uri` (`"s3"`, `"file"`, `"hf"`), or `""` for a plain path."""
    m = SCHEME.match(str(uri))
    return m.group(1).lower() if m else ""


def is_remote(uri: str | os.PathLike) -> bool:
    """True for URLs fsspec resolves remotely (`s3://...`); False for local paths and `file://`."""
    return url_scheme(uri) not in ("", "file", "local")


# The URL schemes of a local path (fsspec's `local://` too), and a plain path's "".
LOCAL_SCHEMES = ("", "file", "local")


def file_path(uri: str) -> str:
    """The local path of a `file://` (or fsspec's `local://`) URL (`file:///data/runs` -> `/data/runs`); any other
    `uri` as it is. A host other than `localhost` is a ValueError (the file is on another machine).

    >>> file_path("file:///data/my%20runs"), file_path("file://localhost/x"), file_path("runs")
    ('/data/my runs', '/x', 'runs')
    """
    scheme = url_scheme(uri)
    if not scheme or scheme not in LOCAL_SCHEMES:  # a plain path stays as written (no %-decoding)
        return uri
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"{uri} names host {parts.netloc!r}; use file:///absolute/path")
    return unquote(parts.path)


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


# Where a spec may point grpoflow's reads and writes besides the local disk: object stores and the Hugging Face Hub,
# each behind its own credentials. Not http(s), ftp, sftp, smb or any other protocol fsspec knows: a spec from a
# deployment (or an event's payload) could otherwise make the worker reach any address it can, a cloud metadata
# service or a service on the cluster's network included.
OBJECT_STORES = frozenset({"s3", "gs", "gcs", "az", "abfs"})
STORES = OBJECT_STORES | {"hf"}
# fsspec's chained URLs (`simplecache::http://...`): no scheme of their own, so a path to `Path`, a URL to fsspec.
CHAINED = re.compile(r"::[A-Za-z][A-Za-z0-9+.-]*://")


def outside_stores(uri: str | os.PathLike, stores: frozenset[str] = STORES) -> str | None:
    """Why `uri` is refused (its scheme is none of the local disk's or `stores`), or None.

    >>> outside_stores("s3://b/spec.yaml"), outside_stores("runs"), outside_stores("file:///tmp/x")
    (None, None, None)
    >>> outside_stores("http://10.0.0.1/spec.yaml", OBJECT_STORES)[:74]
    'http:// is refused: a local path, or a URL of s3://, gs://, gcs://, az:// '
    """
    if CHAINED.search(str(uri)):
        return "a chained URL (fsspec's `cache::s3://...`) is refused: give the store's own URL"
    scheme = url_scheme(uri)
    if scheme in ("", "file", "local") or scheme in stores:
        return None
    known = [f"{s}://" for s in ("s3", "gs", "gcs", "az", "abfs", "hf") if s in stores]
    return (
        f"{scheme}:// is refused: a local path, or a URL of {', '.join(known[:-1])} or {known[-1]} (another protocol "
        "would let a spec make the worker reach any address, a cloud metadata service included)"
    )


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
# IPv6 prefixes whose last 32 bits are an IPv4 address: IPv4-compatible (::a.b.c.d), IPv4-translated (SIIT,
# ::ffff:0:a.b.c.d) and NAT64's well-known prefix; `ipaddress` itself reads IPv4-mapped, 6to4 and Teredo.
LOW32_PREFIXES = [ipaddress.ip_network(prefix) for prefix in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96")]


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


def address_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address, in any spelling the network stack accepts (`169.254.169.254`, `2852039166`,
    `0xa9fea9fe`, `::ffff:169.254.169.254`); None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        try:
            return ipaddress.ip_address(socket.inet_aton(host))  # the shorthand IPv4 forms curl and libc accept
        except OSError:
            return None


def embedded_ipv4(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries, which a gateway or the host's own stack may reach instead: IPv4-mapped,
    IPv4-compatible, IPv4-translated, NAT64 (`64:ff9b::/96`), 6to4 (`2002::/16`), Teredo's client; None otherwise.

    >>> [str(embedded_ipv4(ipaddress.ip_address(a))) for a in ("64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::", "::1")]
    ['169.254.169.254', '169.254.169.254', '0.0.0.1']
    """
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped or address.sixtofour:
        return address.ipv4_mapped or address.sixtofour
    if address.teredo:
        return address.teredo[1]
    if any(address in prefix for prefix in LOW32_PREFIXES):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _forbidden(address) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The link-local or metadata address `address` is or carries, or None."""
    for candidate in (address, embedded_ipv4(address)):
        if candidate is not None and (candidate.is_link_local or candidate in METADATA_ADDRESSES):
            return candidate
    return None


def link_local_address(url: str, resolve: bool = False) -> str | None:
    """Why `url` points at a link-local or cloud-metadata address (where a cloud machine's credentials are served),
    or None. An IPv6 address carrying such an IPv4 one (`[64:ff9b::a9fe:a9fe]`) counts as that address. With `resolve`,
    a host name is looked up too and every address it resolves to checked (what a request would reach); the operator
    allows such URLs with GRPOFLOW_ALLOW_LINK_LOCAL_URLS=1."""
    if os.environ.get(ALLOW_LINK_LOCAL_ENV) == "1":
        return None
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host in METADATA_HOSTS:
        return f"{host} is a cloud metadata service"
    address = address_of(host)
    if address is None:
        return _resolved_link_local(host) if resolve and host else None
    if (found := _forbidden(address)) is None:
        return None
    what = "is" if found == address else f"carries {found},"
    return f"{host} {what} a link-local address (where clouds serve instance metadata and credentials)"


def _resolved_link_local(host: str) -> str | None:
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return None  # unreachable: the request itself will say so
    return forbidden_among(host, sorted(found))


def forbidden_among(host: str, addresses: list[str]) -> str | None:
    """Why `host`, which resolves to `addresses`, must not be sent to (one of them link-local or metadata, or carries
    one), or None."""
    for text in addresses:
        address = address_of(text.split("%")[0])
        if address is not None and (bad := _forbidden(address)) is not None:
            carried = "" if bad == address else f", which carries {bad}"
            return f"{host} resolves to {text}{carried}, a link-local address"
    return None


# --- model sources -------------------------------------------------------------------------------------------


def is_gguf(model_id: str) -> bool:
    """Whether `base_model` names a GGUF file (`*.gguf`) rather than a model folder or a Hub id.

    >>> is_gguf("models/SmolLM2-135M-Instruct.Q4_1.gguf"), is_gguf("Qwen/Qwen2.5-0.5B-Instruct")
    (True, False)
    """
    return model_id.lower().endswith(".gguf")


def is_local_model(model_id: str) -> bool:
    """True for a local path: one that exists, or that no Hub repo id could be (`/x`, `./x`, `~/x`, `a/b/c`)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if os.path.exists(os.path.expanduser(model_id)) or model_id.startswith(("/", ".", "~")):
        return True
    try:
        validate_repo_id(model_id)
    except HFValidationError:
        return True
    return False
