"""`grpoflow serve NAME`: an OpenAI-compatible HTTP API for a name in the serving registry, on loopback by default.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` (`messages`) and `POST /v1/completions` (`prompt`), with
OpenAI's request fields and defaults: `stream` (server-sent `chat.completion.chunk` / `text_completion` events, then
`data: [DONE]`), `stream_options.include_usage`, `temperature` (default 1; 0 is greedy), `top_p` (default 1), `n`,
`stop`, `max_tokens` / `max_completion_tokens` (default: the rest of the context window) and `seed`; every response
carries `usage`. A bad field, or one this server does not honour (`UNSUPPORTED`), is an HTTP 400 with OpenAI's
error body naming it (`error.param`).

With vLLM installed and a GPU present, `serve` hands the merged weights to vLLM's own OpenAI server instead;
otherwise transformers generates (one request at a time, enough for a smoke test or a small internal endpoint, not
for production traffic). transformers' own `transformers serve` is not used: it ignores `n` and
`stream_options`, sends no `data: [DONE]`, and answers a bad field with 200 or FastAPI's `{"detail"}` body.
"""

import importlib.util
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from transformers import AutoModelForCausalLM, GenerationConfig, TextStreamer

from grpoflow.trainers.model.load import load_tokenizer

# OpenAI request fields this server does not honour, each with the value that asks for nothing (which some clients
# send anyway): any other value is a 400, not an answer that silently lacks what was asked for.
UNSUPPORTED = {
    "logprobs": False,
    "top_logprobs": 0,
    "echo": False,
    "best_of": 1,
    "suffix": "",
    "logit_bias": {},
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "tools": [],
    "response_format": {"type": "text"},
}


class RequestError(ValueError):
    """A client's mistake: HTTP 400 with OpenAI's error body, `param` naming the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Request:
    """One validated request body: the prompt's token ids and OpenAI's sampling fields with their defaults."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False


def _field(body: dict, key: str, kinds: tuple, default=None, low=None, high=None):
    """`body[key]` if it is one of `kinds` within [low, high], `default` when absent or null; else RequestError."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
        raise RequestError(f"'{key}' must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}", key)
    if low is not None and value < low:
        raise RequestError(f"'{key}' must be at least {low}, got {value!r}", key)
    if high is not None and value > high:
        raise RequestError(f"'{key}' must be at most {high}, got {value!r}", key)
    return value


def _stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (
        isinstance(stops, list) and len(stops) <= 4 and all(isinstance(s, str) and s for s in stops)
    ):
        raise RequestError(f"'stop' must be a string or a list of up to 4 non-empty strings, got {stop!r}", "stop")
    return tuple(stops or ())


def _message_text(content) -> str:
    """A message's `content`: a string, or OpenAI's list of `{"type": "text", "text": ...}` parts."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise RequestError(
            f"a message's 'content' must be a string or a list of text parts, got {content!r}", "messages"
        )
    return content


class _Stream(TextStreamer):
    """transformers' incremental decoding, its text handed to `emit` as it is final and cut before the first stop
    string (a tail that may start one is held back until the next token says)."""

    def __init__(self, tokenizer, stop: tuple[str, ...], emit):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.stop, self.emit, self.text, self.sent, self.stopped = stop, emit, "", 0, False

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if self.stopped:
            return
        self.text += text
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stop) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True
        held = 0 if self.stopped or stream_end else self._held()
        if len(self.text) - held > self.sent:
            self.emit(self.text[self.sent : len(self.text) - held])
            self.sent = len(self.text) - held

    def _held(self) -> int:
        """How long a tail of the text is also the start of a stop string."""
        return max((k for s in self.stop for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)


class Generator:
    """Holds the model and turns OpenAI-style request bodies into completions."""

    def __init__(self, model_dir: str, name: str):
        import torch

        self.name, self.torch = name, torch
        self.tokenizer = load_tokenizer(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.context = getattr(self.model.config, "max_position_embeddings", None)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = {*(eos if isinstance(eos, list) else [eos]), self.tokenizer.eos_token_id} - {None}
        self.lock = threading.Lock()  # one generate() at a time: the model is not re-entrant

    def parse(self, path: str, body: dict) -> Request:
        """Validates `body` (raising RequestError naming the field) and tokenizes its prompt."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if body.get("model") not in (None, self.name):
            raise RequestError(
                f"model {body['model']!r} is not served here; this server serves {self.name!r}", "model"
            )
        for key, harmless in UNSUPPORTED.items():
            if body.get(key) not in (None, harmless):
                raise RequestError(f"'{key}' is not supported by this server (grpoflow serve on transformers)", key)
        chat = path == "/v1/chat/completions"
        ids = self._prompt_ids(body) if chat else self._completion_prompt_ids(body)
        stream = _field(body, "stream", (bool,), False)
        options = body.get("stream_options")
        if options is not None and not (stream and isinstance(options, dict)):
            raise RequestError("'stream_options' is only allowed with 'stream': true, as an object", "stream_options")
        max_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        room = (self.context - len(ids)) if self.context else None
        if room is not None and room < 1:
            raise RequestError(f"the prompt has {len(ids)} tokens, the model's context is {self.context}", max_key)
        max_tokens = _field(body, max_key, (int,), room or 256, low=1, high=room)
        return Request(
            chat=chat,
            prompt_ids=ids,
            max_tokens=max_tokens,
            temperature=float(_field(body, "temperature", (int, float), 1.0, low=0, high=2)),
            top_p=float(_field(body, "top_p", (int, float), 1.0, low=0, high=1)),
            n=_field(body, "n", (int,), 1, low=1, high=128),
            stop=_stop_strings(body),
            seed=_field(body, "seed", (int,)),
            stream=stream,
            include_usage=bool(_field(options or {}, "include_usage", (bool,), False)),
        )

    def _prompt_ids(self, body: dict) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("'messages' must be a non-empty list of {role, content}", "messages")
        chat = [{"role": str(m.get("role")), "content": _message_text(m.get("content"))} for m in messages]
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _completion_prompt_ids(self, body: dict) -> list[int]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RequestError("'prompt' must be a string (one prompt per request)", "prompt")
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def generation_config(self, request: Request):
        """OpenAI's sampling in transformers' terms: temperature and top_p only (no top_k, no repetition penalty,
        whatever the model's generation_config.json suggests); temperature 0 is greedy."""
        sampling = {"do_sample": True, "temperature": request.temperature, "top_p": request.top_p, "top_k": 0}
        return GenerationConfig(
            max_new_tokens=request.max_tokens,
            stop_strings=list(request.stop) or None,
            repetition_penalty=1.0,
            pad_token_id=self.tokenizer.pad_token_id,
            **(sampling if request.temperature > 0 else {"do_sample": False}),
        )

    def generate(self, request: Request, emit=lambda index, text, finish=None: None) -> list[tuple[str, str, int]]:
        """(text, finish_reason, completion tokens) for each of the request's `n` choices, generated one after
        another. `emit(index, text, finish)` hears of each choice as it goes: `""` when it starts, its text as it is
        decoded, then `""` with its finish_reason."""
        config, ids = self.generation_config(request), self.torch.tensor([request.prompt_ids])
        choices = []
        with self.lock, self.torch.no_grad():
            if request.seed is not None:
                self.torch.manual_seed(request.seed)
            for index in range(request.n):
                emit(index, "")
                streamer = _Stream(self.tokenizer, request.stop, lambda text, i=index: emit(i, text))
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=self.torch.ones_like(ids),
                    generation_config=config,
                    streamer=streamer,
                    tokenizer=self.tokenizer,  # for stop_strings
                )
                new = out[0, ids.shape[1] :].tolist()
                ended = streamer.stopped or len(new) < request.max_tokens or (new and new[-1] in self.eos_ids)
                choices.append((streamer.text, "stop" if ended else "length", len(new)))
                emit(index, "", choices[-1][1])
        return choices

    def usage(self, request: Request, choices: list) -> dict:
        completion = sum(tokens for _, _, tokens in choices)
        prompt = len(request.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def respond(self, request: Request) -> dict:
        """The whole (non-streaming) response body."""
        choices = self.generate(request)
        base = {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": self.name}
        if request.chat:
            listed = [
                {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                for i, (text, finish, _) in enumerate(choices)
            ]
            return {**base, "object": "chat.completion", "choices": listed, "usage": self.usage(request, choices)}
        listed = [
            {"index": i, "text": text, "finish_reason": finish, "logprobs": None}
            for i, (text, finish, _) in enumerate(choices)
        ]
        return {**base, "object": "text_completion", "choices": listed, "usage": self.usage(request, choices)}

    def stream(self, request: Request, send) -> None:
        """The response as events, each chunk's JSON passed to `send`: per choice the role first (chat), its text
        as it is decoded, then its finish_reason; with `include_usage` a last chunk with no choices and the usage."""
        base = {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": self.name}
        base["object"] = "chat.completion.chunk" if request.chat else "text_completion"
        if request.include_usage:
            base["usage"] = None

        def emit(index: int, text: str, finish: str | None = None) -> None:
            if request.chat:
                delta = {"content": text} if text else {} if finish else {"role": "assistant", "content": ""}
                send({**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})
            elif text or finish:  # a completion has no role to announce
                send({**base, "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": None}]})

        choices = self.generate(request, emit)
        if request.include_usage:
            send({**base, "choices": [], "usage": self.usage(request, choices)})


def _error(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def make_handler(generator: Generator):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, request: Request) -> None:
            # HTTP/1.0: the connection closing ends the event stream, so no length or chunked encoding is needed.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.end_headers()
            try:
                generator.stream(request, lambda chunk: self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode()))
                self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):  # the client left: generate() stopped with the write
                self.log_message("client closed the stream")

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path != "/v1/models":
                return self._send(404, _error(f"no route {self.path}", kind="not_found_error"))
            model = {"id": generator.name, "object": "model", "created": 0, "owned_by": "grpoflow"}
            self._send(200, {"object": "list", "data": [model]})

        def do_POST(self):  # noqa: N802
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, _error(f"no route {self.path}", kind="not_found_error"))
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                request = generator.parse(self.path, body)
            except RequestError as e:
                return self._send(400, _error(str(e), e.param))
            except ValueError as e:  # the body is not JSON
                return self._send(400, _error(f"the request body is not JSON: {e}"))
            if request.stream:
                return self._stream(request)
            self._send(200, generator.respond(request))

        def log_message(self, fmt, *args):
            print(f"serve: {self.address_string()} {fmt % args}", file=sys.stderr)

    return Handler


def make_server(model_dir: str, name: str, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """The transformers-backed server (not started; `server.serve_forever()` runs it), its model at
    `server.generator`."""
    generator = Generator(model_dir, name)
    server = ThreadingHTTPServer((host, port), make_handler(generator))
    server.generator = generator
    return server


def vllm_command(model_dir: str, name: str, host: str, port: int) -> list[str] | None:
    """vLLM's OpenAI server command when vLLM and a GPU are both present, else None. `--generation-config vllm`
    keeps OpenAI's defaults (temperature 1, top_p 1) rather than the model's generation_config.json."""
    import torch

    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        return None
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    return [*server, "--served-model-name", name, "--host", host, "--port", str(port), "--generation-config", "vllm"]


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
