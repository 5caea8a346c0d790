"""S3 locations as the contract spells them: URIs and the grants that allow them.

    "s3://bucket/in/" --parse_s3_uri--> S3Uri(bucket="bucket", key="in/") --is_allowed(grants)--> bool
    S3Access(read, write): a job's grants, checked again at every S3 call its worker makes
      (check_read: a listed key, an object read; check_write: results, errors, the manifest;
      check_read_back: the job's own output read again, by the API or the job's calibration)

A grant is "bucket" or "bucket/prefix"; it covers the key `prefix` itself and every key under
`prefix/`: whole path segments, so a grant for `data/b` never covers `data/b-secret/...`.

Pure Python: the API checks a key's grants with these before anything touches S3; the job
store (jobstore/s3.py, jobstore/datasets.py) checks them again at every call it makes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_REFUSED_CHARS = {"?": "a query string", "#": "a fragment", "%": "a percent-encoding", "\\": "a backslash"}


class S3AccessDenied(PermissionError):
    """An S3 call outside a job's grants: refused before it is sent."""


@dataclass(frozen=True, slots=True)
class S3Uri:
    bucket: str
    key: str  # an object key or a prefix ("" for the whole bucket)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @classmethod
    def from_stored(cls, uri: str) -> S3Uri:
        """A URI the service built itself (a listed key, a job's output): any key S3 allows."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return cls(bucket, key)

    def join(self, name: str) -> S3Uri:
        return S3Uri(self.bucket, self.folder + name)

    @property
    def folder(self) -> str:
        """The key as a folder prefix: "" (the bucket) or ending in "/"."""
        return self.key if not self.key or self.key.endswith("/") else self.key + "/"


def parse_s3_uri(uri: str) -> S3Uri:
    """A client's s3:// URI; ValueError names what to fix (query strings, fragments,
    percent-encodings, '.' / '..' / empty segments and control characters are refused)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    for char, what in _REFUSED_CHARS.items():
        if char in uri:
            raise ValueError(f"{uri!r}: {what} ({char!r}) is not allowed in an S3 URI; name the object or prefix only")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in uri):
        raise ValueError(f"{uri!r}: control characters are not allowed in an S3 URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if len(bucket) < 3:
        raise ValueError(f"{uri!r}: the bucket name must have at least 3 characters")
    if (problem := key_problem(key)) is not None:
        raise ValueError(f"{uri!r}: {problem}")
    return S3Uri(bucket, key)


def key_problem(key: str) -> str | None:
    """Why a key is not a plain path ('.', '..' or an empty segment inside it), else None."""
    segments = key.split("/")
    if key.endswith("/"):
        segments = segments[:-1]  # a folder's trailing "/"
    if key and any(segment in (".", "..") for segment in segments):
        return "'.' and '..' are not allowed as path segments"
    if key and "" in segments:
        return "empty path segments ('//', a leading '/') are not allowed"
    return None


def is_within(uri: S3Uri, bucket: str, prefix: str) -> bool:
    """`uri` is the key `prefix` itself or under the folder `prefix/` of `bucket` (whole segments)."""
    prefix = prefix.rstrip("/")
    if uri.bucket != bucket or key_problem(uri.key) is not None:
        return False
    return not prefix or prefix == "*" or uri.key.rstrip("/") == prefix or uri.key.startswith(prefix + "/")


def is_allowed(uri: S3Uri, allowed: list[str]) -> bool:
    """`allowed` entries are "bucket" or "bucket/prefix"; a prefix matches whole "/" segments."""
    for entry in allowed:
        bucket, _, prefix = entry.partition("/")
        if is_within(uri, bucket, prefix):
            return True
    return False


@dataclass(frozen=True, slots=True)
class S3Access:
    """What one job's worker may touch: the grants its key had at submit time, narrowed to
    the job's own input and output locations (each a grant of its own)."""

    read: tuple[str, ...]  # grants; a read needs one of them and the job's input scope
    write: tuple[str, ...]
    input_scope: str = ""  # "bucket/prefix" of the job's input ("" when none)
    output_scope: str = ""

    @classmethod
    def for_job(cls, input_uri: str | None, output_uri: str | None, read: list[str] | None = None,
                write: list[str] | None = None) -> S3Access:
        """The job's access; grants left out (a job recorded without them): its input and output only."""
        input_scope, output_scope = _scope_of(input_uri), _scope_of(output_uri)
        read = read if read is not None else [input_scope] if input_scope else []
        write = write if write is not None else [output_scope] if output_scope else []
        return cls(tuple(read), tuple(write), input_scope, output_scope)

    def to_json(self) -> str:
        return json.dumps({"read": self.read, "write": self.write, "input_scope": self.input_scope,
                           "output_scope": self.output_scope})

    @classmethod
    def from_json(cls, text: str) -> S3Access:
        raw = json.loads(text)
        return cls(tuple(raw["read"]), tuple(raw["write"]), raw["input_scope"], raw["output_scope"])

    def check_read(self, uri: S3Uri) -> S3Uri:
        return _check(uri, self.read, self.input_scope, "read")

    def check_write(self, uri: S3Uri) -> S3Uri:
        return _check(uri, self.write, self.output_scope, "write")

    def check_read_back(self, uri: S3Uri) -> S3Uri:
        """A read of what the job wrote (results, calibration reports): inside the job's output
        and its write grants, as the write was."""
        return _check(uri, self.write, self.output_scope, "output")



def _scope_of(uri: str | None) -> str:
    """The grant that covers exactly `uri` (the object, or the folder) and what is under it."""
    if uri is None:
        return ""
    parsed = S3Uri.from_stored(uri)
    return f"{parsed.bucket}/{parsed.key}".rstrip("/")


def _check(uri: S3Uri, grants: tuple[str, ...], scope: str, verb: str) -> S3Uri:
    if not is_allowed(uri, list(grants)) or (scope and not is_allowed(uri, [scope])):
        raise S3AccessDenied(f"{uri} is outside this job's {verb} grants; the call was not made")
    return uri
