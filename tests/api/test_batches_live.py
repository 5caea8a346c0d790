"""The OpenAI Batch API on a live service (uvicorn + worker thread + real Redis + tiny engine), through
the real `openai` SDK, every raw body validated strictly into the wheel's own types.

Must show: files.create -> batches.create -> batches.retrieve until completed -> files.content on a
200-line file with the six kinds of malformed line: every custom_id exactly once across the output
and error files; another key gets 404 on the batch and its files; batches.list(limit=2) over 5
batches yields 5; cancel mid-batch ends cancelled with 0 < completed < total, the finished rows kept.
"""

import io
import time
from collections import Counter

import httpx
import openai
import orjson
import pytest
from openai.types import Batch, FileDeleted, FileObject
from openai.types.chat import ChatCompletion

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SCORING = {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]}
MALFORMED = ("invalid_json", "invalid_line", "missing_custom_id", "duplicate_custom_id", "invalid_url", "invalid_body")


def _sdk(live, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.base_url}/v1", api_key=f"sk-test-{name}", max_retries=0)


def _score_line(custom_id: str, text: str, url: str = "/v1/score") -> bytes:
    body = {"messages": [{"role": "user", "content": text}], "scoring": SCORING}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _two_hundred_lines() -> tuple[list[bytes], dict[int, str]]:
    """200 lines: 3 of each malformed kind, 1 the engine refuses (too long), the rest valid.
    Returns the lines and {1-based line: expected error code} of the bad ones."""
    lines, expected = [], {}
    for i in range(200):
        kind = MALFORMED[i // 3 % 6] if i % 11 == 5 and len(expected) < 18 else None
        number = i + 1
        if kind == "invalid_json":
            # two name their custom_id before the break (recovered), one does not
            lines.append(b'{"custom_id": "broken-%d", "method": "POST", "body": {' % i if i % 2 else b"{not json")
        elif kind == "invalid_line":
            lines.append(orjson.dumps(["POST", i]))
        elif kind == "missing_custom_id":
            lines.append(orjson.dumps({"method": "POST", "url": "/v1/score", "body": {}}))
        elif kind == "duplicate_custom_id":
            lines.append(_score_line("r0", f"again {i}"))
        elif kind == "invalid_url":
            lines.append(_score_line(f"r{i}", f"message {i}", url="/v1/embeddings"))
        elif kind == "invalid_body":
            lines.append(orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/score",
                                       "body": {"messages": [], "scoring": SCORING}}))
        else:
            text = "refund " * 5000 if i == 100 else f"Customer {i}: please refund my order {i}."
            lines.append(_score_line(f"r{i}", text))
        if kind:
            expected[number] = kind
    return lines, expected


def _upload(client: openai.OpenAI, lines: list[bytes]) -> FileObject:
    raw = client.files.with_raw_response.create(file=("in.jsonl", io.BytesIO(b"\n".join(lines) + b"\n")),
                                                purpose="batch")
    return FileObject.model_validate(raw.http_response.json(), strict=True)


def _retrieve(client: openai.OpenAI, batch_id: str) -> Batch:
    return Batch.model_validate(client.batches.with_raw_response.retrieve(batch_id).http_response.json(), strict=True)


def _until(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 240) -> Batch:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = _retrieve(client, batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def _jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines() if line]


@pytest.fixture
def live(make_settings, service_engine, live_service):
    return live_service(make_settings(default_model=service_engine.model_name, chunk_num_rows=16), service_engine)


def test_a_200_line_batch_with_every_kind_of_bad_line(live, bearer):
    alice = _sdk(live, "alice")
    lines, expected = _two_hundred_lines()
    uploaded = _upload(alice, lines)
    assert (uploaded.purpose, uploaded.bytes, uploaded.object) == ("batch", len(b"\n".join(lines)) + 1, "file")
    raw = alice.batches.with_raw_response.create(input_file_id=uploaded.id, endpoint="/v1/score",
                                                 completion_window="24h", metadata={"run": "must-show"})
    created = Batch.model_validate(raw.http_response.json(), strict=True)
    assert created.status == "validating" and created.metadata == {"run": "must-show"}
    batch = _until(alice, created.id, ("completed", "failed"))
    assert batch.status == "completed", batch
    output, errors = _jsonl(alice, batch.output_file_id), _jsonl(alice, batch.error_file_id)

    # every input line exactly once; every custom_id exactly once across both files
    assert len(output) + len(errors) == 200
    named = {f"r{i}" for i in range(200)} | {f"broken-{i}" for i in range(200)}
    in_input = {cid for line in lines for cid in named if f'"{cid}"'.encode() in line}
    seen = Counter(row["custom_id"] for row in output + errors if row["custom_id"] is not None)
    assert set(seen) == in_input and set(seen.values()) == {1}
    # the error file: each malformed line with its code and line number, in input order; the long row refused
    refused = {row["error"]["line"]: row["error"]["code"] for row in errors if row["error"]}
    assert refused == expected and set(expected.values()) == set(MALFORMED)
    assert [row["error"]["line"] for row in errors if row["error"]] == sorted(refused)
    [too_long] = [row for row in errors if row["response"]]
    assert too_long["custom_id"] == "r100" and too_long["response"]["status_code"] == 422
    assert too_long["response"]["body"]["error"]["param"] == "messages"
    # the output file: scored rows in input order, as /v1/score answers the same request alone
    assert [row["custom_id"] for row in output] == [f"r{i}" for i in range(200) if f"r{i}" in seen and
                                                     i + 1 not in expected and i != 100]
    assert all(row["response"]["status_code"] == 200 and row["error"] is None for row in output)
    alone = httpx.post(f"{live.base_url}/v1/score", headers=bearer("alice"), timeout=60,
                       json=orjson.loads(lines[7])["body"]).json()
    assert next(r for r in output if r["custom_id"] == "r7")["response"]["body"]["results"] == alone["results"]
    # counts and usage against the files themselves
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        200, len(output), len(errors))
    tokens = sum(sum(row["response"]["body"]["usage"][k] for k in
                     ("content_tokens", "question_tokens", "option_tokens", "floor_tokens")) for row in output)
    assert batch.usage.input_tokens == tokens > 0 and batch.usage.total_tokens == tokens
    assert batch.model == "tiny-llama" and batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    for file_id in (batch.output_file_id, batch.error_file_id):
        shown = FileObject.model_validate(alice.files.with_raw_response.retrieve(file_id).http_response.json(),
                                          strict=True)
        assert shown.purpose == "batch_output"

    bob = _sdk(live, "bob")  # another key: 404 on the batch and on every one of its files
    for call in (lambda: bob.batches.retrieve(batch.id), lambda: bob.batches.cancel(batch.id),
                 lambda: bob.files.retrieve(uploaded.id), lambda: bob.files.content(batch.output_file_id),
                 lambda: bob.files.content(batch.error_file_id), lambda: bob.files.delete(uploaded.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(bob.batches.list()) == [] and list(bob.files.list()) == []


def test_chat_lines_answer_chat_completions(live, bearer):
    alice = _sdk(live, "alice")
    messages = [{"role": "user", "content": "I was charged twice, refund one please."}]
    body = {"model": "tiny-llama", "messages": messages, "scoring": SCORING}
    lines = [orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
             for i in range(3)]
    lines.append(orjson.dumps({"custom_id": "no-scoring", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "tiny-llama", "messages": messages}}))
    batch = alice.batches.create(input_file_id=_upload(alice, lines).id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
    batch = _until(alice, batch.id, ("completed",))
    output, errors = _jsonl(alice, batch.output_file_id), _jsonl(alice, batch.error_file_id)
    completions = [ChatCompletion.model_validate(row["response"]["body"]) for row in output]
    alone = httpx.post(f"{live.base_url}/v1/score", headers=bearer("alice"), timeout=60,
                       json={"messages": messages, "scoring": SCORING}).json()
    assert [c.model_extra["scoring"]["results"] for c in completions] == [alone["results"]] * 3
    assert [(e["custom_id"], e["error"]["code"], e["error"]["param"]) for e in errors] == [
        ("no-scoring", "invalid_body", "body.scoring")]


def test_list_pages_over_every_batch(live):
    alice = _sdk(live, "alice")
    file_id = _upload(alice, [_score_line("only", "hello")]).id
    made = [alice.batches.create(input_file_id=file_id, endpoint="/v1/score", completion_window="24h").id
            for _ in range(5)]
    first = alice.batches.with_raw_response.list(limit=2).http_response.json()
    assert len(first["data"]) == 2 and first["has_more"] is True
    for item in first["data"]:
        Batch.model_validate(item, strict=True)
    listed = [batch.id for batch in alice.batches.list(limit=2)]  # the SDK's pager follows `after`
    assert listed == made[::-1]
    assert [f.id for f in alice.files.list(purpose="batch")] == [file_id]  # not the batches' output files
    expiring = alice.files.create(file=("e.jsonl", io.BytesIO(b"{}\n")), purpose="batch",
                                  expires_after={"anchor": "created_at", "seconds": 7200})
    assert expiring.expires_at - expiring.created_at in (7199, 7200, 7201)  # the SDK's form encoding is read
    paged = [f.id for f in alice.files.list(purpose="batch", limit=1)]  # the SDK's pager over files too
    assert paged == [expiring.id, file_id]
    deleted = FileDeleted.model_validate(alice.files.with_raw_response.delete(expiring.id).http_response.json(),
                                         strict=True)
    assert deleted.deleted and deleted.id == expiring.id
    assert [f.id for f in alice.files.list(purpose="batch", limit=1)] == [file_id]


def test_cancel_mid_batch_keeps_the_finished_rows(make_settings, slow_engine, live_service):
    settings = make_settings(default_model="tiny-llama", chunk_num_rows=2)
    live = live_service(settings, slow_engine(0.4))  # one 2-row chunk per pass, 0.4 s each
    alice = _sdk(live, "alice")
    lines = [_score_line(f"r{i}", f"Customer {i}: refund please.") for i in range(30)]
    batch = alice.batches.create(input_file_id=_upload(alice, lines).id, endpoint="/v1/score",
                                 completion_window="24h")
    deadline = time.monotonic() + 120
    while (batch := _retrieve(alice, batch.id)).request_counts.completed < 4:
        assert time.monotonic() < deadline and batch.status in ("validating", "in_progress"), batch
        time.sleep(0.1)
    cancelling = Batch.model_validate(alice.batches.with_raw_response.cancel(batch.id).http_response.json(),
                                      strict=True)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    batch = _until(alice, batch.id, ("cancelled",))
    counts = batch.request_counts
    assert 0 < counts.completed < counts.total == 30 and counts.completed + counts.failed == 30
    output, errors = _jsonl(alice, batch.output_file_id), _jsonl(alice, batch.error_file_id)
    assert len(output) == counts.completed and len(errors) == counts.failed
    assert all(row["response"]["body"]["results"][0]["id"] == "refund" for row in output)  # finished rows kept
    assert {row["error"]["code"] for row in errors} == {"batch_cancelled"}
    assert sorted(row["custom_id"] for row in output + errors) == sorted(f"r{i}" for i in range(30))
    with pytest.raises(openai.ConflictError):  # a batch that has ended is not cancelled again... unless cancelled
        alice.batches.cancel(_until(alice, alice.batches.create(
            input_file_id=_upload(alice, lines[:1]).id, endpoint="/v1/score", completion_window="24h").id,
            ("completed",)).id)
    assert alice.batches.cancel(batch.id).status == "cancelled"
