"""What the sync and the async client share: configuration, the calls, retries, errors.

    SPINF_BASE_URL, SPINF_API_KEY (or arguments) --> ClientConfig --> httpx headers and base URL
    score_call(request), job_call(job_id), ... --> Call(method, path, body or params, read): what
        each call sends and how its answer is read; a client sends it and hands `read` the answer
    a response: 429/503 --retry_delay (Retry-After, else backoff)--> sleep and send again (max_retries)
                other >= 400 --> SpinfError(status, message, param)
    job_body / dataset_body / read_items: the POST /v1/jobs bodies (contract models, validated here)
    JobWait: when a polled job's wait ends; JobPages: GET /v1/jobs page after page

No I/O beyond reading a local JSONL file; the clients own the sockets and the sleeping.
"""

from __future__ import annotations

import email.utils
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from contract.payloads import JobCreate, JobItem, JobList, JobView
from contract.protocol import PackRef, ScoringRequest, ScoringSpec
from contract.scoring_results import ScoringResponse

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = (429, 503)
MAX_BACKOFF_S = 30.0


class SpinfError(Exception):
    """An error answer of the service: its status, message and the field (`param`) to fix."""

    def __init__(self, status_code: int, message: str, param: str | None = None, body: dict | None = None) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.param = param
        self.body = body or {}


@dataclass(frozen=True, slots=True)
class ClientConfig:
    base_url: str
    api_key: str | None
    max_retries: int
    timeout_s: float

    @classmethod
    def make(cls, base_url: str | None, api_key: str | None, max_retries: int, timeout_s: float) -> ClientConfig:
        """Arguments first, then SPINF_BASE_URL / SPINF_API_KEY, then the local default URL."""
        url = base_url or os.environ.get("SPINF_BASE_URL") or DEFAULT_BASE_URL
        return cls(url.rstrip("/"), api_key or os.environ.get("SPINF_API_KEY"), max_retries, timeout_s)

    def httpx_args(self) -> dict:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {"base_url": self.base_url, "headers": headers, "timeout": self.timeout_s}


def retry_delay(response: httpx.Response, attempt: int, max_retries: int) -> float | None:
    """Seconds to wait before sending again, or None when this answer is final."""
    if response.status_code not in RETRY_STATUSES or attempt >= max_retries:
        return None
    header = response.headers.get("retry-after")
    if header:
        try:
            return max(0.0, float(header))
        except ValueError:
            when = email.utils.parsedate_to_datetime(header)  # an HTTP date
            return max(0.0, when.timestamp() - time.time())
    return min(MAX_BACKOFF_S, 0.5 * 2**attempt)


def checked(response: httpx.Response) -> httpx.Response:
    """The response, or SpinfError with the service's message and field."""
    if response.status_code < 400:
        return response
    try:
        body = response.json()
        error = body.get("error") or {}
    except ValueError:
        body, error = {}, {}
    raise SpinfError(response.status_code, error.get("message") or response.text[:500], error.get("param"), body)


def job_body(items: Iterable[JobItem | dict], scoring: ScoringSpec | dict | None, packs: Iterable[str] = (),
             model: str | None = None) -> dict:
    rows = [item if isinstance(item, JobItem) else JobItem.model_validate(item) for item in items]
    return _create(model, scoring, packs, items=rows)


def dataset_body(input_uri: str, output_uri: str, scoring: ScoringSpec | dict | None, packs: Iterable[str] = (),
                 model: str | None = None) -> dict:
    return _create(model, scoring, packs, input={"s3": input_uri}, output={"s3": output_uri})


def _create(model: str | None, scoring, packs: Iterable[str], **source) -> dict:
    spec = scoring if isinstance(scoring, ScoringSpec) else ScoringSpec.model_validate(scoring or {})
    body = JobCreate(model=model, scoring=spec, packs=[PackRef(id=p) for p in packs], **source)
    return body.model_dump(mode="json", exclude_unset=True, exclude_none=True)


def read_items(path: Path | str) -> list[JobItem]:
    """The rows of a local JSONL file ({custom_id, text | messages} per non-blank line); ValueError names the line."""
    items = []
    for number, line in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(JobItem.model_validate(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValueError) as error:
            raise ValueError(f"{path}:{number}: {error}") from None
    return items


def is_finished(view: JobView) -> bool:
    return view.status.is_terminal


# ---- the calls: what each sends, how its answer is read -----------------------------------


def _json(response: httpx.Response) -> dict:
    return response.json()


def _job_view(response: httpx.Response) -> JobView:
    return JobView.model_validate(response.json())


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the API as data: either client sends it (`options` are httpx's) and returns
    `read(answer)`."""

    method: str
    path: str
    read: Callable[[httpx.Response], object]
    options: dict = field(default_factory=dict)  # json= or params=


def score_call(request: ScoringRequest | dict) -> Call:
    body = request.model_dump(mode="json", exclude_none=True) if isinstance(request, ScoringRequest) else request
    return Call("POST", "/v1/score", lambda response: ScoringResponse.model_validate(response.json()), {"json": body})


def decide_call(body: dict) -> Call:
    return Call("POST", "/v1/decide", _json, {"json": body})


def decisions_call(body: dict) -> Call:
    return Call("POST", "/v1/decisions", _json, {"json": body})


def create_job_call(body: dict) -> Call:
    return Call("POST", "/v1/jobs", _job_view, {"json": body})


def job_call(job_id: str) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}", _job_view)


def cancel_call(job_id: str) -> Call:
    return Call("POST", f"/v1/jobs/{job_id}/cancel", _job_view)


def results_path(job_id: str) -> str:
    return f"/v1/jobs/{job_id}/results"


def result_row(line: str) -> dict | None:
    """A results line as its row; None for a blank line."""
    return orjson.loads(line) if line.strip() else None


@dataclass(slots=True)
class JobWait:
    """A wait for a job to end: `ended(view)` after every poll calls `progress(view)`, is True once
    the job has ended, and raises TimeoutError past `timeout_s`."""

    job_id: str
    progress: Callable[[JobView], None] | None = None
    timeout_s: float | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        self.deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s

    def ended(self, view: JobView) -> bool:
        if self.progress is not None:
            self.progress(view)
        if is_finished(view):
            return True
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimeoutError(f"job {self.job_id} is still {view.status.value}")
        return False


@dataclass(slots=True)
class JobPages:
    """GET /v1/jobs page after page (`limit`, then `after` the last id) while `more`."""

    page_size: int
    more: bool = True
    after: str | None = None

    def next_call(self) -> Call:
        params = {"limit": self.page_size} | ({"after": self.after} if self.after is not None else {})
        return Call("GET", "/v1/jobs", self._read, {"params": params})

    def _read(self, response: httpx.Response) -> list[JobView]:
        page = JobList.model_validate(response.json())
        self.more, self.after = page.has_more, page.last_id
        return page.data
