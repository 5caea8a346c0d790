"""Files: bytes in Redis (small files, or every file without `files_s3`) or on S3, a record per file.

    upload (a file object) --count non-blank lines--> store_file --> Redis string (APPENDed in blocks)
                                                                  | S3 object {files_s3}{id} (transfer manager)
                                                     --> record hash {owner, filename, bytes, purpose,
                                                         num_lines, location, expires_at} + owner index
    read: iter_content (blocks) / iter_lines (1-based number, non-blank line) / delete_file

Records and Redis bytes expire at `expires_at`; an S3 object outlives an expired record only
until the bucket's own lifecycle removes it (docs/batches.md). Pure job store: no HTTP.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from redis import Redis

from contract import queues
from contract.files import FileList, FileObject
from contract.s3_uri import parse_s3_uri
from contract.settings import Settings
from jobstore import owner_index
from jobstore.s3 import delete_object, iter_object, put_file, split_blocks

BLOCK_BYTES = 1 << 20
REDIS_LOCATION = "redis"


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file's record: what the API shows (`object`) and where its bytes are."""

    object: FileObject
    owner: str
    num_lines: int  # non-blank lines: the requests of a batch input file
    location: str  # "redis" or the s3:// URI of the object


def new_file_id() -> str:
    return "file-" + uuid.uuid4().hex


def count_lines(file: BinaryIO) -> tuple[int, int]:
    """(bytes, non-blank lines) of a file object read from its start; leaves it at its start."""
    file.seek(0)
    num_bytes = 0
    num_lines = 0

    def blocks():
        nonlocal num_bytes
        while block := file.read(BLOCK_BYTES):
            num_bytes += len(block)
            yield block

    for _, line in split_blocks(blocks()):
        num_lines += bool(line.strip())
    file.seek(0)
    return num_bytes, num_lines


def store_file(
    r: Redis, s3, settings: Settings, owner: str, filename: str, purpose: str, file: BinaryIO,
    expires_at: int | None = None, file_id: str | None = None,
) -> StoredFile:
    """Write the bytes (Redis or S3 by size), then the record; the record names them only once written."""
    file_id = file_id or new_file_id()
    num_bytes, num_lines = count_lines(file)
    expires_at = expires_at or int(time.time()) + settings.file_ttl_s
    if settings.files_s3 and num_bytes > settings.file_redis_max_bytes:
        location = str(parse_s3_uri(settings.files_s3).join(file_id))
        put_file(s3, parse_s3_uri(location), file, "application/jsonl")
    else:
        location = REDIS_LOCATION
        _append_blocks(r, queues.file_bytes_key(file_id), file, expires_at)
    created = FileObject(id=file_id, bytes=num_bytes, created_at=int(time.time()), filename=filename,
                         purpose=purpose, expires_at=expires_at)
    stored = StoredFile(created, owner, num_lines, location)
    fields = {**created.model_dump(exclude_none=True), "owner": owner, "num_lines": num_lines, "location": location}
    with r.pipeline() as pipe:
        pipe.hset(queues.file_key(file_id), mapping={k: str(v) for k, v in fields.items()})
        pipe.expireat(queues.file_key(file_id), expires_at)
        owner_index.add(r, owner_index.FILES, owner, file_id, pipe=pipe)
        pipe.execute()
    return stored


def _append_blocks(r: Redis, key: str, file: BinaryIO, expires_at: int) -> None:
    with r.pipeline() as pipe:
        pipe.set(key, b"")
        while block := file.read(BLOCK_BYTES):
            pipe.append(key, block)
        pipe.expireat(key, expires_at)
        pipe.execute()


def load_file(r: Redis, file_id: str, owner: str | None = None) -> StoredFile | None:
    """The file's record; None when there is none (or, with `owner`, when another key owns it)."""
    raw = {k.decode(): v.decode() for k, v in r.hgetall(queues.file_key(file_id)).items()}
    if not raw or (owner is not None and raw["owner"] != owner):
        return None
    shown = FileObject.model_validate({k: v for k, v in raw.items() if k in FileObject.model_fields})
    return StoredFile(shown, raw["owner"], int(raw["num_lines"]), raw["location"])


def iter_content(r: Redis, s3, stored: StoredFile) -> Iterator[bytes]:
    """The file's bytes in blocks (Redis GETRANGE or the S3 object's body)."""
    if stored.location != REDIS_LOCATION:
        yield from iter_object(s3, parse_s3_uri(stored.location), BLOCK_BYTES)
        return
    key = queues.file_bytes_key(stored.object.id)
    for start in range(0, stored.object.bytes, BLOCK_BYTES):
        yield r.getrange(key, start, start + BLOCK_BYTES - 1)


def iter_lines(r: Redis, s3, stored: StoredFile) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every non-blank line, streamed."""
    for number, (_, line) in enumerate(split_blocks(iter_content(r, s3, stored)), start=1):
        if line.strip():
            yield number, line


def delete_file(r: Redis, s3, stored: StoredFile) -> None:
    if stored.location != REDIS_LOCATION:
        delete_object(s3, parse_s3_uri(stored.location))
    r.delete(queues.file_key(stored.object.id), queues.file_bytes_key(stored.object.id))
    owner_index.remove(r, owner_index.FILES, stored.owner, stored.object.id)


def list_files(r: Redis, owner: str, after: str | None, limit: int, purpose: str | None = None,
               ascending: bool = False) -> FileList:
    """The owner's files, newest first (`ascending`: oldest first), `purpose` only when given."""
    loaded: dict[str, StoredFile] = {}

    def select(ids: list[str]) -> list[bool | None]:
        for file_id in ids:
            if (stored := load_file(r, file_id)) is not None:
                loaded[file_id] = stored
        return [None if i not in loaded else purpose is None or loaded[i].object.purpose == purpose for i in ids]

    found = owner_index.page(r, owner_index.FILES, owner, after, limit, select, ascending=ascending)
    return FileList.of([loaded[file_id].object for file_id in found.ids], found.has_more)
