"""Files (the OpenAI Files API, purpose=batch): upload, list, retrieve, content, delete.

    POST   /v1/files (multipart: file, purpose, expires_after[anchor|seconds]?) -> FileObject
    GET    /v1/files?after&limit&order&purpose                               -> FileList
    GET    /v1/files/{id}                                                    -> FileObject
    GET    /v1/files/{id}/content                                            -> the bytes, streamed
    DELETE /v1/files/{id}                                                    -> FileDeleted
A file belongs to the key that uploaded it (or whose batch wrote it): another key gets 404.
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Annotated, BinaryIO, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from api.deps import KeyDep, RedisDep, S3Dep
from api.errors import ApiError
from api.json_body import StrictJsonRoute
from contract.files import (
    UPLOAD_PURPOSES,
    ExpiresAfter,
    FileDeleted,
    FileList,
    FileObject,
)
from jobstore import files
from jobstore.owner_index import UnknownCursorError

router = APIRouter(route_class=StrictJsonRoute)
MAX_FILE_LIST_LIMIT = 10_000  # OpenAI's bound for GET /v1/files


@router.post("/v1/files", response_model=FileObject, response_model_exclude_none=True)
async def upload_file(
    request: Request, key: KeyDep, file: Annotated[UploadFile | str, File()], purpose: Annotated[str, Form()],
) -> FileObject:
    """Store a batch input file (Redis, or S3 past file_redis_max_bytes when files_s3 is set). The
    file is a file part, or a plain form field (no filename): its text's UTF-8 bytes."""
    state = request.app.state
    settings = state.settings
    if purpose not in UPLOAD_PURPOSES:
        raise ApiError(422, f"purpose: {purpose!r}: this service reads files as batch input only;"
                       f" give one of {list(UPLOAD_PURPOSES)}", param="purpose")
    name, size, stream = _upload_parts(file)
    if size is not None and size > settings.max_file_bytes:
        raise ApiError(413, f"file: {size} bytes; the limit is {settings.max_file_bytes} bytes"
                       " (SPINF_MAX_FILE_BYTES)", param="file")
    expires_at = _expires_at(await request.form())
    stored = await asyncio.to_thread(files.store_file, state.redis, state.s3, settings, key.name,
                                     name, purpose, stream, expires_at)
    return stored.object


def _upload_parts(file: UploadFile | str) -> tuple[str, int | None, BinaryIO]:
    """(filename, size if known, byte stream) of the uploaded file."""
    if isinstance(file, str):
        data = file.encode("utf-8", "surrogatepass")
        return "upload.jsonl", len(data), io.BytesIO(data)
    return file.filename or "upload.jsonl", file.size, file.file


def _expires_at(form) -> int | None:
    """expires_after[anchor] and expires_after[seconds] (the SDK's form encoding of `expires_after`)."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    try:
        parsed = ExpiresAfter.model_validate({"anchor": anchor, "seconds": seconds})
    except ValidationError as error:
        first = error.errors()[0]
        param = f"expires_after.{first['loc'][0]}"
        raise ApiError(422, f"{param}: {first['msg']}", param=param) from None
    return int(time.time()) + parsed.seconds


@router.get("/v1/files", response_model=FileList, response_model_exclude_none=True)
def list_files(
    key: KeyDep, r: RedisDep, after: str | None = None, limit: int = Query(default=MAX_FILE_LIST_LIMIT, ge=1,
    le=MAX_FILE_LIST_LIMIT), order: Literal["asc", "desc"] = "desc", purpose: str | None = None,
) -> FileList:
    try:
        return files.list_files(r, key.name, after, limit, purpose, ascending=order == "asc")
    except UnknownCursorError:
        raise ApiError(404, f"after: no file {after!r} of this key", param="after") from None


def owned_file(r, file_id: str, owner: str) -> files.StoredFile:
    stored = files.load_file(r, file_id, owner)
    if stored is None:
        raise ApiError(404, f"no file {file_id!r}")
    return stored


@router.get("/v1/files/{file_id}", response_model=FileObject, response_model_exclude_none=True)
def retrieve_file(file_id: str, key: KeyDep, r: RedisDep) -> FileObject:
    return owned_file(r, file_id, key.name).object


@router.get("/v1/files/{file_id}/content")
def file_content(file_id: str, key: KeyDep, r: RedisDep, s3: S3Dep) -> StreamingResponse:
    stored = owned_file(r, file_id, key.name)
    headers = {"Content-Length": str(stored.object.bytes)}
    return StreamingResponse(files.iter_content(r, s3, stored), media_type="application/octet-stream",
                             headers=headers)


@router.delete("/v1/files/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, key: KeyDep, r: RedisDep, s3: S3Dep) -> FileDeleted:
    files.delete_file(r, s3, owned_file(r, file_id, key.name))
    return FileDeleted(id=file_id, deleted=True)
