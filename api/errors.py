"""The API's errors, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` (and, for a spec with
problems, `"problems": [{"param", "message"}]` in it), so OpenAI's client raises them as its own errors."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL
from starlette.exceptions import HTTPException

from grpoflow.flows.deployments import BUSY_CODES, busy_message

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               409: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
               502: "server_error", 503: "server_error"}  # fmt: skip


class ApiError(Exception):
    """One error answer: its status, message, the request field it is about (`param`) and a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, **more):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.more = status, message, param, code, more

    def body(self) -> dict:
        error = {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                 "param": self.param, "code": self.code}  # fmt: skip
        return {"error": {**error, **self.more}}


def not_found(what: str, ident: str) -> ApiError:
    """Unknown, or another team's: the same answer for both, so an id says nothing of who has it."""
    return ApiError(404, f"no {what} {ident!r}", param="id", code="not_found")


def bad_spec(problems: list[str], names: dict[str, str] | None = None) -> ApiError:
    """A 400 naming every problem; each "dotted.location: message" becomes {param, message}, a location that starts
    with a key of `names` named by its value instead (the request's own field for a spec's)."""
    listed = [dict(zip(("param", "message"), _split(p, names or {}), strict=True)) for p in problems]
    said = "; ".join(f"{p['param']}: {p['message']}" if p["param"] else p["message"] for p in listed)
    message = f"{len(listed)} problem{'s' if len(listed) != 1 else ''}: {said}"
    return ApiError(400, message, param=listed[0]["param"], code="invalid_spec", problems=listed)


def _split(problem: str, names: dict[str, str]) -> tuple[str | None, str]:
    where, sep, message = problem.partition(": ")
    if not sep or " " in where.strip():
        return None, problem
    for location, name in names.items():
        if where == location or where.startswith((location + ".", location + "[")):
            return name + where.removeprefix(location), message
    return where, message


async def api_error(request: Request, error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def http_error(request: Request, error: HTTPException) -> JSONResponse:
    return JSONResponse(ApiError(error.status_code, str(error.detail)).body(), status_code=error.status_code)


async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """A request whose body or query is malformed: 400 (OpenAI's status), naming each field."""
    problems = [f"{'.'.join(str(x) for x in e['loc'][1:]) or e['loc'][0]}: {e['msg']}" for e in error.errors()]
    return await api_error(request, bad_spec(problems))


async def prefect_error(request: Request, error: PrefectHTTPStatusError) -> JSONResponse:
    """An answer of the Prefect server that no route expects: 503 for one still busy after Prefect's client retried
    (SQLite's "database is locked"; OpenAI's client retries a 503 in turn), else 502, never a 500 traceback."""
    status, url = error.response.status_code, PREFECT_API_URL.value() or str(error.request.url)
    if status in BUSY_CODES:
        return await api_error(request, ApiError(503, busy_message(url, error.response), code="server_busy"))
    message = f"the Prefect server at {url} answered HTTP {status} {error.response.reason_phrase}"
    return await api_error(request, ApiError(502, message, code="prefect_error"))


HANDLERS = {
    ApiError: api_error,
    HTTPException: http_error,
    RequestValidationError: validation_error,
    PrefectHTTPStatusError: prefect_error,
}
