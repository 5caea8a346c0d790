"""A sync call's job (`/v1/score`, chat, `/v1/decide`, `/v1/decide/shared`): a new one, or
the active job of an identical call, so a client that retries a 504 never queues the work twice.

    SyncCall(route, body_json, reply_json).digest(owner, model)   sha256 of key, route, model, body
    submit_sync: WATCH spinf:sync:<digest>
      names a queued or running job  -> (that job id, attached): nothing reserved, nothing queued
      else reserve 1 row (QueueFull) -> MULTI: SET the digest key NX EX, the job record (route,
                                        reply_json, attach_key), its sync queue entry -> EXEC
      another call took the key in between (WatchError) -> the row given back, look again
    records.finish drops the digest key when the job ends (compare-and-delete), so a call made
    after that is a new job; the key's TTL (sync_result_ttl_s) bounds it if a finish never comes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import WatchError

from contract import queues
from contract.payloads import ChunkPayload, JobItem, JobStatus, JobSpec
from contract.settings import Settings
from jobstore import records
from jobstore.submit import enqueue_chunks, new_job_id, release_rows, reserve_rows

_ACTIVE = {JobStatus.QUEUED.value.encode(), JobStatus.RUNNING.value.encode()}


@dataclass(frozen=True, slots=True)
class SyncCall:
    """What a sync call was, beside its scoring request."""

    route: str  # the route called, e.g. "/v1/decide": a poll of the job answers with that route's reply
    body_json: str  # the route's validated body as canonical JSON: identical calls share a digest
    reply_json: str = ""  # what the route's reply needs besides the scoring response (JSON; "": nothing)

    def digest(self, owner: str, model: str) -> str:
        parts = (owner, self.route, model, self.body_json)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def submit_sync(
    r: Redis, settings: Settings, owner: str, spec: JobSpec, item: JobItem, call: SyncCall
) -> tuple[str, bool]:
    """(job id, True when this call queued it; False: attached to the identical call's active job)."""
    attach_key = queues.sync_call_key(call.digest(owner, spec.model))
    job_id = new_job_id()
    payload = ChunkPayload(job_id=job_id, chunk_index=0, **spec.spec_fields(), items=[item], num_rows=1)
    fields = {"owner": owner, "model": spec.model, "kind": "sync", "num_rows": 1, "num_chunks": 1,
              "route": call.route, "reply_json": call.reply_json, "attach_key": attach_key}
    queue_name = queues.queue_pair(spec.model).sync
    with r.pipeline() as pipe:
        while True:
            pipe.watch(attach_key)
            existing = pipe.get(attach_key)
            if existing is not None and pipe.hget(queues.job_key(existing.decode()), "status") in _ACTIVE:
                return existing.decode(), False
            reserve_rows(r, 1, settings.max_queue)  # QueueFull: nothing written
            try:
                pipe.multi()
                if existing is not None:  # its job ended and the key outlived it
                    pipe.delete(attach_key)
                pipe.set(attach_key, job_id, nx=True, ex=max(1, settings.sync_result_ttl_s))
                records.create_job(r, job_id, fields, pipe)
                enqueue_chunks(r, settings, [payload], queue_name, pipe, is_reserved=True)
                pipe.execute()
            except WatchError:  # an identical call queued its job first: attach to it
                release_rows(r, 1)
                continue
            except BaseException:
                release_rows(r, 1)
                raise
            return job_id, True
