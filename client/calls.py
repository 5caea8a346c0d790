"""What the sync and the async client share: configuration, request bodies, retries, errors.

    SPINF_BASE_URL, SPINF_API_KEY (or arguments) --> ClientConfig --> httpx headers and base URL
    a response: 429/503 --retry_delay (Retry-After, else backoff)--> sleep and send again (max_retries)
                other >= 400 --> SpinfError(status, message, param)
    job_body / dataset_body / read_items: the POST /v1/jobs bodies (contract models, validated here)

No I/O beyond reading a local JSONL file; the clients own the sockets and the sleeping.
"""

from __future__ import annotations

import email.utils
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from contract.payloads import JobCreate, JobItem, JobView
from contract.protocol import PackRef, ScoringSpec

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
