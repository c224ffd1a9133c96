"""`grpoflow serve`'s transformers server: OpenAI-compatible endpoints on loopback, answered by a real model."""

import threading

import httpx
import pytest
import torch

from flows.serve import make_server, vllm_command
from trainers.tiny import build_tiny


@pytest.fixture(scope="module")
def server():
    srv = make_server(str(build_tiny()), "tiny", port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}/v1"
    srv.shutdown()
    srv.server_close()


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
    "path, body, fragment",
    [
        ("/chat/completions", {"messages": "hi"}, "messages"),  # not a list of messages
        ("/chat/completions", {"messages": []}, "messages"),  # an empty chat
        ("/completions", {"prompt": ["a", "b"]}, "prompt"),  # only one string prompt
        ("/completions", {}, "prompt"),  # no prompt
        ("/completions", {"prompt": "x", "max_tokens": "many"}, "many"),  # not a number
    ],
)
def test_bad_requests_are_400_naming_the_field(client, path, body, fragment):
    response = client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and fragment in error["message"]


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
