"""S3 access: a client for any S3-compatible endpoint, listing, ranged reads, uploads.

    S3Uri (contract/s3_uri.py) -> list_keys / list_dataset_keys / iter_lines / iter_object / read_range /
                                  put_bytes / put_file / get_bytes / delete_object

A dataset URI names an object or a folder, never a bare string prefix: `s3://data/b` is the
object `b` and the folder `b/` (listed with Prefix="b/"), never `b-secret/`. The callers check
every listed key and every object against the job's grants (contract.s3_uri.S3Access).

boto3 only, no torch. Uploads go through boto3's transfer manager (`upload_fileobj`), which
switches to multipart for large objects.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from contract.s3_uri import S3Uri
from contract.settings import Settings


def make_client(settings: Settings):
    return boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=settings.s3_secret_access_key,
        config=Config(retries={"max_attempts": settings.s3_max_attempts, "mode": "standard"},
                      s3={"addressing_style": "path"}),
    )


def list_dataset_keys(client, uri: S3Uri) -> list[str]:
    """The objects a dataset URI names, sorted: a folder ("" or ending in "/") lists what is
    under it; a bare key `b` is the object `b` (when there is one) and what is under `b/`."""
    keys = list_keys(client, S3Uri(uri.bucket, uri.folder))
    if uri.key and not uri.key.endswith("/") and object_exists(client, uri):
        keys.insert(0, uri.key)  # "b" sorts before every "b/..."
    return keys


def is_missing(error: ClientError) -> bool:
    """Whether an S3 call failed because the object is not there (GET: NoSuchKey, HEAD: 404)."""
    return error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def object_exists(client, uri: S3Uri) -> bool:
    try:
        client.head_object(Bucket=uri.bucket, Key=uri.key)
    except ClientError as error:
        if is_missing(error):
            return False
        raise
    return True


def list_keys(client, prefix: S3Uri) -> list[str]:
    """Every object key under the prefix, sorted (so chunk numbering is deterministic)."""
    keys: list[str] = []
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=prefix.bucket, Prefix=prefix.key):
        keys.extend(item["Key"] for item in page.get("Contents", []) if not item["Key"].endswith("/"))
    return sorted(keys)


def iter_lines(client, uri: S3Uri, chunk_size: int = 1 << 20):
    """Yield (byte_offset, line bytes including its b"\\n") of one object, streamed.

    Lines end at b"\\n" only, exactly as `split_lines` cuts a ranged read.
    """
    return split_blocks(iter_object(client, uri, chunk_size))


def iter_object(client, uri: S3Uri, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """An object's bytes, streamed in blocks."""
    yield from client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].iter_chunks(chunk_size)


def split_blocks(blocks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(byte_offset, line including its b"\\n") of a byte stream cut into blocks anywhere."""
    offset = 0
    pending = b""
    for block in blocks:
        pending += block
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield offset, line + b"\n"
            offset += len(line) + 1
    if pending:
        yield offset, pending


def read_range(client, uri: S3Uri, start: int, end: int) -> bytes:
    """Bytes [start, end) of an object."""
    if end <= start:
        return b""
    response = client.get_object(Bucket=uri.bucket, Key=uri.key, Range=f"bytes={start}-{end - 1}")
    return response["Body"].read()


def put_bytes(client, uri: S3Uri, data: bytes, content_type: str = "application/jsonl") -> None:
    put_file(client, uri, io.BytesIO(data), content_type)


def put_file(client, uri: S3Uri, file: BinaryIO, content_type: str = "application/jsonl") -> None:
    """Upload a file object from its current position (multipart past the transfer manager's threshold)."""
    client.upload_fileobj(file, uri.bucket, uri.key, ExtraArgs={"ContentType": content_type})


def delete_object(client, uri: S3Uri) -> None:
    client.delete_object(Bucket=uri.bucket, Key=uri.key)


def get_bytes(client, uri: S3Uri) -> bytes:
    return client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read()
