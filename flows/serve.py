"""`grpoflow serve NAME`: an OpenAI-compatible HTTP API for a registered deployment, on loopback by default.

Endpoints: `GET /v1/models`, `POST /v1/completions` (`prompt`), `POST /v1/chat/completions` (`messages`), with
`max_tokens` and `temperature` (0 = greedy). With vLLM installed and a GPU present, `serve` hands the merged weights
to vLLM's own OpenAI server instead; otherwise transformers generates (one request at a time, enough for a smoke
test or a small internal endpoint, not for production traffic).
"""

import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Generator:
    """Holds the model and turns OpenAI-style request bodies into completions."""

    def __init__(self, model_dir: str, name: str):
        import torch
        from transformers import AutoModelForCausalLM

        from trainers.modeling import load_tokenizer

        self.name, self.torch = name, torch
        self.tokenizer = load_tokenizer(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.lock = threading.Lock()  # one generate() at a time: the model is not re-entrant

    def complete(self, text: str, max_tokens: int, temperature: float) -> tuple[str, str, dict]:
        enc = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with self.lock, self.torch.no_grad():
            out = self.model.generate(
                **enc, max_new_tokens=max_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
            )
        new = out[0, enc["input_ids"].shape[1] :]
        finished = len(new) < max_tokens or new[-1].item() == self.tokenizer.eos_token_id
        usage = {"prompt_tokens": enc["input_ids"].shape[1], "completion_tokens": len(new)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return self.tokenizer.decode(new, skip_special_tokens=True), "stop" if finished else "length", usage

    def respond(self, path: str, body: dict) -> dict:
        max_tokens = int(body.get("max_tokens") or 64)
        temperature = float(body.get("temperature", 0.0))
        base = {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": self.name}
        if path == "/v1/chat/completions":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list of {role, content}")
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            content, finish, usage = self.complete(text, max_tokens, temperature)
            choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
            return {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("'prompt' must be a string")
        content, finish, usage = self.complete(prompt, max_tokens, temperature)
        choice = {"index": 0, "text": content, "finish_reason": finish}
        return {**base, "object": "text_completion", "choices": [choice], "usage": usage}


def make_handler(generator: Generator):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path != "/v1/models":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            self._send(200, {"object": "list", "data": [{"id": generator.name, "object": "model"}]})

        def do_POST(self):  # noqa: N802
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                self._send(200, generator.respond(self.path, body))
            except (ValueError, TypeError) as e:
                self._send(400, {"error": {"message": str(e), "type": "invalid_request_error"}})

        def log_message(self, fmt, *args):
            print(f"serve: {self.address_string()} {fmt % args}", file=sys.stderr)

    return Handler


def make_server(model_dir: str, name: str, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """The transformers-backed server (not started); `server.serve_forever()` runs it."""
    return ThreadingHTTPServer((host, port), make_handler(Generator(model_dir, name)))


def vllm_command(model_dir: str, name: str, host: str, port: int) -> list[str] | None:
    """vLLM's OpenAI server command when vLLM and a GPU are both present, else None."""
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        return None
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    return [*server, "--served-model-name", name, "--host", host, "--port", str(port)]


def serve(model_dir: str, name: str, host: str, port: int) -> None:
    command = vllm_command(model_dir, name, host, port)
    if command:
        os.execv(command[0], command)
    server = make_server(model_dir, name, host, port)
    print(f"serving {name} on http://{host}:{server.server_port}/v1 (transformers); Ctrl-C stops", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
