"""Batches: the OpenAI Batch API's objects (openai 3.57 `types/batch*.py`) and its JSONL lines.

    POST /v1/batches BatchCreate {input_file_id, endpoint, completion_window "24h", metadata?}
      --> Batch (status validating --> in_progress --> finalizing --> completed;
                 failed, cancelling --> cancelled, expired)
    input line   {"custom_id", "method": "POST", "url" (= the batch's endpoint), "body"}
    output line  BatchOutputLine {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}

The Batch models are field for field the wheel's (tests/contract/test_openai_shapes.py
compares them), so the SDK's `Batch.model_validate` accepts every body this service sends.
docs/batches.md defines each count and each error code.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


from contract.files import ExpiresAfter
from contract.pages import ListPage
from contract.protocol import plain_text
from contract.settings import LIMITS

COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600
MAX_METADATA_KEYS = 16  # OpenAI's metadata bounds
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_CUSTOM_ID_CHARS = LIMITS.max_custom_id_chars  # a line's custom_id, as a job row's


class BatchStatus(str, enum.Enum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)

    @property
    def stamp(self) -> str:
        """The Batch field that records when it entered this status (`in_progress_at`, ...)."""
        return "created_at" if self is BatchStatus.VALIDATING else f"{self.value}_at"


class BatchCreate(BaseModel):
    """POST /v1/batches (openai 3.57 `batch_create_params.py`); `endpoint` is checked against the served ones."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1)
    endpoint: str
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} keys (got {len(metadata)})")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise ValueError(f"key {key[:20]!r}...: at most {MAX_METADATA_KEY_CHARS} characters")
            if len(value) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"{key}: a value has at most {MAX_METADATA_VALUE_CHARS} characters")
            plain_text(key)
            plain_text(value)
        return metadata


class BatchRequestCounts(BaseModel):
    completed: int  # lines in the output file: scored
    failed: int  # lines in the error file: refused at validation, by the engine, or not run (cancel, expiry)
    total: int  # non-blank lines of the input file


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int  # content + question + option + floor tokens read, over the scored lines
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int  # tokens decoded for extraction slots
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class BatchError(BaseModel):
    code: str | None = None
    line: int | None = None
    message: str | None = None
    param: str | None = None


class BatchErrors(BaseModel):
    data: list[BatchError] | None = None
    object: str | None = "list"


class Batch(BaseModel):
    id: str
    completion_window: str
    created_at: int
    endpoint: str
    input_file_id: str
    object: Literal["batch"] = "batch"
    status: BatchStatus
    cancelled_at: int | None = None
    cancelling_at: int | None = None
    completed_at: int | None = None
    error_file_id: str | None = None
    errors: BatchErrors | None = None
    expired_at: int | None = None
    expires_at: int | None = None
    failed_at: int | None = None
    finalizing_at: int | None = None
    in_progress_at: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    output_file_id: str | None = None
    request_counts: BatchRequestCounts | None = None
    usage: BatchUsage | None = None


BatchList = ListPage[Batch]


class LineResponse(BaseModel):
    status_code: int  # 200, or the status the endpoint would have answered (422: the engine refused the row)
    request_id: str
    body: dict[str, Any]


class LineError(BaseModel):
    """Why a line was not run: found at validation (its `line`, the `param` to fix), or the batch ended first."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchOutputLine(BaseModel):
    id: str
    custom_id: str | None  # None only where the line named none of its own (docs/batches.md)
    response: LineResponse | None = None
    error: LineError | None = None
