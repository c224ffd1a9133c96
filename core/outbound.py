"""Bounded outbound requests: each request grpoflow sends itself (judges, model graders, embeddings, webhooks, the Hub
checks) ends within one total deadline and reads at most a capped reply, whatever the server does.

httpx2's `timeout` bounds each phase on its own (the connection, then each read): a server answering a byte at a time
holds a request as long as it likes, and a reply is read whole however large. `request` runs the whole exchange, from
the connection to the reply's last byte, under one deadline, and reads the body as a stream that stops past the cap;
`BoundedClient` sends each request a library sends through it (openai's client) the same way.

Operator settings, from the environment of the process that sends (a work pool's variables):

    GRPOFLOW_HTTP_DEADLINE_S=20          # a ceiling on every request's total seconds (unset: each request's own
                                         # `timeout` is its total deadline)
    GRPOFLOW_HTTP_MAX_RESPONSE_MB=10     # the largest reply read, in MB (10**6 bytes); default 10

    >>> deadline_s(30.0), max_response_bytes()
    (30.0, 10000000)
"""

import asyncio
import functools
import math
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

import httpx2

from grpoflow.core.trust import spec_from_command_line
from grpoflow.core.uris import ALLOW_LINK_LOCAL_ENV, address_of, forbidden_among, link_local_address

DEADLINE_ENV = "GRPOFLOW_HTTP_DEADLINE_S"
MAX_RESPONSE_ENV = "GRPOFLOW_HTTP_MAX_RESPONSE_MB"
DEFAULT_MAX_RESPONSE_MB = 10.0
# Headers that describe the body as it was sent: dropped from the reply rebuilt from its decoded bytes.
_FRAMING = {"content-encoding", "content-length", "transfer-encoding"}
T = TypeVar("T")


class ForbiddenAddress(httpx2.HTTPError):
    """The request's host resolved, when it was sent, to a link-local or cloud-metadata address (a name that answers
    otherwise when checked first: DNS rebinding). Not retried: not a failure of the network."""


class ResponseTooLarge(httpx2.HTTPError):
    """A reply over the cap (`GRPOFLOW_HTTP_MAX_RESPONSE_MB`), not read further. Not a `TransportError`: the same
    request would bring the same reply, so callers do not retry it."""


def _setting(name: str, default: float | None, meaning: str) -> float | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={text!r}: must be a number > 0 ({meaning}); unset it for the default")
    return value


def deadline_s(timeout: float) -> float:
    """The total deadline of a request whose own timeout is `timeout`: that, or the operator's lower ceiling."""
    ceiling = _setting(DEADLINE_ENV, None, "the most seconds one outbound request may take")
    return timeout if ceiling is None else min(timeout, ceiling)


def max_response_bytes() -> int:
    """The largest reply read, in bytes (`GRPOFLOW_HTTP_MAX_RESPONSE_MB`, default 10 MB)."""
    return int(_setting(MAX_RESPONSE_ENV, DEFAULT_MAX_RESPONSE_MB, "the largest reply read, in MB") * 1_000_000)


async def request(client: httpx2.AsyncClient, method: str, url: str, timeout: float, **kwargs) -> httpx2.Response:
    """Sends one request and reads its whole reply within the total deadline, reading no more than the cap.

    Args:
        client (`httpx2.AsyncClient`): the client that sends it (its headers, its connections).
        method (`str`), url (`str`): as for `client.request`.
        timeout (`float`): the request's own seconds, its total deadline unless `GRPOFLOW_HTTP_DEADLINE_S` is lower;
            also each phase's timeout.
        kwargs: `client.build_request`'s (`json=`, `content=`, `headers=`).

    Returns:
        `httpx2.Response`: the reply, its body read (`.content`, `.text`, `.json()`).

    Raises:
        httpx2.ReadTimeout: no complete reply within the deadline (a timeout, retried as callers retry timeouts).
        ResponseTooLarge: the reply is over the cap.
        ValueError: a setting that is not a number > 0, named.
    """
    sent = client.build_request(method, url, timeout=deadline_s(timeout), **kwargs)
    return await _send(client.send, sent, timeout)


class BoundedClient(httpx2.AsyncClient):
    """An `httpx2.AsyncClient` each of whose requests is sent as `request` sends one (the total deadline, the reply
    cap, the host looked up once and checked), for a library that sends through a client it is given: openai's
    `AsyncOpenAI(http_client=...)`. Its errors (`ResponseTooLarge`, `ForbiddenAddress`) are no `httpx2.RequestError`,
    so openai raises them as they are, not retried; a deadline's `httpx2.ReadTimeout` is retried as a timeout.

    Args:
        timeout (`float`): each request's total seconds (unless `GRPOFLOW_HTTP_DEADLINE_S` is lower).
        kwargs: `httpx2.AsyncClient`'s.
    """

    def __init__(self, timeout: float, **kwargs):
        super().__init__(timeout=deadline_s(timeout), **kwargs)
        self.total_s = timeout

    async def send(self, request: httpx2.Request, *, stream: bool = False, **kwargs) -> httpx2.Response:
        return await _send(functools.partial(super().send, **kwargs), request, self.total_s)


async def _send(send: Callable, sent: httpx2.Request, timeout: float) -> httpx2.Response:
    """`send(sent, stream=True)` with its host pinned, its reply read whole within the deadline and the cap."""
    deadline, cap = deadline_s(timeout), max_response_bytes()
    try:
        async with asyncio.timeout(deadline):
            await _pin(sent)
            response = await send(sent, stream=True)
            try:
                body = await _read_capped(response, cap)
            finally:
                await response.aclose()
    except TimeoutError:
        raise httpx2.ReadTimeout(_late(deadline, timeout), request=sent) from None
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _FRAMING]
    return httpx2.Response(response.status_code, headers=headers, content=body, request=sent)


async def _pin(sent: httpx2.Request) -> None:
    """Looks the request's host up once, refuses it when any address is link-local or metadata, and sends the request
    to the address checked, the name kept for the Host header and TLS (`sni_hostname`, httpcore's extension): what
    is checked is what is reached, so a name that answers otherwise a moment later (DNS rebinding) cannot move it.
    An address in the URL is checked as it is; GRPOFLOW_ALLOW_LINK_LOCAL_URLS=1 turns the check off.

    Raises:
        ForbiddenAddress: an address of the host is link-local or metadata.
        httpx2.ConnectError: the name does not resolve.
    """
    host = sent.url.host
    if os.environ.get(ALLOW_LINK_LOCAL_ENV) == "1" or not host or address_of(host) is not None:
        if why := link_local_address(str(sent.url)):
            raise ForbiddenAddress(f"refused: {why}")
        return
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, sent.url.port or 443, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise httpx2.ConnectError(f"cannot resolve {host}: {exc}", request=sent) from None
    addresses = [info[4][0] for info in infos]
    if why := forbidden_among(host, addresses):
        raise ForbiddenAddress(f"refused: {why}")
    sent.headers["Host"] = sent.url.netloc.decode("ascii")
    if sent.url.scheme == "https":
        sent.extensions["sni_hostname"] = host
    sent.url = sent.url.copy_with(host=addresses[0])


async def _read_capped(response: httpx2.Response, cap: int) -> bytes:
    """The body, decoded, refused as soon as it (or the length the server declares) is over `cap` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise ResponseTooLarge(_too_large(cap))
    body = bytearray()
    async for chunk in response.aiter_bytes():  # decoded: a small gzip that inflates past the cap stops here too
        body += chunk
        if len(body) > cap:
            raise ResponseTooLarge(_too_large(cap))
    return bytes(body)


def reply_json(response: httpx2.Response):
    """The reply's JSON; a ValueError for one that is none, or nested too deeply to parse (a hostile endpoint's
    `[[[[...]]]]` makes the json module raise RecursionError, which no caller expects)."""
    try:
        return response.json()
    except RecursionError:
        raise ValueError("the reply's JSON is nested too deeply to read") from None


def reply_shown(response: httpx2.Response) -> str:
    """What of an endpoint's unexpected reply goes into an error message: the server's own error text (OpenAI's
    `{"error": {"message": ...}}`, or a string `error`, `detail` or `message`), at most 200 characters; otherwise, for
    a spec of the user's own command line, the reply's first 200 characters, and for a spec from a deployment only
    its size and type. Whoever launches a deployment's run names the endpoint, and reads the run's state message and
    logs: a judge's `base_url` at a loopback or cluster service that answers a POST with its records would otherwise
    show them to that person.

    >>> reply_shown(httpx2.Response(401, json={"error": {"message": "Incorrect API key provided"}}))
    'Incorrect API key provided'
    >>> reply_shown(httpx2.Response(200, json=[{"name": "db_password", "value": "s3cret"}]))
    'a reply of 41 bytes (application/json) without an error message, not shown (the spec came from a deployment)'
    """
    try:
        body = reply_json(response)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        error = error.get("message") if isinstance(error, dict) else error
        for text in (error, body.get("detail"), body.get("message")):
            if isinstance(text, str) and text.strip():
                return text.strip()[:200]
    if spec_from_command_line():
        return response.text[:200]
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    return (
        f"a reply of {len(response.content)} bytes ({kind}) without an error message, not shown (the spec came from "
        "a deployment)"
    )


def _late(deadline: float, timeout: float) -> str:
    origin = f"the ceiling {DEADLINE_ENV} sets" if deadline < timeout else "the request's whole timeout"
    return f"no complete reply within {deadline:g} s, {origin}"


def _too_large(cap: int) -> str:
    return f"a reply over {cap / 1_000_000:g} MB, the cap {MAX_RESPONSE_ENV} sets; not read further"


def call_within(seconds: float, call: Callable[[], T]) -> T:
    """`call()`'s result or exception, or `TimeoutError` once `seconds` have passed: for a library's blocking
    request whose reading grpoflow does not drive (huggingface_hub's). The call goes on in a daemon thread till its
    own timeouts end it; the caller does not wait for it.

    >>> call_within(1.0, lambda: 6 * 7)
    42
    """
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread, raised there
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="grpoflow-bounded-call", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
