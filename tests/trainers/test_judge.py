"""The `llm_judge` reward (trainers/rewards/judge.py): its kwargs rules, score parsing, and its HTTP behaviour
against a stub of the remote endpoint on 127.0.0.1 (429/5xx retries, Retry-After, timeouts, concurrency, the key in
the header and nowhere else); end to end against `grpoflow serve` in test_judge_serve.py."""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from grpoflow.core.spec import SpecError, load_spec
from grpoflow.core.trust import command_line
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward, reward_columns
from grpoflow.trainers.rewards.dry_run import call_reward, dry_run_rewards
from grpoflow.trainers.rewards.judge import (
    JudgeError,
    fill_rubric,
    get_llm_judge_reward,
    judge_kwargs_problems,
    parse_score,
)
from tests.hostile_server import HostileServer, timed

KEY = "sk-grpoflow-test-0123456789"
GOOD = {"base_url": "http://127.0.0.1:1/v1", "model": "judge", "rubric": "Q: {prompt}\nA: {completion}\nScore 0-10:"}


class Stub:
    """A scripted OpenAI-compatible endpoint: each POST takes the next (status, reply text, headers, delay) of
    `script` (the last one repeats) and is recorded with its headers and body. The text is sent as a chat completion
    (an error object when the status is not 200), or as it is when the headers give a content-type."""

    def __init__(self, script: list[tuple]):
        self.script, self.requests, self.in_flight, self.most_in_flight = script, [], 0, 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with stub.lock:
                    stub.requests.append({"path": self.path, "headers": self.headers, "body": body})  # names: any case
                    status, text, headers, delay = stub.script[min(len(stub.requests), len(stub.script)) - 1]
                    stub.in_flight += 1
                    stub.most_in_flight = max(stub.most_in_flight, stub.in_flight)
                time.sleep(delay)
                with stub.lock:
                    stub.in_flight -= 1
                reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
                data = json.dumps(reply if status == 200 else {"error": {"message": text}}).encode()
                if "content-type" in headers:
                    data = text.encode()
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    stubs = []

    def make(*script):
        stubs.append(Stub([(s + ({}, 0.0))[:4] if len(s) == 2 else s for s in script]))
        return stubs[-1]

    yield make
    for s in stubs:
        s.close()


def judge(base_url: str, **kwargs):
    return get_llm_judge_reward(**{**GOOD, "base_url": base_url, "backoff": 0.01, **kwargs})


def score(reward, completions, prompts=None, **columns):
    prompts = prompts or ["What is 2+2?"] * len(completions)
    return call_reward(reward, prompts, completions, [[0]] * len(completions), columns)


# --- kwargs --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, expect",
    [
        ({}, []),  # base_url, model and a rubric with {completion}: enough
        ({"base_url": None}, [("base_url", "required: an http(s) URL")]),  # the endpoint is not guessed
        ({"model": None}, [("model", "required")]),
        ({"base_url": "127.0.0.1:8000/v1"}, [("base_url", "must be an http(s) URL")]),  # no scheme
        ({"rubric": "Rate {prompt}"}, [("rubric", "must contain {completion}")]),  # nothing to judge
        ({"rubric": "{completion} }"}, [("rubric", "not a valid template")]),  # a lone brace
        ({"rubric": "{completion} {prompt.__class__}"}, [("rubric", "must be a plain name")]),  # no attribute access
        # format specs and conversions that grow the text: 30 MB a request from a 30-character rubric
        ({"rubric": "Score {completion:>30000000}"}, [("rubric", "{completion:>30000000} must be a plain name")]),
        ({"rubric": "{completion!r}"}, [("rubric", "{completion!r} must be a plain name")]),
        ({"rubric": "{completion} {prompt[0]}"}, [("rubric", "{prompt[0]} must be a plain name")]),  # no index
        ({"rubric": "{completion:{prompt}}"}, [("rubric", "{completion:{prompt}} must be a plain name")]),  # nested
        ({"api_key_env": "sk-123"}, [("api_key_env", "must be an environment variable NAME")]),  # a key, not a name
        ({"concurrency": 0}, [("concurrency", "must be an integer >= 1")]),
        ({"timeout": True}, [("timeout", "must be seconds > 0")]),  # a boolean is no number
        ({"score_regex": "("}, [("score_regex", "not a valid regular expression")]),
        ({"temprature": 0}, [("temprature", "unknown llm_judge kwarg")]),  # a typo
    ],
)
def test_kwargs_problems(change, expect):
    kwargs = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    problems = judge_kwargs_problems(kwargs)
    assert [key for key, _ in problems] == [key for key, _ in expect]
    assert all(fragment in message for (_, message), (_, fragment) in zip(problems, expect, strict=True))


def test_a_key_pasted_as_the_variable_name_is_not_echoed():
    [(key, message)] = judge_kwargs_problems({**GOOD, "api_key_env": KEY})
    assert key == "api_key_env" and "environment variable NAME" in message and KEY not in message


def test_spec_names_the_kwarg(tmp_path, dataset_file):
    rewards = [{"name": "llm_judge", "kwargs": {"model": "judge", "rubric": "{completion}"}}]
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "j", "base_model": "builtin:tiny", "dataset": {"uri": str(dataset_file)}, "rewards": rewards}
        )
    )
    with pytest.raises(SpecError, match=r"rewards\[0\]\.kwargs\.base_url: required"):
        load_spec(path)


def test_an_unset_key_variable_is_named_and_its_value_never_shown(monkeypatch):
    monkeypatch.delenv("GRPOFLOW_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(RewardError) as raised:
        build_reward("llm_judge", kwargs={**GOOD, "api_key_env": "GRPOFLOW_TEST_JUDGE_KEY"})
    assert "kwargs.api_key_env: the environment variable GRPOFLOW_TEST_JUDGE_KEY is not set" in str(raised.value)


def test_the_rubric_is_filled_without_format_specs():
    # Were the check bypassed, filling in ignores the spec: a value never grows past its own length.
    assert fill_rubric("{completion:>30000000}|{prompt!r}", "p", "c", {}, 0) == "c|p"


@pytest.mark.parametrize(
    "resolved",
    [
        "169.254.169.254",  # a cloud's metadata service
        "64:ff9b::a9fe:a9fe",  # the same through NAT64's prefix
        "2002:a9fe:a9fe::",  # the same through 6to4
    ],
)
def test_a_judge_name_resolving_to_link_local_is_refused(monkeypatch, resolved):
    # Every address the name resolves to is checked, not only the first.
    found = [("127.0.0.1", 0), (resolved, 0, 0, 0) if ":" in resolved else (resolved, 0)]
    monkeypatch.setattr("socket.getaddrinfo", lambda host, port: [(None, None, None, "", a) for a in found])
    with pytest.raises(ValueError) as raised:
        judge("http://judge.example:8000/v1")
    assert str(raised.value).startswith(f"kwargs.base_url: judge.example resolves to {resolved}")
    assert "a link-local address: refused as an endpoint" in str(raised.value)
    assert judge_kwargs_problems({**GOOD, "base_url": "http://judge.example:8000/v1"}) == []  # validate: no lookup


def test_rubric_columns_are_required_columns():
    reward = build_reward("llm_judge", kwargs={**GOOD, "rubric": "{prompt} {completion} want {answer} {level}"})
    assert reward_columns(reward) == ["answer", "level"]


# --- parsing -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, regex, max_score, expect",
    [
        ("7", None, None, 7.0),  # a bare number
        ("Score: 8/10. Clear.", None, 10, 0.8),  # the first number, scaled
        ("I give it 12", None, 10, 1.0),  # clipped to 0..1
        ("-3", None, 10, 0.0),
        ("1,000 points", None, None, 1000.0),  # thousands separators
        ("no score here", None, 10, None),  # nothing to parse: does not apply
        ("3 reasons; SCORE=[4]", r"SCORE=\[(\d+)\]", 5, 0.8),  # the regex's group, not the first number
        ("final: 9", r"\d+", None, 9.0),  # a regex without a group: its match
        ("SCORE=[x]", r"SCORE=\[(\w)\]", 5, None),  # a match that is no number
    ],
)
def test_parse_score(reply, regex, max_score, expect):
    assert parse_score(reply, re.compile(regex) if regex else None, max_score) == expect


# --- HTTP ----------------------------------------------------------------------------------------------------------


def test_the_request_carries_the_filled_rubric_and_the_key(stub, monkeypatch):
    endpoint = stub((200, "Score: 9"))
    monkeypatch.setenv("GRPOFLOW_TEST_JUDGE_KEY", KEY)
    reward = judge(
        endpoint.base_url,
        api_key_env="GRPOFLOW_TEST_JUDGE_KEY",
        max_score=10,
        rubric="{prompt}|{completion}|{answer}",
        max_tokens=5,
    )
    assert score(reward, ["4", "<answer>4</answer>"], answer=["4", "4"]) == [0.9, 0.9]
    first = endpoint.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == f"Bearer {KEY}"
    assert first["body"]["model"] == "judge" and first["body"]["max_tokens"] == 5 and first["body"]["temperature"] == 0
    sent = sorted(r["body"]["messages"][0]["content"] for r in endpoint.requests)
    assert sent == ["What is 2+2?|4|4", "What is 2+2?|<answer>4</answer>|4"]


def test_chat_prompts_and_completions_reach_the_judge_as_text(stub):
    endpoint = stub((200, "5"))
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert score(judge(endpoint.base_url), [[{"role": "assistant", "content": "4"}]], prompts=[prompt]) == [5.0]
    assert (
        endpoint.requests[0]["body"]["messages"][0]["content"] == "Q: system: Be brief.\nuser: 2+2?\nA: 4\nScore 0-10:"
    )


def test_429_and_5xx_are_retried_honouring_retry_after(stub):
    endpoint = stub((429, "slow down", {"Retry-After": "0.3"}, 0.0), (503, "overloaded"), (200, "6"))
    started = time.monotonic()
    assert score(judge(endpoint.base_url, retries=2), ["4"]) == [6.0]
    assert len(endpoint.requests) == 3
    assert time.monotonic() - started >= 0.3  # the server's Retry-After, over the 0.01 s backoff


def test_a_persistent_5xx_fails_naming_the_endpoint_after_the_retries(stub, monkeypatch):
    endpoint = stub((500, "boom"))
    monkeypatch.setenv("GRPOFLOW_TEST_JUDGE_KEY", KEY)
    reward = judge(endpoint.base_url, retries=2, api_key_env="GRPOFLOW_TEST_JUDGE_KEY")
    with pytest.raises(JudgeError) as raised:
        score(reward, ["4"])
    assert str(raised.value).startswith(f"the judge at {endpoint.base_url} answered HTTP 500 after 3 attempts: ")
    assert len(endpoint.requests) == 3 and KEY not in str(raised.value)


def test_a_4xx_is_not_retried(stub):
    endpoint = stub((401, "bad key"))
    with pytest.raises(JudgeError, match=r"answered HTTP 401: .*bad key"):
        score(judge(endpoint.base_url, retries=3), ["4"])
    assert len(endpoint.requests) == 1


def test_a_slow_judge_times_out(stub):
    endpoint = stub((200, "7", {}, 1.0))
    with pytest.raises(JudgeError, match=r"cannot reach the judge at .* \(ReadTimeout.*\) after 2 attempts"):
        score(judge(endpoint.base_url, timeout=0.2, retries=1), ["4"])


def test_a_trickling_judge_ends_at_its_timeout():
    # One byte every 0.3 s, headers included: each read is quick, the answer would take ~40 s.
    with HostileServer("trickle", every_s=0.3) as server:
        error, seconds = timed(lambda: score(judge(server.base_url, timeout=1, retries=0), ["4"]))
    assert str(error) == (
        f"cannot reach the judge at {server.base_url} (ReadTimeout: no complete reply within 1 s, the request's whole "
        "timeout) after 1 attempts"
    )
    assert seconds < 2.0


def test_a_huge_judge_reply_is_refused_naming_the_cap_and_not_retried(monkeypatch):
    monkeypatch.setenv("GRPOFLOW_HTTP_MAX_RESPONSE_MB", "1")
    with HostileServer("huge", size=20_000_000) as server:
        with pytest.raises(JudgeError) as raised:
            score(judge(server.base_url, retries=3), ["4"])
    assert str(raised.value) == (
        f"the judge at {server.base_url} sent a reply over 1 MB, the cap GRPOFLOW_HTTP_MAX_RESPONSE_MB sets; not read "
        "further"
    )
    assert server.requests == 1


def test_concurrency_bounds_the_requests_in_flight(stub):
    endpoint = stub((200, "1", {}, 0.2))
    started = time.monotonic()
    assert score(judge(endpoint.base_url, concurrency=3), ["a"] * 9) == [1.0] * 9
    elapsed = time.monotonic() - started
    assert endpoint.most_in_flight == 3
    assert elapsed > 0.55  # three waves of 0.2 s at least: never more than three at once (timing's upper end varies)


def test_a_judge_that_is_down_fails_the_dry_run_naming_its_url():
    reward = build_reward(
        "llm_judge", kwargs={**GOOD, "base_url": "http://127.0.0.1:9/v1", "retries": 1, "backoff": 0.01}
    )
    rows = [{"prompt": "What is 2+2?", "answer": "4"}]
    with pytest.raises(RewardError) as raised:
        dry_run_rewards([("llm_judge", reward)], rows, "prompt")
    assert "reward 'llm_judge' raised JudgeError: cannot reach the judge at http://127.0.0.1:9/v1" in str(raised.value)


def test_a_judge_that_hangs_the_dry_run_is_named_with_its_url(stub):
    endpoint = stub((200, "7", {}, 1.5))
    reward = build_reward("llm_judge", kwargs={**GOOD, "base_url": endpoint.base_url, "retries": 0})
    with pytest.raises(RewardError) as raised:
        dry_run_rewards([("llm_judge", reward)], [{"prompt": "What is 2+2?"}], "prompt", timeout_s=0.5)
    assert str(raised.value) == (
        f"reward 'llm_judge' did not return within 0.5 s on dataset row 0 (waiting on {endpoint.base_url}: is it up "
        "and reachable from here?)"
    )


@pytest.mark.parametrize(
    "status, content_type, body, retries, expect, attempts",
    [
        # a wrong key: final at once, the server's own words quoted
        (401, "application/json", '{"error": "bad key"}', 2, "answered HTTP 401: bad key", 1),
        # a proxy's error page, retried, then named with its attempts
        (502, "text/html", "<h1>Bad Gateway</h1>", 1, "answered HTTP 502 after 2 attempts: <h1>Bad Gateway</h1>", 2),
        # 200 but not JSON (a login page, a captive portal): what it sent, not a traceback
        (200, "text/html", "<html>sign in</html>", 2, "sent no choices[0].message.content: <html>sign in</html>", 1),
        # JSON of another API: no choices
        (200, "application/json", '{"result": 7}', 2, 'sent no choices[0].message.content: {"result": 7}', 1),
        # JSON declared, not sent
        (200, "application/json", "{not json", 2, "sent no choices[0].message.content: {not json", 1),
    ],
)
def test_what_a_user_reads_when_the_judge_answers_wrong(stub, status, content_type, body, retries, expect, attempts):
    endpoint = stub((status, body, {"content-type": content_type}, 0.0))
    with pytest.raises(JudgeError) as raised, command_line():  # the user's own spec: what the endpoint sent
        score(judge(endpoint.base_url, retries=retries), ["4"])
    assert str(raised.value) == f"the judge at {endpoint.base_url} {expect}"
    assert len(endpoint.requests) == attempts


@pytest.mark.parametrize(
    "status, content_type, body, expect",
    [
        # an OpenAI-compatible server's error: its own words, as from the command line
        (401, "application/json", '{"error": {"message": "bad key", "type": "auth"}}', "answered HTTP 401: bad key"),
        # a service on the worker's loopback answering a POST with its records: none of them
        (200, "application/json", '[{"name": "db_password", "value": "s3cret"}]',
         "sent no choices[0].message.content: a reply of 44 bytes (application/json) without an error message, "
         "not shown (the spec came from a deployment)"),
        # JSON nested past the parser's recursion limit: an error of the judge, not a RecursionError of the reward
        (200, "application/json", "[" * 50_000 + "]" * 50_000,
         "sent no choices[0].message.content: a reply of 100000 bytes (application/json) without an error message, "
         "not shown (the spec came from a deployment)"),
        (403, "text/html", "<p>admin console: token=abc</p>",
         "answered HTTP 403: a reply of 31 bytes (text/html) without an error message, not shown (the spec came "
         "from a deployment)"),
    ],
)  # fmt: skip
def test_a_deployments_judge_shows_no_reply_but_an_error_message(stub, status, content_type, body, expect):
    """Whoever launches a deployment's run names the judge's base_url and reads the run's state and logs: an endpoint
    at a service the worker reaches (loopback, the cluster's network) must not have its reply shown to them."""
    endpoint = stub((status, body, {"content-type": content_type}, 0.0))
    with pytest.raises(JudgeError) as raised:
        score(judge(endpoint.base_url, retries=0), ["4"])
    assert str(raised.value) == f"the judge at {endpoint.base_url} {expect}"
    assert "s3cret" not in str(raised.value) and "token=abc" not in str(raised.value)


def test_a_judge_name_rebinding_to_metadata_is_never_reached(stub, monkeypatch):
    # Loopback when the reward is built, the metadata address when openai's client sends: sent nowhere.
    import socket

    real, looked_up = socket.getaddrinfo, []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "judge.example":
            return real(host, port, *args, **kwargs)
        looked_up.append(host)
        address = "127.0.0.1" if len(looked_up) == 1 else "169.254.169.254"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    endpoint = stub((200, "7"))
    url = endpoint.base_url.replace("127.0.0.1", "judge.example")
    with pytest.raises(JudgeError) as raised:
        score(judge(url, retries=2), ["4"])
    assert str(raised.value) == (
        f"the judge at {url}: refused: judge.example resolves to 169.254.169.254, a link-local address"
    )
    assert endpoint.requests == [] and looked_up == ["judge.example", "judge.example"]  # not retried either
