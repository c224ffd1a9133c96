"""A Hugging Face Hub stand-in on 127.0.0.1, for driving the real `huggingface_hub` client in tests.

It serves exactly what `HfApi.create_repo`, `repo_info`, `upload_folder` (both its single-commit path and its
hf_xet pipeline), `list_repo_files` / `list_repo_tree` and `list_repo_commits` call:

- `POST /api/repos/create`: creates the repo with an initial `.gitattributes` commit, as the Hub does; 409 if it
  exists.
- `POST /api/validate-yaml`: checks that the README's front matter parses.
- `GET /api/models/{repo}[/revision/main]`: repo info: `sha` (the head), `private`, `siblings`, `gated`.
- `GET /api/models/{repo}/auth-check`: 200, or 403 `GatedRepo` for a repo made `gated` (no token is granted).
- `POST /api/models/{repo}/preupload/main`: `uploadMode: "regular"` for every file, so no LFS or Xet transfer is
  needed, and the file's current git-blob oid, which the client compares with its own to skip unchanged files.
- `POST /api/models/{repo}/commit/main`: applies an NDJSON commit (`header`, `file` in base64, `deletedFile`,
  `deletedFolder`).
- `GET /api/models/{repo}/tree/main[/{path}]`: the file listing; `GET /api/models/{repo}/commits/main`: the
  history, newest first.
- `HEAD` and `GET /{repo}/resolve/{revision}/{path}` (what `get_hf_file_metadata` and `hf_hub_download` call): the
  file at `main` or at a commit's oid, with `X-Repo-Commit`, `ETag` (its git-blob oid) and its bytes; 404
  `RepoNotFound`, `RevisionNotFound` or `EntryNotFound` as the Hub says them.

Authentication is `Authorization: Bearer <token>`: `accepted_token` may do everything, `read_only_token` may read
but gets 403 on writes, anything else gets 401. `fail_next(n)` answers the next n requests with 503 (a transient
outage), `fail_always()` every request from then on (a Hub that stays down). Every request is recorded in `requests`
(method, path, status) without its headers, so no token is kept; `hits` counts them.

    with HubServer(accepted_token="hf_x") as hub:
        HfApi(endpoint=hub.url, token="hf_x").create_repo("me/model")
        hub.repos["me/model"].commits
"""

import base64
import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"
_REPO = r"/api/models/(?P<repo>[^/]+/[^/]+)"
_RESOLVE = r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)"


def git_blob_oid(content: bytes) -> str:
    """The git blob sha1 of `content`: the oid the Hub reports for a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Commit:
    oid: str
    title: str
    description: str
    files: dict[str, bytes]  # the whole tree after this commit
    added: list[str]
    deleted: list[str]
    # The Hub's own date format, which huggingface_hub parses strictly.
    date: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)  # oldest first
    gated: bool = False  # gated, and no token here has been granted access

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    @property
    def files(self) -> dict[str, bytes]:
        return self.head.files


class HubServer:
    """The fake Hub: start/stop (or use as a context manager), then inspect `repos` and `requests`."""

    def __init__(self, accepted_token: str, read_only_token: str | None = None):
        self.accepted_token = accepted_token
        self.read_only_token = read_only_token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, int]] = []
        self._failures: list[int] = []
        self._failing: int | None = None
        # Reentrant: endpoints run under it and record their response under it too.
        self._lock = threading.RLock()
        self._httpd = _Server(("127.0.0.1", 0), _handler(self))
        # A short poll interval makes stop() quick.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never ran otherwise
            self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def fail_next(self, n: int, status: int = 503) -> None:
        """Answer the next `n` requests, whatever they are, with `status`."""
        with self._lock:
            self._failures += [status] * n

    def fail_always(self, status: int = 503) -> None:
        """Answer every request from now on, whatever it is, with `status`."""
        with self._lock:
            self._failing = status

    def hits(self, method: str, path_pattern: str) -> int:
        """How many recorded requests match `method` and the regex `path_pattern` (searched in the path)."""
        return sum(1 for m, path, _ in self.requests if m == method and re.search(path_pattern, path))

    # --- state changes (called by the handler under the lock) ---

    def _create(self, repo_id: str, private: bool) -> Repo:
        repo = Repo(repo_id, private)
        self.repos[repo_id] = repo
        self._commit(repo, "initial commit", "", {".gitattributes": GITATTRIBUTES}, [])
        return repo

    def _commit(self, repo: Repo, title: str, description: str, added: dict[str, bytes], deleted: list[str]):
        files = dict(repo.commits[-1].files) if repo.commits else {}
        for path in deleted:
            files = {p: c for p, c in files.items() if p != path and not p.startswith(path.rstrip("/") + "/")}
        files.update(added)
        oid = hashlib.sha1(f"{repo.repo_id}\0{len(repo.commits)}\0{title}".encode()).hexdigest()
        commit = Commit(oid, title, description, files, sorted(added), sorted(deleted))
        repo.commits.append(commit)
        return commit


class _Server(ThreadingHTTPServer):
    """Tracks its open connections, so that stop() can close the ones the client keeps alive in its pool.

    Left open, a pooled connection would still be served by this (stopped) server's handler thread when a later
    server gets the same port, and that test would talk to the wrong fake Hub.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._connections: set[socket.socket] = set()

    def process_request(self, request, client_address) -> None:
        self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the client's pooled connections alive; every response sets Content-Length.
    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's signature
        pass  # keep test output clean

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    # --- plumbing ---

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return body
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, data, headers: dict | None = None, content_type: str = "application/json") -> None:
        body = data if isinstance(data, bytes) else json.dumps(data).encode()
        # Recorded before answering: once the client has its response, a test may count requests at once.
        with self.hub._lock:
            self.hub.requests.append((self.command, self._request_path, status))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer has no body: bytes after it would be the next answer's start
            self.wfile.write(body)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
        self._send(status, {"error": message}, headers)

    def _token_kind(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        if token and token == self.hub.accepted_token:
            return "write"
        if token and token == self.hub.read_only_token:
            return "read"
        return None

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        self._request_path, query = unquote(parts.path), parse_qs(parts.query)
        body = self._read_body()
        with self.hub._lock:
            failure = self.hub._failures.pop(0) if self.hub._failures else self.hub._failing
        if failure:
            self._error(failure, "Service temporarily unavailable (test hub)")
        else:
            self._route(method, self._request_path, query, body)

    def _route(self, method: str, path: str, query: dict, body: bytes) -> None:
        kind = self._token_kind()
        if kind is None:
            return self._error(401, "Invalid credentials in Authorization header")
        for route_method, pattern, writes, action in _ROUTES:
            match = re.fullmatch(pattern, path)
            if method == route_method and match:
                if writes and kind != "write":
                    return self._error(403, "You don't have the rights to write to this namespace")
                with self.hub._lock:
                    return action(self, query=query, body=body, **match.groupdict())
        return self._error(404, f"{method} {path} is not served by the test hub")

    def _repo(self, repo: str) -> Repo | None:
        found = self.hub.repos.get(repo)
        if found is None:
            self._error(404, "Repository not found", code="RepoNotFound")
        return found

    # --- endpoints ---

    def create_repo(self, body: bytes, **_) -> None:
        payload = json.loads(body)
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        url = f"{self.hub.url}/{repo_id}"
        if repo_id in self.hub.repos:
            # The Hub's 409 carries the url, which `create_repo(exist_ok=True)` returns.
            message = "You already created this model repo"
            return self._send(409, {"error": message, "url": url}, {"X-Error-Message": message})
        self.hub._create(repo_id, private=payload.get("visibility") == "private" or bool(payload.get("private")))
        self._send(200, {"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def validate_yaml(self, body: bytes, **_) -> None:
        content = json.loads(body).get("content", "")
        front = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        try:
            yaml.safe_load(front.group(1) if front else "")
        except yaml.YAMLError as exc:
            return self._send(400, {"errors": [{"message": str(exc)}], "warnings": []})
        self._send(200, {"errors": [], "warnings": []})

    def repo_info(self, repo: str, **_) -> None:
        if found := self._repo(repo):
            siblings = [{"rfilename": p} for p in sorted(found.files)]
            info = {"id": repo, "sha": found.head.oid, "private": found.private, "siblings": siblings, "tags": []}
            info["gated"] = "manual" if found.gated else False
            self._send(200, {**info, "lastModified": found.head.date})

    def auth_check(self, repo: str, **_) -> None:
        if (found := self._repo(repo)) and found.gated:
            return self._error(403, f"Access to model {repo} is restricted", code="GatedRepo")
        if found:
            self._send(200, {})

    def preupload(self, repo: str, body: bytes, **_) -> None:
        if found := self._repo(repo):
            files = []
            for item in json.loads(body)["files"]:
                current = found.files.get(item["path"])
                oid = git_blob_oid(current) if current is not None else None
                files.append({"path": item["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid})
            self._send(200, {"files": files, "commitOid": found.head.oid})

    def commit(self, repo: str, query: dict, body: bytes, **_) -> None:
        if not (found := self._repo(repo)):
            return
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        if header.get("parentCommit") and header["parentCommit"] != found.head.oid:
            return self._error(412, "A commit has happened since the parent commit")
        added, deleted = {}, []
        for line in lines:
            value = line["value"]
            if line["key"] == "file":
                added[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] in ("deletedFile", "deletedFolder"):
                deleted.append(value["path"])
            elif line["key"] != "header":
                return self._error(400, f"the test hub does not support {line['key']!r} operations")
        commit = self.hub._commit(found, header["summary"], header.get("description", ""), added, deleted)
        url = f"{self.hub.url}/{repo}/commit/{commit.oid}"
        pr_url = f"{self.hub.url}/{repo}/discussions/1" if query.get("create_pr") else None
        self._send(200, {"success": True, "commitOid": commit.oid, "commitUrl": url, "pullRequestUrl": pr_url})

    def tree(self, repo: str, query: dict, sub: str | None = None, **_) -> None:
        if not (found := self._repo(repo)):
            return
        prefix = f"{sub.strip('/')}/" if sub else ""
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        entries, folders = [], set()
        for path, content in sorted(found.files.items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            entries.append({"type": "file", "path": path, "size": len(content), "oid": git_blob_oid(content)})
        for folder in sorted(folders):
            entries.append({"type": "directory", "path": folder, "oid": hashlib.sha1(folder.encode()).hexdigest()})
        self._send(200, entries)

    def resolve(self, repo: str, revision: str, path: str, **_) -> None:
        if not (found := self._repo(repo)):
            return
        commit = found.head if revision == "main" else next((c for c in found.commits if c.oid == revision), None)
        if commit is None:
            return self._error(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        if (content := commit.files.get(path)) is None:
            return self._error(404, f"Entry not found: {path}", code="EntryNotFound")
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{git_blob_oid(content)}"'}
        self._send(200, content, headers, content_type="application/octet-stream")

    def commits(self, repo: str, **_) -> None:
        if found := self._repo(repo):
            history = [
                {"id": c.oid, "title": c.title, "message": c.description, "date": c.date, "authors": []}
                for c in reversed(found.commits)
            ]
            self._send(200, history)


_ROUTES = [
    # (method, path regex, needs write access, handler)
    ("POST", r"/api/repos/create", True, _HubHandler.create_repo),
    ("POST", r"/api/validate-yaml", False, _HubHandler.validate_yaml),
    ("GET", _REPO, False, _HubHandler.repo_info),
    ("GET", _REPO + r"/revision/main", False, _HubHandler.repo_info),
    ("GET", _REPO + r"/auth-check", False, _HubHandler.auth_check),
    ("POST", _REPO + r"/preupload/main", True, _HubHandler.preupload),
    ("POST", _REPO + r"/commit/main", True, _HubHandler.commit),
    ("GET", _REPO + r"/tree/main(?:/(?P<sub>.+))?", False, _HubHandler.tree),
    ("GET", _REPO + r"/commits/main", False, _HubHandler.commits),
    ("HEAD", _RESOLVE, False, _HubHandler.resolve),
    ("GET", _RESOLVE, False, _HubHandler.resolve),
]
