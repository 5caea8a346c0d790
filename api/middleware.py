"""Auth and admission control before any body is read: 401, then 413 for large bodies, 429 past `max_queue`.

    /v1/*                                                -> 401 without a valid API key
    /metrics                                             -> 401/403 without the scrape token
                                                            (any API key when none is set)
    POST /v1/score | /v1/chat/completions | /v1/decide | /v1/decide/shared | /v1/decisions | /v1/jobs | /v1/batches
      Content-Length > max_body_bytes                -> 413 (a body streamed without a length
                                                        is counted and cut at the limit;
                                                        POST /v1/files: max_file_bytes)
      queued rows (Redis gauge) >= max_queue          -> 429 + Retry-After (a fast refusal; the
                                                        submit's own reservation, one Lua step
                                                        in jobstore.submit.reserve_rows, is
                                                        what keeps the gauge within the limit)
      Redis unreachable (after the client's retries)   -> 503 + Retry-After
    every request: latency observed into the app's Prometheus histogram
"""

from __future__ import annotations

import time

import orjson

from api.deps import authenticate, authenticate_scraper
from api.errors import REDIS_UNAVAILABLE, ApiError, error_body, unavailable_reply
from contract import queues

ADMITTED_PATHS = ("/v1/score", "/v1/chat/completions", "/v1/decide", "/v1/decide/shared", "/v1/decisions", "/v1/jobs",
                  "/v1/batches")
UPLOAD_PATH = "/v1/files"  # bodies up to max_file_bytes (plus the multipart framing), not max_body_bytes
METRICS_PATH = "/metrics"
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class AdmissionMiddleware:
    def __init__(self, app, settings, aredis, latency, keys_by_hash) -> None:
        self.app = app
        self.settings = settings
        self.aredis = aredis
        self.latency = latency  # Histogram(route, method, status)
        self.keys_by_hash = keys_by_hash  # sha256 hex -> ApiKey

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            try:
                refusal = self._unauthenticated(scope) or await self._refusal(scope)
            except REDIS_UNAVAILABLE:
                status_code, body, headers = unavailable_reply(self.settings.redis_retry_after_s)
                refusal = status_code, body["error"]["message"], None, headers
            if refusal is not None:
                await _send_json(send_status, *refusal)
            else:
                await self.app(scope, self._limited(scope, receive), send_status)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", "unmatched")
            self.latency.labels(label, scope["method"], str(status["code"])).observe(time.perf_counter() - started)

    def _unauthenticated(self, scope) -> tuple | None:
        """401 (or /metrics' 403) from the headers alone: a caller without a key never has its body read."""
        path = scope["path"]
        if not (path.startswith("/v1/") or path == METRICS_PATH):
            return None
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        try:
            if path == METRICS_PATH:
                authenticate_scraper(header, self.settings, self.keys_by_hash)
            else:
                authenticate(header, self.keys_by_hash)
        except ApiError as error:
            return error.status_code, str(error.detail), error.param, dict(error.headers or {})
        return None

    async def _refusal(self, scope) -> tuple | None:
        if scope["method"] != "POST":
            return None
        length = dict(scope["headers"]).get(b"content-length")
        limit = self._body_limit(scope)
        if length is not None and length.isdigit() and int(length) > limit:
            return 413, *self._too_large(scope, f"the body is {int(length)} bytes"), {}
        if scope["path"] in ADMITTED_PATHS:
            num_queued = int(await self.aredis.get(queues.QUEUED_ROWS_KEY) or 0)
            if num_queued >= self.settings.max_queue:
                message = f"{num_queued} rows are queued (limit {self.settings.max_queue}); retry later"
                return 429, message, None, {"retry-after": str(self.settings.retry_after_s)}
        return None

    def _body_limit(self, scope) -> int:
        if scope["path"] == UPLOAD_PATH:
            return self.settings.max_file_bytes + MULTIPART_OVERHEAD_BYTES
        return self.settings.max_body_bytes

    def _too_large(self, scope, what: str) -> tuple[str, str | None]:
        """(message, param) of a 413: an upload names the file limit (the body may add the multipart framing)."""
        if scope["path"] == UPLOAD_PATH:
            return (f"file: {what}; the limit is {self.settings.max_file_bytes} bytes (SPINF_MAX_FILE_BYTES)"
                    f" plus {MULTIPART_OVERHEAD_BYTES} bytes of multipart framing", "file")
        return f"{what}; the limit is {self.settings.max_body_bytes} bytes (SPINF_MAX_BODY_BYTES)", None

    def _limited(self, scope, receive):
        limit = self._body_limit(scope)
        remaining = {"bytes": limit}

        async def receive_limited():
            message = await receive()
            if message["type"] == "http.request":
                remaining["bytes"] -= len(message.get("body", b""))
                if remaining["bytes"] < 0:
                    message, param = self._too_large(scope, f"the body is larger than {limit} bytes")
                    raise ApiError(413, message, param=param)
            return message

        return receive_limited


async def _send_json(send, status: int, message: str, param: str | None, headers: dict) -> None:
    body = orjson.dumps(error_body(status, message, param))
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})
