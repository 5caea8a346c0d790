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
import orjson

from client.calls import (
    ClientConfig,
    checked,
    dataset_body,
    is_finished,
    job_body,
    read_items,
    retry_delay,
)
from contract.payloads import JobList, JobView
from contract.protocol import ScoringRequest, ScoringResponse


class Client:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, max_retries: int = 5,
                 timeout_s: float = 120.0, transport: httpx.BaseTransport | None = None) -> None:
        self.config = ClientConfig.make(base_url, api_key, max_retries, timeout_s)
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
            delay = retry_delay(response, attempt, self.config.max_retries)
            if delay is None:
                return checked(response)
            time.sleep(delay)
            attempt += 1

    def score(self, request: ScoringRequest | dict) -> ScoringResponse:
        body = request.model_dump(mode="json", exclude_none=True) if isinstance(request, ScoringRequest) else request
        return ScoringResponse.model_validate(self.request("POST", "/v1/score", json=body).json())

    def decide(self, body: dict) -> dict:
        """POST /v1/decide: one decision over a state."""
        return self.request("POST", "/v1/decide", json=body).json()

    def decisions(self, body: dict) -> dict:
        """POST /v1/decisions: the Decisions API."""
        return self.request("POST", "/v1/decisions", json=body).json()

    def submit(self, items: Iterable, scoring=None, packs: Iterable[str] = (), model: str | None = None) -> JobView:
        """A job of inline rows ({custom_id, text | messages}), every row asked `scoring` and `packs`."""
        return self._create(job_body(items, scoring, packs, model))

    def submit_file(self, path: Path | str, scoring=None, packs: Iterable[str] = (), model: str | None = None) -> JobView:
        return self.submit(read_items(path), scoring, packs, model)

    def submit_dataset(self, input_uri: str, output_uri: str, scoring=None, packs: Iterable[str] = (),
                       model: str | None = None) -> JobView:
        return self._create(dataset_body(input_uri, output_uri, scoring, packs, model))

    def _create(self, body: dict) -> JobView:
        return JobView.model_validate(self.request("POST", "/v1/jobs", json=body).json())

    def job(self, job_id: str) -> JobView:
        return JobView.model_validate(self.request("GET", f"/v1/jobs/{job_id}").json())

    def wait(self, job_id: str, progress: Callable[[JobView], None] | None = None, poll_s: float = 0.5,
             timeout_s: float | None = None) -> JobView:
        """Poll until the job ends; `progress(view)` after every poll. TimeoutError past `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = self.job(job_id)
            if progress is not None:
                progress(view)
            if is_finished(view):
                return view
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {view.status.value}")
            time.sleep(poll_s)

    def results(self, job_id: str) -> Iterator[dict]:
        """The ended job's rows in input order: {custom_id, response} or {custom_id, error}; a 429/503
        before the first row is sent again after its Retry-After, as every call."""
        attempt = 0
        while True:
            with self.http.stream("GET", f"/v1/jobs/{job_id}/results") as response:
                if response.status_code < 400:
                    for line in response.iter_lines():
                        if line.strip():
                            yield orjson.loads(line)
                    return
                response.read()
                delay = retry_delay(response, attempt, self.config.max_retries)
                if delay is None:
                    checked(response)
            time.sleep(delay)
            attempt += 1

    def cancel(self, job_id: str) -> JobView:
        return JobView.model_validate(self.request("POST", f"/v1/jobs/{job_id}/cancel").json())

    def jobs(self, page_size: int = 20) -> Iterator[JobView]:
        """Every job of this key, newest first (pages of `page_size`, followed by `after`)."""
        params: dict = {"limit": page_size}
        while True:
            page = JobList.model_validate(self.request("GET", "/v1/jobs", params=params).json())
            yield from page.data
            if not page.has_more:
                return
            params["after"] = page.last_id
