"""Job payloads and job views: pydantic at the queue's trust boundary.

    JobCreate (HTTP body) --submit--> PlanPayload | ChunkPayload (RQ job kwargs, JSON)
    a batch's valid lines --submit_requests--> ChunkPayload(requests=[RequestItem]) (each its own request)
    ChunkPayload --worker--> result rows {custom_id, response} | {custom_id, error}
    job record (Redis hash) --> JobView (GET /v1/jobs/{id})

JobCreate, PlanPayload and ChunkPayload share one JobSpec (model, scoring, packs, debug: what
every row of the job is asked, by which model); its fields sit flat in each, as on the wire.

Every payload is validated when it is enqueued and again when a worker runs it, so a
payload written by an older or foreign producer fails loudly instead of scoring garbage.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.pages import ListPage
from contract.protocol import ContentText, check_content_size, IdText, Message, PackRef, ScoringRequest, ScoringSpec, Text
from contract.scoring_results import Usage
from contract.settings import LIMITS
from contract.s3_uri import S3Access, parse_s3_uri


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobStatus(str, enum.Enum):
    """A job's status: queued, running, then one of the three terminal ones."""

    is_terminal = property(lambda self: self in TERMINAL_JOB_STATUSES)
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_JOB_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class JobItem(_Strict):
    """One row: `messages`, or `text` as a single user message."""

    custom_id: Text(LIMITS.max_custom_id_chars)
    messages: list[Message] | None = Field(default=None, min_length=1, max_length=LIMITS.max_messages)
    text: ContentText | None = None
    # ids of the two-option queries whose first option is right for this row: the job then
    # gets a calibration report (docs/calibration.md); the row's result carries them back
    labels: list[IdText] | None = Field(default=None, max_length=LIMITS.max_queries)

    @model_validator(mode="after")
    def _one_of(self) -> JobItem:
        if (self.messages is None) == (self.text is None):
            raise ValueError("give exactly one of `messages` or `text`")
        if self.messages is not None:
            check_content_size(self.messages)
        return self

    def to_messages(self) -> list[Message]:
        return self.messages if self.messages is not None else [Message(role="user", content=self.text)]

    def to_request(self, scoring: ScoringSpec, debug: bool, packs: list[PackRef] = ()) -> ScoringRequest:
        return ScoringRequest(messages=self.to_messages(), scoring=scoring, packs=list(packs), debug=debug)


class S3Location(_Strict):
    s3: str  # "s3://bucket/prefix/"

    @field_validator("s3")
    @classmethod
    def _parse(cls, value: str) -> str:
        parse_s3_uri(value)
        return value


class JobSpec(_Strict):
    """What every row of a job is asked, and by which model."""

    model: str
    scoring: ScoringSpec
    packs: list[PackRef] = Field(default_factory=list)  # prompt packs every row is also asked
    debug: bool = False

    def spec_fields(self) -> dict:
        """The spec's fields the caller set, as they are: another payload built from them sends
        only those (payloads travel exclude_unset: a default re-sent as if given can change meaning)."""
        return {name: getattr(self, name) for name in JobSpec.model_fields if name in self.model_fields_set}

    def request_for(self, item: JobItem) -> ScoringRequest:
        return item.to_request(self.scoring, self.debug, self.packs)


class JobCreate(JobSpec):
    """POST /v1/jobs: inline `items`, or an S3 `input` prefix with an S3 `output` prefix."""

    model: str | None = None  # None: the service's default model
    items: list[JobItem] | None = Field(default=None, min_length=1)
    input: S3Location | None = None
    output: S3Location | None = None

    @model_validator(mode="after")
    def _source(self) -> JobCreate:
        if (self.items is None) == (self.input is None):
            raise ValueError("give exactly one of `items` (inline) or `input` (S3 dataset)")
        if self.input is not None and self.output is None:
            raise ValueError("output: an S3 `input` needs an S3 `output` prefix")
        if self.items is not None and self.output is not None:
            raise ValueError("output: inline jobs keep their results in the service; drop `output`")
        if not self.scoring.queries and not self.packs:
            raise ValueError("scoring.queries: give at least one query, or name a pack in `packs`")
        ids = [pack.id for pack in self.packs]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:  # as a sync call's: each pack is asked once
            raise ValueError(f"packs: pack(s) {duplicates} named more than once")
        _check_unique_custom_ids(self.items or [])
        return self


def _check_unique_custom_ids(items: list[JobItem]) -> None:
    """A custom_id names one row of a job: a repeated one is refused (a 422 naming both items)."""
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        earlier = first_index.setdefault(item.custom_id, index)
        if earlier != index:
            raise ValueError(f"items: items[{index}].custom_id {item.custom_id!r} repeats items[{earlier}]'s;"
                             " each row needs its own custom_id")


class ByteRange(_Strict):
    """Lines [first_line, ...) of one S3 object, as the bytes [start, end)."""

    uri: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    first_line: int = Field(ge=1)  # 1-based line number of the first line in the range
    # lines of the range whose custom_id an earlier row of the job owns -> that row ("line 3 of s3://...")
    repeats: dict[int, str] = Field(default_factory=dict)


class RequestItem(_Strict):
    """One row that carries its own request (a batch line): scored as is, in the job's passes."""

    custom_id: str
    request: ScoringRequest


class ChunkPayload(JobSpec):
    """One RQ job: a slice of a job's rows; its results settle as one unit."""

    job_id: str
    chunk_index: int = Field(ge=0)
    scoring: ScoringSpec | None = None  # asked of every row of `items` or `source`; `requests` rows carry their own
    items: list[JobItem] | None = None  # inline rows
    source: ByteRange | None = None  # dataset rows
    requests: list[RequestItem] | None = None  # rows with their own requests (batches)
    output: str | None = None  # s3:// prefix the chunk writes to (datasets)
    access: S3Access | None = None  # the job's S3 grants, checked at every read and write (datasets)
    num_rows: int = Field(ge=0)  # rows in the chunk (non-blank lines for datasets)

    @model_validator(mode="after")
    def _source(self) -> ChunkPayload:
        if sum(rows is not None for rows in (self.items, self.source, self.requests)) != 1:
            raise ValueError("a chunk has exactly one of `items`, `source` or `requests`")
        if (self.scoring is None) != (self.requests is not None):
            raise ValueError("scoring: `items` and `source` chunks need it; `requests` rows carry their own")
        if self.source is not None and self.output is None:
            raise ValueError("a dataset chunk needs `output`")
        listed = self.items if self.items is not None else self.requests
        if listed is not None and len(listed) != self.num_rows:
            raise ValueError("num_rows must equal the number of items")
        return self

    def s3_access(self) -> S3Access:
        return self.access or S3Access.for_job(self.source and self.source.uri, self.output)


class PlanPayload(JobSpec):
    """One RQ job: list a dataset, cut it into chunks (each gets the plan's spec), enqueue them."""

    job_id: str
    input: str
    output: str
    chunk_num_rows: int = Field(ge=1)
    access: S3Access | None = None  # the submitting key's S3 grants (None: the input and output only)

    def s3_access(self) -> S3Access:
        return self.access or S3Access.for_job(self.input, self.output)


class RowError(BaseModel):
    """Why a row got no response (the `error` of a result row, a line of the errors object)."""

    line: int | None = None  # 1-based line in its input object (datasets)
    custom_id: str | None = None
    field: str | None = None
    message: str


class Progress(BaseModel):
    total: int | None  # rows in the job; None until a dataset is listed
    done: int  # rows settled: a result or an error
    failed: int  # rows settled with an error


class JobView(BaseModel):
    id: str
    object: Literal["job"] = "job"
    model: str
    status: JobStatus
    progress: Progress
    created_at: int
    started_at: int | None = None
    finished_at: int | None = None
    usage: Usage
    input: str | None = None
    output: str | None = None
    error: str | None = None
    route: str | None = None  # a sync call's job: the route called; /results holds that route's reply


JobList = ListPage[JobView]  # GET /v1/jobs: a page of the caller's jobs, newest first
