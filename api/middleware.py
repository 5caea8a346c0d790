"""Admission control before any body is read: 413 for large bodies, 429 past `max_queue`.

    POST /v1/score | /v1/chat/completions | /v1/decisions | /v1/jobs | /v1/batches
      Content-Length > max_body_bytes                -> 413 (a body streamed without a length
                                                        is counted and cut at the limit;
                                                        POST /v1/files: max_file_bytes)
      queued rows (Redis gauge) >= max_queue          -> 429 + Retry-After
      Redis unreachable (after the client's retries)   -> 503 + Retry-After
    every request: latency observed into the app's Prometheus histogram
"""

from __future__ import annotations

import time

import orjson
from starlette.exceptions import HTTPException

from api.errors import REDIS_UNAVAILABLE, error_body, unavailable_reply
from contract import queues

ADMITTED_PATHS = ("/v1/score", "/v1/chat/completions", "/v1/decisions", "/v1/jobs", "/v1/batches")
UPLOAD_PATH = "/v1/files"  # bodies up to max_file_bytes (plus the multipart framing), not max_body_bytes
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class AdmissionMiddleware:
    def __init__(self, app, settings, aredis, latency) -> None:
        self.app = app
        self.settings = settings
        self.aredis = aredis
        self.latency = latency  # Histogram(route, method, status)

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
                refusal = await self._refusal(scope) if scope["method"] == "POST" else None
            except REDIS_UNAVAILABLE:
                status_code, body, headers = unavailable_reply(self.settings.redis_retry_after_s)
                refusal = status_code, body["error"]["message"], headers
            if refusal is not None:
                await _send_json(send_status, *refusal)
            else:
                await self.app(scope, self._limited(scope, receive), send_status)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", "unmatched")
            self.latency.labels(label, scope["method"], str(status["code"])).observe(time.perf_counter() - started)

    async def _refusal(self, scope) -> tuple | None:
        length = dict(scope["headers"]).get(b"content-length")
        limit = self._body_limit(scope)
        if length is not None and length.isdigit() and int(length) > limit:
            return 413, f"the body is {int(length)} bytes; the limit is {limit}", {}
        if scope["path"] in ADMITTED_PATHS:
            num_queued = int(await self.aredis.get(queues.QUEUED_ROWS_KEY) or 0)
            if num_queued >= self.settings.max_queue:
                message = f"{num_queued} rows are queued (limit {self.settings.max_queue}); retry later"
                return 429, message, {"retry-after": str(self.settings.retry_after_s)}
        return None

    def _body_limit(self, scope) -> int:
        if scope["path"] == UPLOAD_PATH:
            return self.settings.max_file_bytes + MULTIPART_OVERHEAD_BYTES
        return self.settings.max_body_bytes

    def _limited(self, scope, receive):
        limit = self._body_limit(scope)
        remaining = {"bytes": limit}

        async def receive_limited():
            message = await receive()
            if message["type"] == "http.request":
                remaining["bytes"] -= len(message.get("body", b""))
                if remaining["bytes"] < 0:
                    raise HTTPException(413, f"the body is larger than {limit} bytes")
            return message

        return receive_limited


async def _send_json(send, status: int, message: str, headers: dict) -> None:
    body = orjson.dumps(error_body(status, message))
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})
