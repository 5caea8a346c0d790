"""Auth before the body: a request without a valid key is a 401 whatever its body, and its body
is never read; /metrics takes the scrape token and names no key, job or row. Real Redis, no worker."""

import socket
import time

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from contract.settings import hash_api_key

pytestmark = pytest.mark.redis

SCORING = {"queries": [{"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}]}
JOB = {"model": "m", "scoring": SCORING, "items": [{"custom_id": "bob-row-1", "text": "bob's private text"}]}
SCRAPE_TOKEN = "scrape-token-for-tests"
MALFORMED = {
    "not JSON": b"{not json",
    "a byte order mark": b"\xef\xbb\xbf{}",
    "invalid UTF-8": b'{"messages": "\xff"}',
    "a lone surrogate": b'{"messages": [{"role": "user", "content": "x \\ud800"}]}',
    "wrong types": b'{"messages": 5, "scoring": "no"}',
}


@pytest.fixture
def client(make_settings):
    with TestClient(create_app(make_settings(default_model="m"))) as c:
        yield c


@pytest.mark.parametrize("path", ["/v1/score", "/v1/chat/completions", "/v1/jobs", "/v1/decide",
                                  "/v1/decide/shared", "/v1/batches"])
def test_a_malformed_body_without_a_key_is_401(client, path):
    for what, body in MALFORMED.items():
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
            reply = client.post(path, content=body, headers=headers | {"content-type": "application/json"})
            assert reply.status_code == 401, (path, what, headers, reply.text)
            assert reply.json()["error"]["type"] == "authentication_error"
            assert reply.headers["www-authenticate"] == "Bearer"


def test_the_same_bodies_with_a_key_are_422(client, bearer):  # the 401s above are not a route that 401s anyway
    for what, body in MALFORMED.items():
        reply = client.post("/v1/score", content=body, headers=bearer("alice") | {"content-type": "application/json"})
        assert reply.status_code == 422, (what, reply.text)


def test_the_body_of_an_unauthenticated_request_is_never_read(make_settings, live_api):
    base_url = live_api(make_settings(default_model="m"))
    host, port = base_url.removeprefix("http://").split(":")
    # announces 1 MB, sends 9 bytes: a server that read the body would wait for the rest
    head = (f"POST /v1/score HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000000\r\n\r\n{not json").encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(head)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert time.monotonic() - started < 3


def test_metrics_takes_the_scrape_token_and_names_no_tenant(make_settings, bearer):
    settings = make_settings(default_model="m", metrics_token_sha256=hash_api_key(SCRAPE_TOKEN))
    with TestClient(create_app(settings)) as client:
        job_id = client.post("/v1/jobs", json=JOB, headers=bearer("bob")).json()["id"]
        client.get(f"/v1/jobs/{job_id}", headers=bearer("bob"))
        scrape = {"Authorization": f"Bearer {SCRAPE_TOKEN}"}
        text = client.get("/metrics", headers=scrape).text
        assert "spinf_queued_rows 1.0" in text and 'route="/v1/jobs/{job_id}"' in text
        for secret in ("bob", "alice", job_id, "bob-row-1", "private"):
            assert secret not in text, secret
        tenant = client.get("/metrics", headers=bearer("alice"))  # a tenant key is not the scrape token
        assert tenant.status_code == 403 and "scrape token" in tenant.json()["error"]["message"]
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/v1/models", headers=scrape).status_code == 401  # the scrape token is no API key


def test_without_a_scrape_token_any_key_reads_metrics_and_no_tenant_detail(make_settings, bearer):
    with TestClient(create_app(make_settings(default_model="m"))) as client:
        job_id = client.post("/v1/jobs", json=JOB, headers=bearer("bob")).json()["id"]
        reply = client.get("/metrics", headers=bearer("alice"))
        assert reply.status_code == 200 and "spinf_queued_rows 1.0" in reply.text
        for secret in ("bob", "alice", job_id, "bob-row-1", "private"):
            assert secret not in reply.text, secret
        assert client.get("/metrics").status_code == 401


def test_a_scrape_token_digest_that_is_not_64_hex_characters_is_refused():
    from pydantic import ValidationError

    from contract.settings import Settings

    for bad in ("abc", "z" * 64, hash_api_key(SCRAPE_TOKEN) + "0"):
        with pytest.raises(ValidationError, match="metrics_token_sha256"):
            Settings(metrics_token_sha256=bad)
