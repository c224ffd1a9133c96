"""Bounded outbound requests (core/outbound.py): one total deadline and a reply cap per request, driven by a
hostile endpoint on 127.0.0.1 (tests/hostile_server.py) that trickles, floods or inflates."""

import asyncio
import doctest
import time

import httpx2
import pytest

from grpoflow.core import outbound
from tests.hostile_server import ANSWER, HostileServer, timed


def fetch(url: str, timeout: float = 5.0) -> httpx2.Response:
    async def run():
        async with httpx2.AsyncClient() as client:
            return await outbound.request(client, "POST", url, timeout, json={"q": 1})

    return asyncio.run(run())


def test_doctest():
    assert doctest.testmod(outbound).failed == 0


def test_a_trickling_endpoint_is_cut_at_the_total_deadline():
    # Every byte, headers included, arrives 0.2 s after the last: no read ever waits 0.5 s, only the total ends it.
    with HostileServer("trickle", every_s=0.2) as server:
        error, seconds = timed(lambda: fetch(server.url, timeout=0.5))
    assert isinstance(error, httpx2.ReadTimeout)  # a timeout, retried as httpx2's own are
    assert str(error) == "no complete reply within 0.5 s, the request's whole timeout"
    assert seconds < 1.5  # the whole answer would take ~30 s


def test_the_operators_deadline_is_a_ceiling(monkeypatch):
    monkeypatch.setenv("GRPOFLOW_HTTP_DEADLINE_S", "0.5")
    with HostileServer("trickle", every_s=0.3) as server:
        error, seconds = timed(lambda: fetch(server.url, timeout=30.0))
    assert str(error) == "no complete reply within 0.5 s, the ceiling GRPOFLOW_HTTP_DEADLINE_S sets"
    assert seconds < 1.5
    assert outbound.deadline_s(0.2) == 0.2  # never raises a request's own timeout


@pytest.mark.parametrize(
    "mode, declared",
    [
        ("huge", False),  # no Content-Length: stopped by counting what is read
        ("huge", True),  # a Content-Length over the cap: refused before reading
        ("gzip", True),  # 20 MB inflated from ~20 kB: the decoded bytes count
    ],
)
def test_a_reply_over_the_cap_is_not_read_further(monkeypatch, mode, declared):
    monkeypatch.setenv("GRPOFLOW_HTTP_MAX_RESPONSE_MB", "1")
    with HostileServer(mode, size=20_000_000, declared=declared) as server:
        error, seconds = timed(lambda: fetch(server.url))
    assert isinstance(error, outbound.ResponseTooLarge) and not isinstance(error, httpx2.TransportError)
    assert str(error) == "a reply over 1 MB, the cap GRPOFLOW_HTTP_MAX_RESPONSE_MB sets; not read further"


def test_a_normal_reply_reads_as_httpx2s_own(monkeypatch):
    with HostileServer("trickle", every_s=0.0) as server:
        response = fetch(server.url)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "7"
    assert response.content == ANSWER and response.headers["content-type"] == "application/json"


@pytest.mark.parametrize("name", ["GRPOFLOW_HTTP_DEADLINE_S", "GRPOFLOW_HTTP_MAX_RESPONSE_MB"])
@pytest.mark.parametrize("value", ["ten", "0", "-1", "nan"])
def test_a_setting_that_is_no_positive_number_is_named(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"^{name}='{value}': must be a number > 0 .*unset it for the default$"):
        outbound.deadline_s(1.0) if "DEADLINE" in name else outbound.max_response_bytes()


def test_call_within_gives_up_on_a_blocking_call_and_passes_on_its_errors():
    error, seconds = timed(lambda: outbound.call_within(0.2, lambda: time.sleep(5)))
    assert isinstance(error, TimeoutError) and seconds < 1.0
    with pytest.raises(KeyError):
        outbound.call_within(1.0, lambda: {}["missing"])


def rebinding(monkeypatch, answers: list[str]) -> list[str]:
    """A name whose lookups answer `answers` in turn (the first, the check's; then the request's): DNS rebinding.
    Returns the names looked up."""
    import socket

    looked_up, real = [], socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "judge.example":
            return real(host, port, *args, **kwargs)
        looked_up.append(host)
        address = answers[min(len(looked_up), len(answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return looked_up


def test_a_rebinding_name_is_sent_only_to_the_address_checked(monkeypatch):
    from grpoflow.trainers.rewards.judge import endpoint_problems

    looked_up = rebinding(monkeypatch, ["127.0.0.1", "169.254.169.254"])
    with HostileServer("trickle", every_s=0.0) as server:
        url = server.url.replace("127.0.0.1", "judge.example")
        assert endpoint_problems(url, resolve=True) == []  # the check when the reward is built: loopback, fine
        error, _ = timed(lambda: fetch(url))  # the request's own lookup: the metadata address
    assert isinstance(error, outbound.ForbiddenAddress) and server.requests == 0
    assert str(error) == "refused: judge.example resolves to 169.254.169.254, a link-local address"
    assert looked_up == ["judge.example", "judge.example"]


def test_a_name_is_reached_at_the_address_checked_with_its_own_host_header(monkeypatch):
    rebinding(monkeypatch, ["127.0.0.1"])
    with HostileServer("trickle", every_s=0.0) as server:
        url = server.url.replace("127.0.0.1", "judge.example")
        response = fetch(url)
    assert response.status_code == 200 and response.content == ANSWER
    assert response.request.headers["host"] == url.split("/")[2]  # the name, not the address, as the server saw it
