"""S3 access: a client for any S3-compatible endpoint, listing, ranged reads, uploads.

    S3Uri (contract/s3_uri.py) -> list_keys / iter_lines / read_range / put_bytes / get_bytes

boto3 only, no torch. Uploads go through boto3's transfer manager (`upload_fileobj`), which
switches to multipart for large objects.
"""

from __future__ import annotations

import io

import boto3
from botocore.config import Config

from contract.s3_uri import S3Uri
from contract.settings import Settings


def make_client(settings: Settings):
    return boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=settings.s3_secret_access_key,
        config=Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}),
    )


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
    body = client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"]
    offset = 0
    pending = b""
    for block in body.iter_chunks(chunk_size):
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
    client.upload_fileobj(io.BytesIO(data), uri.bucket, uri.key, ExtraArgs={"ContentType": content_type})


def get_bytes(client, uri: S3Uri) -> bytes:
    return client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read()
