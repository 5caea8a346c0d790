"""Per-owner indexes for the list endpoints: newest first, paged by the last id seen.

    add(kind, owner, id) --> ZADD owner_index_key(kind, owner) {id: created time}
    page(kind, owner, after, limit, select) --> Page(ids, has_more)
        ids after `after` (newest first, or oldest first), skipping (and dropping) ids whose record expired

An id's place is found with ZREVRANK each call, so entries added between two pages (newer,
at the front) move nothing a reader has not seen yet. `kind`: JOBS, FILES or BATCHES.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis

from contract import queues
from contract.payloads import JobList
from jobstore import records

JOBS = "jobs"
FILES = "files"
BATCHES = "batches"


class UnknownCursorError(LookupError):
    """`after` names no listed object of this owner (never one, or expired)."""


@dataclass(frozen=True, slots=True)
class Page:
    ids: list[str]
    has_more: bool


def add(r: Redis, kind: str, owner: str, object_id: str, pipe=None) -> None:
    (pipe or r).zadd(queues.owner_index_key(kind, owner), {object_id: time.time()})


def remove(r: Redis, kind: str, owner: str, object_id: str) -> None:
    r.zrem(queues.owner_index_key(kind, owner), object_id)


def page(
    r: Redis, kind: str, owner: str, after: str | None, limit: int, select: Callable[[list[str]], list[bool | None]],
    ascending: bool = False,
) -> Page:
    """Up to `limit` ids after `after`; `select(ids)` says of each: True list it, False skip it
    (a filter), None its record is gone (dropped from the index)."""
    key = queues.owner_index_key(kind, owner)
    rank_of, range_of = (r.zrank, r.zrange) if ascending else (r.zrevrank, r.zrevrange)
    start = 0
    if after is not None:
        rank = rank_of(key, after)
        if rank is None:
            raise UnknownCursorError(after)
        start = rank + 1
    found: list[str] = []
    while len(found) <= limit:
        ids = [member.decode() for member in range_of(key, start, start + limit)]
        if not ids:
            break
        verdicts = select(ids)
        gone = [object_id for object_id, verdict in zip(ids, verdicts, strict=True) if verdict is None]
        if gone:
            r.zrem(key, *gone)
        start += len(ids) - len(gone)
        found += [object_id for object_id, verdict in zip(ids, verdicts, strict=True) if verdict]
    return Page(found[:limit], len(found) > limit)


def records_exist(r: Redis, key_of: Callable[[str], str]) -> Callable[[list[str]], list[bool | None]]:
    """A `select` for `page` that lists every id whose record exists (one EXISTS per id, pipelined)."""

    def select(ids: list[str]) -> list[bool | None]:
        with r.pipeline(transaction=False) as pipe:
            for object_id in ids:
                pipe.exists(key_of(object_id))
            return [True if n else None for n in pipe.execute()]

    return select


def list_jobs(r: Redis, owner: str, after: str | None, limit: int) -> JobList:
    """GET /v1/jobs: the owner's jobs (inline, dataset, batch; not /v1/score calls), newest first."""
    found = page(r, JOBS, owner, after, limit, records_exist(r, queues.job_key))
    views = [view for job_id in found.ids if (view := records.load_view(r, job_id)) is not None]
    return JobList.of(views, found.has_more)
