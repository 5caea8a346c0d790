"""Error bodies in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

    RequestValidationError (malformed body) -> 422, `param` names the first bad field ("body"
        for a body that is not JSON: the message gives the byte offset, api/json_body.py)
    pydantic ValidationError raised in a route (a request built from the body, e.g. a
        decision's queries past a limit) -> the same 422
    HTTPException (400/401/403/404/409/413/429/504)  -> same shape, headers kept (Retry-After);
        a 405's `Allow` lists every method served at the path
    redis ConnectionError / TimeoutError (after the client's retries) -> 503 + Retry-After
    botocore ClientError / BotoCoreError (an S3 call that failed after the client's retries) -> 503
        + Retry-After (`retry_after_s`)
    S3AccessDenied (an S3 call outside the job's grants, refused before it was sent) -> 403
    jobstore QueueFull (the submit's atomic row reservation) -> 429 + Retry-After; 413 for a
        request of more rows than max_queue (it could never be admitted)
Messages are made printable UTF-8 (a lone surrogate is shown as its escape), so an error
reply can always be written.
"""

from __future__ import annotations

import re

from botocore.exceptions import BotoCoreError, ClientError
from fastapi import FastAPI, Request, routing
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException

from contract.s3_uri import S3AccessDenied
from jobstore.submit import QueueFull

_FIELD_PREFIX_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*): ")
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error", 409: "conflict_error",
          413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}


class ApiError(HTTPException):
    """An HTTP error with a field name and extra body fields (e.g. the job id of a 504)."""

    def __init__(self, status_code: int, message: str, param: str | None = None, headers=None, **extra):
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.param = param
        self.extra = extra


def printable(text: str) -> str:
    """`text` as valid UTF-8 (lone surrogates escaped)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status_code: int, message: str, param: str | None = None, **extra) -> dict:
    message, param = printable(message), None if param is None else printable(param)
    return {"error": {"message": message, "type": _TYPES.get(status_code, "api_error"), "param": param,
                      "code": status_code, **extra}}


def field_of(location: tuple) -> str:
    parts = [str(part) for part in location if part not in ("body", "query", "header", "path")]
    return ".".join(parts) or "body"


def _refine(param: str, message: str) -> tuple[str, str]:
    """Model validators say "options: give at least 2": fold that field name into `param`."""
    message = message.removeprefix("Value error, ")
    match = _FIELD_PREFIX_RE.match(message)
    if match and not param.endswith(match.group(1)):
        return f"{param}.{match.group(1)}" if param != "body" else match.group(1), message[match.end() :]
    return param, message


def _validation_reply(errors: list) -> JSONResponse:
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid body"}
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
        param, detail = "body", f"not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}"
    else:
        param, detail = _refine(field_of(tuple(first["loc"])), first["msg"])
    return JSONResponse(status_code=422, content=error_body(422, f"{param}: {detail}", param))


REDIS_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError)


def unavailable_reply(retry_after_s: int) -> tuple[int, dict, dict]:
    """(status, body, headers) of a request that could not reach Redis."""
    message = f"the job store (Redis) is unavailable; retry after {retry_after_s}s"
    return 503, error_body(503, message), {"retry-after": str(retry_after_s)}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def _unavailable(request: Request, error: Exception) -> JSONResponse:
        status, body, headers = unavailable_reply(request.app.state.settings.redis_retry_after_s)
        return JSONResponse(status_code=status, content=body, headers=headers)

    @app.exception_handler(ClientError)
    @app.exception_handler(BotoCoreError)
    async def _s3_unavailable(request: Request, error: Exception) -> JSONResponse:
        retry_after = request.app.state.settings.retry_after_s
        message = f"an S3 call failed after the client's retries ({error}); retry after {retry_after}s"
        return JSONResponse(status_code=503, content=error_body(503, message),
                            headers={"retry-after": str(retry_after)})

    @app.exception_handler(S3AccessDenied)
    async def _s3_denied(request: Request, error: S3AccessDenied) -> JSONResponse:
        return JSONResponse(status_code=403, content=error_body(403, str(error)))

    @app.exception_handler(QueueFull)
    async def _queue_full(request: Request, error: QueueFull) -> JSONResponse:
        if error.num_rows > error.max_queue:
            message = f"items: {error.num_rows} rows; at most max_queue={error.max_queue} can be queued at once"
            return JSONResponse(status_code=413, content=error_body(413, message, "items"))
        retry_after = str(request.app.state.settings.retry_after_s)
        message = f"{error.num_queued} rows are queued (limit {error.max_queue}); retry later"
        return JSONResponse(status_code=429, content=error_body(429, message), headers={"retry-after": retry_after})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_reply(error.errors())

    @app.exception_handler(ValidationError)
    async def _invalid_built(request: Request, error: ValidationError) -> JSONResponse:
        return _validation_reply(error.errors())

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        extra = getattr(error, "extra", {})
        body = error_body(error.status_code, str(error.detail), getattr(error, "param", None), **extra)
        headers = dict(error.headers or {})
        if error.status_code == 405:  # Starlette names the first matching route's methods only
            headers["Allow"] = ", ".join(allowed_methods(request))
        return JSONResponse(status_code=error.status_code, content=body, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (GET and POST /v1/jobs are two routes)."""
    path = request.scope["path"]
    methods: set[str] = set()
    for context in routing.iter_route_contexts(request.app.routes):  # included routers' routes too
        if getattr(context, "path_regex", None) is not None and context.path_regex.match(path):
            methods |= set(context.methods or ())
    return sorted(methods)
