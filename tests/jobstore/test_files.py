"""Files in the job store: Redis below file_redis_max_bytes, S3 (SeaweedFS) above it, records,
ownership, listing newest first with cursors, deletion."""

import io
import time

import pytest
import redis
from botocore.exceptions import ClientError

from contract import queues
from jobstore import files, owner_index
from jobstore.s3 import make_client

pytestmark = pytest.mark.redis

CONTENT = b'{"custom_id": "a"}\n\n  \n{"custom_id": "b"}\n{"custom_id": "c"}'  # 3 requests, 2 blank lines


def test_a_small_file_lives_in_redis(make_settings):
    settings = make_settings()
    r = redis.Redis.from_url(settings.redis_url)
    stored = files.store_file(r, None, settings, "alice", "in.jsonl", "batch", io.BytesIO(CONTENT))
    assert (stored.location, stored.num_lines, stored.object.bytes) == ("redis", 3, len(CONTENT))
    loaded = files.load_file(r, stored.object.id)
    assert loaded == stored and files.load_file(r, stored.object.id, owner="bob") is None
    assert b"".join(files.iter_content(r, None, loaded)) == CONTENT
    assert [n for n, _ in files.iter_lines(r, None, loaded)] == [1, 4, 5]
    ttl = r.ttl(queues.file_key(stored.object.id))
    assert settings.file_ttl_s - 5 < ttl <= settings.file_ttl_s
    files.delete_file(r, None, loaded)
    assert files.load_file(r, stored.object.id) is None and not r.exists(queues.file_bytes_key(stored.object.id))


@pytest.mark.s3
def test_a_large_file_goes_to_s3_in_blocks(make_settings, s3_bucket):
    settings = make_settings(files_s3=f"s3://{s3_bucket}/files/", file_redis_max_bytes=1000)
    r = redis.Redis.from_url(settings.redis_url)
    s3 = make_client(settings)
    big = b"".join(b'{"custom_id": "r%d", "text": "%s"}\n' % (i, b"x" * 900) for i in range(3000))  # ~2.8 MB
    stored = files.store_file(r, s3, settings, "alice", "big.jsonl", "batch", io.BytesIO(big))
    assert stored.location == f"s3://{s3_bucket}/files/{stored.object.id}" and stored.num_lines == 3000
    assert not r.exists(queues.file_bytes_key(stored.object.id))
    blocks = list(files.iter_content(r, s3, stored))
    assert len(blocks) >= 2 and b"".join(blocks) == big
    assert [n for n, _ in files.iter_lines(r, s3, stored)] == list(range(1, 3001))
    files.delete_file(r, s3, stored)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=s3_bucket, Key=f"files/{stored.object.id}")


def test_lists_page_newest_first_and_drop_expired(make_settings):
    settings = make_settings()
    r = redis.Redis.from_url(settings.redis_url)
    made = []
    for i in range(5):
        made.append(files.store_file(r, None, settings, "alice", f"{i}.jsonl", "batch", io.BytesIO(b"{}")).object.id)
        time.sleep(0.002)
    files.store_file(r, None, settings, "bob", "b.jsonl", "batch", io.BytesIO(b"{}"))
    first = files.list_files(r, "alice", None, 2)
    assert [f.id for f in first.data] == made[:-3:-1] and first.has_more and first.last_id == made[3]
    r.delete(queues.file_key(made[2]))  # expired
    rest = files.list_files(r, "alice", first.last_id, 2)
    assert [f.id for f in rest.data] == [made[1], made[0]] and not rest.has_more
    assert [f.id for f in files.list_files(r, "alice", None, 10, ascending=True).data] == [
        made[0], made[1], made[3], made[4]]
    assert files.list_files(r, "alice", None, 10, purpose="batch_output").data == []
    assert r.zcard(queues.owner_index_key(owner_index.FILES, "alice")) == 4  # the expired one left the index
    with pytest.raises(owner_index.UnknownCursorError):
        files.list_files(r, "alice", "file-nope", 2)
