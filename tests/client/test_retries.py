"""The clients' retries against a small local HTTP server that answers from a script: a 429 or 503 is
sent again after its Retry-After (seconds or an HTTP date), without one after the backoff, and the
answer after `max_retries` is the caller's SpinfError. Sync and async alike."""

import asyncio
import email.utils
import http.server
import threading
import time

import orjson
import pytest

from client import AsyncClient, Client, SpinfError


class Scripted(http.server.ThreadingHTTPServer):
    """Answers each request with the next (status, headers[, body]) of `script`, the last one forever (a header
    value may be a function, called as the answer is sent);
    records (arrival time, method, path, body) of every request."""

    def __init__(self, script: list[tuple[int, dict]]) -> None:
        self.script = list(script)
        self.seen: list[tuple[float, str, str, bytes]] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self) -> tuple:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen.append((time.monotonic(), self.command, self.path, body))
        status, headers, *reply = self.server.answer()
        reply = reply[0] if reply else orjson.dumps(
            {"ok": True} if status < 400 else {"error": {"message": f"status {status}", "param": None, "code": status}})
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value() if callable(value) else value)
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args) -> None:
        pass


def _http_date(seconds_ahead: float) -> str:
    return email.utils.formatdate(time.time() + seconds_ahead, usegmt=True)


@pytest.fixture
def scripted():
    made = []

    def make(script):
        made.append(Scripted(script))
        return made[-1]

    yield make
    for server in made:
        server.shutdown()
        server.server_close()


def _gaps(server: Scripted) -> list[float]:
    times = [at for at, *_ in server.seen]
    return [later - earlier for earlier, later in zip(times, times[1:])]


def _script() -> list[tuple[int, dict]]:
    return [(429, {"retry-after": "1"}), (503, {"retry-after": lambda: _http_date(2)}), (429, {}), (200, {})]


def _check_retried(server: Scripted, answer: dict) -> None:
    assert answer == {"ok": True}
    assert len(server.seen) == 4 and {body for *_, body in server.seen} == {orjson.dumps({"state": "s"})}
    after_seconds, after_date, after_backoff = _gaps(server)
    assert 1.0 <= after_seconds < 3.0  # Retry-After: 1
    assert 0.9 <= after_date < 4.0  # an HTTP date about 2 s ahead (whole seconds)
    assert 2.0 <= after_backoff < 3.5  # no Retry-After on the third retry: the backoff 0.5 s * 2**2


@pytest.mark.slow
def test_sync_client_waits_each_retry_after(scripted):
    server = scripted(_script())
    with Client(server.url, "sk-x") as spinf:
        answer = spinf.decide({"state": "s"})
    _check_retried(server, answer)


@pytest.mark.slow
def test_async_client_waits_each_retry_after(scripted):
    server = scripted(_script())

    async def run() -> dict:
        async with AsyncClient(server.url, "sk-x") as spinf:
            return await spinf.decide({"state": "s"})

    _check_retried(server, asyncio.run(run()))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_past_max_retries_the_429_is_raised(scripted, mode):
    server = scripted([(429, {"retry-after": "0"})])
    if mode == "sync":
        with Client(server.url, "sk-x", max_retries=2) as spinf, pytest.raises(SpinfError) as raised:
            spinf.decide({"state": "s"})
    else:
        async def run() -> None:
            async with AsyncClient(server.url, "sk-x", max_retries=2) as spinf:
                await spinf.decide({"state": "s"})

        with pytest.raises(SpinfError) as raised:
            asyncio.run(run())
    assert raised.value.status_code == 429 and raised.value.message == "status 429"
    assert len(server.seen) == 3  # the first try and two retries


def test_other_errors_are_not_sent_again(scripted):
    server = scripted([(422, {"retry-after": "0"})])
    with Client(server.url, "sk-x") as spinf, pytest.raises(SpinfError) as raised:
        spinf.decide({"state": "s"})
    assert raised.value.status_code == 422 and len(server.seen) == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_results_are_fetched_again_after_a_503(scripted, mode):
    rows = [{"custom_id": "a", "response": {}}, {"custom_id": "b", "error": {"message": "x"}}]
    jsonl = b"".join(orjson.dumps(row) + b"\n" for row in rows)
    server = scripted([(503, {"retry-after": "0"}), (429, {"retry-after": "0"}), (200, {}, jsonl)])
    if mode == "sync":
        with Client(server.url, "sk-x") as spinf:
            got = list(spinf.results("job-1"))
    else:
        async def run() -> list:
            async with AsyncClient(server.url, "sk-x") as spinf:
                return [row async for row in spinf.results("job-1")]

        got = asyncio.run(run())
    assert got == rows and [path for _, _, path, _ in server.seen] == ["/v1/jobs/job-1/results"] * 3
