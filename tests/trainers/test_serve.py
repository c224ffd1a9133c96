"""`grpoflow serve`'s transformers server: OpenAI-compatible endpoints on loopback, answered by a real model and
called with the official `openai` client (and plain HTTP where the client would hide what goes over the wire)."""

import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import torch

from grpoflow.trainers.model.load import load_tokenizer
from grpoflow.trainers.model.serve import _Stream, make_server, vllm_command
from grpoflow.trainers.model.tiny import build_tiny

MESSAGES = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def srv():
    srv = make_server(str(build_tiny()), "tiny", port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def server(srv):
    return f"http://127.0.0.1:{srv.server_port}/v1"


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        yield client


def test_openai_compatible_endpoints(client):
    assert client.get("/models").json()["data"][0]["id"] == "tiny"

    completion = client.post("/completions", json={"model": "tiny", "prompt": "What is 2+3?", "max_tokens": 5})
    assert completion.status_code == 200
    body = completion.json()
    assert body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str)
    assert 1 <= body["usage"]["completion_tokens"] <= 5

    chat = client.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    message = chat.json()["choices"][0]["message"]
    assert chat.status_code == 200 and message["role"] == "assistant" and isinstance(message["content"], str)


def test_greedy_is_deterministic_and_usage_adds_up(client):
    request = {"prompt": "What is 2+3?", "max_tokens": 6, "temperature": 0}
    first, second = client.post("/completions", json=request).json(), client.post("/completions", json=request).json()
    assert first["choices"][0]["text"] == second["choices"][0]["text"]  # temperature 0: greedy
    usage = first["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] == len(b"What is 2+3?")  # the tiny model's tokens are bytes
    assert 1 <= usage["completion_tokens"] <= 6
    if usage["completion_tokens"] < 6:
        assert first["choices"][0]["finish_reason"] == "stop"  # ended before max_tokens: the model stopped


@pytest.mark.parametrize(
    "path, body, param, fragment",
    [
        ("/chat/completions", {"messages": "hi"}, "messages", "messages"),  # not a list of messages
        ("/chat/completions", {"messages": []}, "messages", "messages"),  # an empty chat
        ("/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "messages", "content"),  # no text
        ("/completions", {"prompt": ["a", "b"]}, "prompt", "prompt"),  # only one string prompt
        ("/completions", {}, "prompt", "prompt"),  # no prompt
        ("/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens", "many"),  # not a number
        ("/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "at least 1"),  # nothing to generate
        ("/completions", {"prompt": "x", "max_tokens": 10_000}, "max_tokens", "at most 511"),  # past the context
        ("/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens", "1"),
        ("/completions", {"prompt": "x", "n": 0}, "n", "at least 1"),  # no choices
        ("/completions", {"prompt": "x", "n": 1.5}, "n", "int"),  # a fraction of a choice
        ("/completions", {"prompt": "x", "temperature": -0.5}, "temperature", "at least 0"),
        ("/completions", {"prompt": "x", "temperature": 2.5}, "temperature", "at most 2"),  # OpenAI's range
        ("/completions", {"prompt": "x", "temperature": "hot"}, "temperature", "hot"),
        ("/completions", {"prompt": "x", "top_p": 1.5}, "top_p", "at most 1"),
        ("/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),  # OpenAI's limit
        ("/completions", {"prompt": "x", "stop": [""]}, "stop", "non-empty"),  # would stop at once
        ("/completions", {"prompt": "x", "seed": "lucky"}, "seed", "lucky"),
        ("/completions", {"prompt": "x", "stream": "yes"}, "stream", "bool"),
        ("/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", "stream"),
        ("/completions", {"prompt": "x", "model": "gpt-4o"}, "model", "gpt-4o"),  # the one model here is tiny
        ("/chat/completions", {"messages": MESSAGES, "logprobs": True}, "logprobs", "not supported"),  # not faked
        ("/completions", {"prompt": "x", "presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ],
)
def test_bad_requests_are_400_naming_the_field(client, path, body, param, fragment):
    response = client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and fragment in error["message"]


def test_a_body_that_is_not_json_is_400(client):
    response = client.post("/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not JSON" in response.json()["error"]["message"]


def test_the_openai_client_sees_a_bad_request(oai):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="tiny", messages=MESSAGES, n=0)
    assert caught.value.status_code == 400 and caught.value.body["param"] == "n"


def test_fields_that_ask_for_nothing_are_accepted(client):
    body = {"prompt": "x", "max_tokens": 1, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0}
    assert client.post("/completions", json=body).status_code == 200


def test_models_lists_the_one_served(oai):
    assert [model.id for model in oai.models.list()] == ["tiny"]


def test_streaming_chat_sends_the_role_then_deltas_then_the_finish_reason(oai):
    chunks = list(
        oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stream=True)
    )
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    deltas = [c.choices[0].delta.content for c in chunks[1:-1]]
    assert len(deltas) > 1 and all(deltas)  # token by token as decoded, not one chunk at the end
    assert all(chunk.usage is None for chunk in chunks)  # no usage chunk unless asked for
    whole = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert "".join(deltas) == whole.choices[0].message.content


def test_a_seeded_stream_equals_the_seeded_response_and_usage_comes_last_when_asked(oai):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "seed": 7}  # temperature 1: sampled
    chunks = list(oai.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    whole = oai.chat.completions.create(**request)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_usage_counts_the_tokenizers_tokens(oai):
    tokenizer = load_tokenizer(str(build_tiny()))
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    response = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, temperature=0, n=2)
    assert response.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert [c.finish_reason for c in response.choices] == ["length", "length"]  # greedy on the tiny model: no end
    assert response.usage.completion_tokens == 2 * 5
    assert response.usage.total_tokens == response.usage.prompt_tokens + 10


def test_n_gives_n_choices_streamed_by_index(oai):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "n": 3, "seed": 3}
    whole = oai.chat.completions.create(**request)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len({c.message.content for c in whole.choices}) > 1  # sampled: the choices differ
    streamed = {0: "", 1: "", 2: ""}
    for chunk in oai.chat.completions.create(**request, stream=True):
        streamed[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert [streamed[i] for i in range(3)] == [c.message.content for c in whole.choices]


def test_temperature_defaults_to_one_and_top_p_to_one(srv, oai):
    config = srv.generator.generation_config(srv.generator.parse("/v1/chat/completions", {"messages": MESSAGES}))
    assert (config.do_sample, config.temperature, config.top_p, config.top_k) == (True, 1.0, 1.0, 0)
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12}  # no temperature: sampled
    texts = [oai.chat.completions.create(**request, seed=seed).choices[0].message.content for seed in (1, 1, 2)]
    assert texts[0] == texts[1] != texts[2]


def test_stop_cuts_the_text_before_the_stop_string(oai):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 24, "seed": 11}
    free = oai.chat.completions.create(**request).choices[0].message.content
    stop = next(free[i : i + 2] for i in range(2, len(free) - 1) if "\ufffd" not in free[i : i + 2])
    expected = free[: free.find(stop)]
    for stops in (stop, ["never here", stop]):  # a string or a list
        choice = oai.chat.completions.create(**request, stop=stops).choices[0]
        assert (choice.message.content, choice.finish_reason) == (expected, "stop")
    chunks = list(oai.chat.completions.create(**request, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected  # the held-back tail never leaks
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_stream_too(oai):
    request = {"model": "tiny", "prompt": "What is", "max_tokens": 6, "seed": 5}
    chunks = list(oai.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    whole = oai.completions.create(**request)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage == whole.usage


def test_the_wire_format_is_server_sent_events_ending_in_done(client):
    body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "stream": True}
    with client.stream("POST", "/chat/completions", json=body) as response:
        assert response.headers["content-type"] == "text/event-stream"
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"


def test_a_client_leaving_a_stream_does_not_hold_the_server(server, oai):
    body = {"messages": MESSAGES, "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", server + "/chat/completions", json=body, timeout=60) as response:
        next(response.iter_lines())
    reply = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, temperature=0)
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/nope"),  # no such route
        ("POST", "/embeddings"),  # an OpenAI endpoint this server does not offer
        ("GET", "/completions"),  # a POST route
        ("POST", "/models"),  # a GET route
    ],
)
def test_unknown_routes_are_404(server, method, path):
    response = httpx.request(method, server + path, timeout=60)
    assert response.status_code == 404 and "no route" in response.json()["error"]["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_transformers_serves():
    assert vllm_command("/models/m", "m", "127.0.0.1", 8000) is None


@pytest.mark.parametrize(
    "text, stop, expected",
    [
        ("ab cde", ("cd",), ["a", "b", " "]),  # "c" waits: it may start the stop string, which it does
        ("ab cxe", ("cd",), ["a", "b", " ", "cx", "e"]),  # "c" waits one token, then goes with the "x" that clears it
        ("abcd", ("zz", "bc"), ["a"]),  # the earliest of several stop strings
        ("abc", (), ["a", "b", "c"]),  # no stop: every letter as it comes
    ],
)
def test_stream_holds_back_what_may_start_a_stop_string(text, stop, expected):
    tokenizer, sent = load_tokenizer(str(build_tiny())), []
    streamer = _Stream(tokenizer, stop, sent.append)
    streamer.put(torch.tensor([0]))  # the prompt, skipped
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert sent == expected and streamer.text == "".join(expected)


@pytest.mark.slow  # ~13 s: a fresh interpreter imports torch and transformers
@pytest.mark.usefixtures("prefect_server")
def test_grpoflow_serve_streams_a_registered_name(tmp_path, trained_job, monkeypatch):
    """The commands a user runs: `grpoflow serving register JOB` on a job the pipeline finished, then `grpoflow serve
    NAME`, answered over loopback; from a folder that is not the job's output root, as the job index allows (serve,
    like serving list, looked in ./runs alone and found nothing)."""
    from grpoflow.core.jobdir import remember
    from tests.conftest import cli

    job = trained_job("full")
    monkeypatch.setenv("GRPOFLOW_JOB_INDEX", str(tmp_path / "index"))  # this job's root only, for the serve child too
    remember(job.job_id, str(job.root))  # as `grpoflow run` does
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, _, err = cli("serving", "register", job.job_id, "--name", "tiny")
    assert code == 0, err
    code, out, err = cli("serving", "list")
    assert code == 0 and out.startswith(f"tiny  (current: v1)  {job.root.parent}"), out + err
    with socket.socket() as probe:  # a free port, released for the server to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "grpoflow.flows.cli",
        "serve",
        "tiny",
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert [m.id for m in client.models.list()] == ["tiny"]
                break
            except openai.APIConnectionError:
                assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
                time.sleep(0.2)
        chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        # Sampled from a model trained to answer short: it may end before max_tokens, or be cut there.
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert len([c for c in chunks if c.choices[0].delta.content]) <= 4
    finally:
        process.terminate()
        process.wait(timeout=30)
