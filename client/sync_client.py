"""The blocking client: `Client()` reads SPINF_BASE_URL / SPINF_API_KEY.

    score / decide / decisions       one request, answered synchronously
    submit / submit_file / submit_dataset --> JobView --wait(progress=...)--> the ended JobView
    results(job) iterates its rows; cancel; jobs() every job of this key, page after page
429 and 503 answers are sent again after their Retry-After (client/calls.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Self

import httpx

from client import calls
from contract.payloads import JobView
from contract.protocol import ScoringRequest
from contract.scoring_results import ScoringResponse


class Client:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, max_retries: int = 5,
                 timeout_s: float = 120.0, transport: httpx.BaseTransport | None = None) -> None:
        self.config = calls.ClientConfig.make(base_url, api_key, max_retries, timeout_s)
        self.http = httpx.Client(transport=transport, **self.config.httpx_args())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One call, sent again after a 429/503 (Retry-After honoured); SpinfError for an error answer."""
        attempt = 0
        while True:
            response = self.http.request(method, path, **kwargs)
            delay = calls.retry_delay(response, attempt, self.config.max_retries)
            if delay is None:
                return calls.checked(response)
            time.sleep(delay)
            attempt += 1

    def _send(self, call: calls.Call):
        return call.read(self.request(call.method, call.path, **call.options))

    def score(self, request: ScoringRequest | dict) -> ScoringResponse:
        return self._send(calls.score_call(request))

    def decide(self, body: dict) -> dict:
        """POST /v1/decide: one decision over a state."""
        return self._send(calls.decide_call(body))

    def decisions(self, body: dict) -> dict:
        """POST /v1/decisions: the Decisions API."""
        return self._send(calls.decisions_call(body))

    def submit(self, items: Iterable, scoring=None, packs: Iterable[str] = (), model: str | None = None) -> JobView:
        """A job of inline rows ({custom_id, text | messages}), every row asked `scoring` and `packs`."""
        return self._send(calls.create_job_call(calls.job_body(items, scoring, packs, model)))

    def submit_file(self, path: Path | str, scoring=None, packs: Iterable[str] = (), model: str | None = None) -> JobView:
        return self.submit(calls.read_items(path), scoring, packs, model)

    def submit_dataset(self, input_uri: str, output_uri: str, scoring=None, packs: Iterable[str] = (),
                       model: str | None = None) -> JobView:
        return self._send(calls.create_job_call(calls.dataset_body(input_uri, output_uri, scoring, packs, model)))

    def job(self, job_id: str) -> JobView:
        return self._send(calls.job_call(job_id))

    def wait(self, job_id: str, progress: Callable[[JobView], None] | None = None, poll_s: float = 0.5,
             timeout_s: float | None = None) -> JobView:
        """Poll until the job ends; `progress(view)` after every poll. TimeoutError past `timeout_s`."""
        waiting = calls.JobWait(job_id, progress, timeout_s)
        while not waiting.ended(view := self.job(job_id)):
            time.sleep(poll_s)
        return view

    def results(self, job_id: str) -> Iterator[dict]:
        """The ended job's rows in input order: {custom_id, response} or {custom_id, error}; a 429/503
        before the first row is sent again after its Retry-After, as every call."""
        attempt = 0
        while True:
            with self.http.stream("GET", calls.results_path(job_id)) as response:
                if response.status_code < 400:
                    for line in response.iter_lines():
                        if (row := calls.result_row(line)) is not None:
                            yield row
                    return
                response.read()
                delay = calls.retry_delay(response, attempt, self.config.max_retries)
                if delay is None:
                    calls.checked(response)
            time.sleep(delay)
            attempt += 1

    def cancel(self, job_id: str) -> JobView:
        return self._send(calls.cancel_call(job_id))

    def jobs(self, page_size: int = 20) -> Iterator[JobView]:
        """Every job of this key, newest first (pages of `page_size`, followed by `after`)."""
        pages = calls.JobPages(page_size)
        while pages.more:
            yield from self._send(pages.next_call())
