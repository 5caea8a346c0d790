"""Files: the OpenAI `File` object (openai 3.57 `types/file_object.py`, `file_deleted.py`), its list page.

    POST /v1/files (multipart: file, purpose=batch, expires_after?) --> FileObject
    GET /v1/files?after&limit&order&purpose --> FileList {data, first_id, last_id, has_more}
    DELETE /v1/files/{id} --> FileDeleted

Field for field the wheel's models (tests/contract/test_openai_shapes.py compares them), so
`FileObject.model_validate` of the SDK accepts every body this service sends.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from contract.pages import ListPage

FilePurpose = Literal[
    "assistants", "assistants_output", "batch", "batch_output", "fine-tune", "fine-tune-results", "vision", "user_data",
]
UPLOAD_PURPOSES = ("batch",)  # what POST /v1/files takes: the service reads files only as batch input
MIN_EXPIRES_AFTER_S = 3600  # OpenAI's bounds of expires_after.seconds
MAX_EXPIRES_AFTER_S = 30 * 24 * 3600


class FileObject(BaseModel):
    id: str
    bytes: int
    created_at: int
    filename: str
    object: Literal["file"] = "file"
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(BaseModel):
    id: str
    deleted: bool
    object: Literal["file"] = "file"


class ExpiresAfter(BaseModel):
    """`expires_after` of an upload (and `output_expires_after` of a batch)."""

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_EXPIRES_AFTER_S, le=MAX_EXPIRES_AFTER_S)


FileList = ListPage[FileObject]
