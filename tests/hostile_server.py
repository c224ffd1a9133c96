"""An HTTP endpoint on 127.0.0.1 that answers as a hostile one would, for the tests of bounded outbound requests
(`grpoflow.core.outbound`): it reads any request (GET or POST) and then

- `trickle`: sends a well-formed answer (status line and headers included) one byte every `every_s` seconds, so no
  single read ever waits long: only a total deadline ends it;
- `huge`: sends `size` bytes of a JSON string as fast as the client reads, with no Content-Length (the body ends when
  the connection closes), so only counting what is read stops it; `declared=True` sends its Content-Length too;
- `gzip`: sends `size` zero bytes gzip-compressed (`content-encoding: gzip`): a small download that inflates.

    with HostileServer("trickle", every_s=0.3) as server:
        get_llm_judge_reward(server.base_url, ...)
"""

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 64 * 1024
# What a chat-completions endpoint answers, so a client that is patient enough would read a score.
ANSWER = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "7"}}]}).encode()


class HostileServer:
    """The endpoint; `requests` counts the requests it has read, `base_url` is its `/v1` root."""

    def __init__(self, mode: str, size: int = 0, every_s: float = 0.3, declared: bool = False):
        self.requests, self.stopping = 0, threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                server.requests += 1
                try:
                    {"trickle": server.trickle, "huge": server.huge, "gzip": server.gzip}[mode](self)
                except OSError:  # the client gave up and hung up: what a bounded client does
                    pass

            do_GET = do_POST = answer  # noqa: N815 (http.server's naming)

            def log_message(self, *args):
                pass

        self.size, self.every_s, self.declared = size, every_s, declared
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.base_url = f"{self.url}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def trickle(self, handler: BaseHTTPRequestHandler) -> None:
        head = f"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(ANSWER)}\r\n\r\n"
        for byte in head.encode() + ANSWER:
            if self.stopping.wait(self.every_s):
                return
            handler.wfile.write(bytes([byte]))

    def huge(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        if self.declared:
            handler.send_header("content-length", str(self.size + 2))
        handler.end_headers()
        handler.wfile.write(b'"')
        for start in range(0, self.size, CHUNK):
            handler.wfile.write(b"x" * min(CHUNK, self.size - start))
        handler.wfile.write(b'"')

    def gzip(self, handler: BaseHTTPRequestHandler) -> None:
        body = gzip.compress(b"0" * self.size)
        handler.send_response(200)
        handler.send_header("content-encoding", "gzip")
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "HostileServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def timed(call) -> tuple[object, float]:
    """`call()`'s result (or the exception it raised) and the seconds it took."""
    started = time.monotonic()
    try:
        result = call()
    except Exception as exc:
        result = exc
    return result, time.monotonic() - started
