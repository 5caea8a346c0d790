"""S3 locations as the contract spells them: URIs and the grants that allow them.

    "s3://bucket/in/" -> S3Uri(bucket="bucket", key="in/") --is_allowed(grants)--> bool

Pure Python: the API checks a key's grants with these before anything touches S3; the job
store (jobstore/s3.py) reads and writes what they name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class S3Uri:
    bucket: str
    key: str  # an object key or a prefix ("" for the whole bucket)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def join(self, name: str) -> S3Uri:
        base = self.key if not self.key or self.key.endswith("/") else self.key + "/"
        return S3Uri(self.bucket, base + name)


def parse_s3_uri(uri: str) -> S3Uri:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if len(bucket) < 3:
        raise ValueError(f"{uri!r}: the bucket name must have at least 3 characters")
    if ".." in key.split("/"):
        raise ValueError(f"{uri!r}: '..' is not allowed in a key")
    return S3Uri(bucket, key)


def is_allowed(uri: S3Uri, allowed: list[str]) -> bool:
    """`allowed` entries are "bucket" or "bucket/prefix"; a prefix matches on "/" boundaries."""
    for entry in allowed:
        bucket, _, prefix = entry.partition("/")
        if bucket != uri.bucket:
            continue
        prefix = prefix.rstrip("/")
        if not prefix or prefix == "*" or uri.key == prefix or uri.key.startswith(prefix + "/"):
            return True
    return False
