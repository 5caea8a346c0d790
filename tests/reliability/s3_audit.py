"""What the S3 server handled, read from its own log (SeaweedFS at glog -v=4), and the isolation
check over it: every request a job made stays inside its grants.

    weed.log lines --requests_since(offset)--> [S3Request(method, bucket, key, list_prefix, listed)]
      "stats.go:.. "-" GET "/data/b/x.jsonl" 206 ..."                  -> GET data b/x.jsonl
      "ListObjectsV2Handler bucket=data prefix=b/ marker="             -> LIST data, prefix "b/"
      "ListObjectsV2Handler response: &{... Contents:[{Key:b/x.jsonl ..." -> the keys it listed
    [S3Request] --violations(read_grant, write_grant)--> ["LIST data prefix 'b' (not a folder ...)", ...]

The server's side, not the client's: a request is checked as the server saw it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from contract.s3_uri import S3Uri, is_within

_ACCESS = re.compile(r'stats\.go:\d+\]? "[^"]*" (GET|PUT|HEAD|POST|DELETE) "([^"]*)" (\d+)')
_LIST = re.compile(r"ListObjectsV\dHandler bucket=(\S+) prefix=(\S*) ")
_LISTED = re.compile(r"ListObjectsV\dHandler response: .*?Contents:\[(.*?)\] CommonPrefixes")
_KEY = re.compile(r"\{Key:(\S+) ")


@dataclass
class S3Request:
    method: str  # GET PUT HEAD POST DELETE, or LIST (a listing, with its prefix and the keys it returned)
    bucket: str
    key: str  # the object key ("" for a bucket-level request)
    list_prefix: str | None = None
    listed: list[str] = field(default_factory=list)


def log_offset(log: Path) -> int:
    return log.stat().st_size


def requests_since(log: Path, offset: int) -> list[S3Request]:
    with log.open("rb") as file:
        file.seek(offset)
        text = file.read().decode(errors="replace")
    found: list[S3Request] = []
    for line in text.splitlines():
        if (access := _ACCESS.search(line)) is not None:
            bucket, _, key = unquote(access.group(2).lstrip("/").split("?")[0]).partition("/")
            if key or access.group(1) != "GET":  # GET "/bucket" is a listing, counted from its LIST line
                found.append(S3Request(access.group(1), bucket, key))
        elif (listing := _LIST.search(line)) is not None:
            found.append(S3Request("LIST", listing.group(1), "", list_prefix=listing.group(2)))
        elif (listed := _LISTED.search(line)) is not None and found:
            last_list = next((request for request in reversed(found) if request.method == "LIST"), None)
            if last_list is not None:
                last_list.listed = _KEY.findall(listed.group(1))
    return found


def violations(requests: list[S3Request], read: tuple[str, str], write: tuple[str, str]) -> list[str]:
    """Every request outside the grants: `read` / `write` are (bucket, prefix); a listing must
    name a folder inside the read grant and return only keys inside it; a read is inside the
    read grant or the write grant (results read back)."""
    problems = []
    for request in requests:
        if request.method == "LIST":
            problems += _list_problems(request, read)
        elif request.method in ("GET", "HEAD") and not _inside(request, read, write):
            problems.append(f"{request.method} {request.bucket}/{request.key}: outside the read grant {read}"
                            f" and the job's own output {write}")
        elif request.method in ("PUT", "POST", "DELETE") and not is_within(S3Uri(request.bucket, request.key), *write):
            problems.append(f"{request.method} {request.bucket}/{request.key}: outside the write grant {write}")
    return problems


def _inside(request: S3Request, *grants: tuple[str, str]) -> bool:
    return any(is_within(S3Uri(request.bucket, request.key), *grant) for grant in grants)


def _list_problems(request: S3Request, read: tuple[str, str]) -> list[str]:
    bucket, prefix = read
    problems = []
    folder = request.list_prefix or ""
    if request.bucket != bucket or not folder.endswith("/") or not is_within(S3Uri(bucket, folder), bucket, prefix):
        problems.append(f"LIST {request.bucket} prefix {folder!r}: not a folder inside the read grant {read}")
    problems += [f"LIST {request.bucket} returned {key!r}: outside the read grant {read}"
                 for key in request.listed if not is_within(S3Uri(request.bucket, key), bucket, prefix)]
    return problems
