"""The plain-RQ entry point: `rq worker` runs `workers.tasks.run_chunk` one chunk at a time,
on an engine built from the process's settings (SPINF_* environment), pack folders included."""

from pathlib import Path

import orjson
import pytest
import redis
from rq import SimpleWorker
from worker_helpers import SCORING, texts

from contract import queues
from contract.payloads import JobItem, JobStatus
from contract.protocol import PackRef, ScoringSpec
from contract.settings import get_settings
from jobstore import records
from jobstore.lifecycle import submit_inline
from jobstore.submit import make_queue
from workers.engines import clear_engines, engine_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]

OFFICIAL_REVIEWS = Path(__file__).resolve().parents[2] / "packs" / "product-reviews.yaml"


@pytest.fixture
def extra_packs(tmp_path) -> Path:
    """A folder with one pack the official packs/ do not have: acme/reviews."""
    folder = tmp_path / "packs"
    folder.mkdir()
    text = OFFICIAL_REVIEWS.read_text().replace("id: spinf/product-reviews", "id: acme/reviews", 1)
    (folder / "reviews.yaml").write_text(text)
    return folder


@pytest.fixture
def process_settings(monkeypatch, redis_url, extra_packs):
    """The settings `run_chunk` reads (get_settings), as a deployment sets them."""
    monkeypatch.setenv("SPINF_REDIS_URL", redis_url)
    monkeypatch.setenv("SPINF_PACK_DIRS", orjson.dumps([str(extra_packs)]).decode())
    monkeypatch.setenv("SPINF_DEVICE", "cpu")
    monkeypatch.setenv("SPINF_MAX_NUM_BATCHED_TOKENS", "2048")
    get_settings.cache_clear()
    clear_engines()
    yield get_settings()
    get_settings.cache_clear()
    clear_engines()


def test_run_chunk_serves_the_configured_pack_folders(process_settings, service_model_dir, extra_packs):
    model = str(service_model_dir)  # run_chunk loads it itself (workers.engines.engine_for)
    r = redis.Redis.from_url(process_settings.redis_url)
    items = [JobItem.model_validate(row) for row in texts(2, "p")]
    job_id = submit_inline(r, process_settings, "alice", model, ScoringSpec.model_validate(SCORING), items,
                           packs=[PackRef(id="acme/reviews")])
    worker = SimpleWorker([make_queue(r, queues.queue_pair(model).batch)], connection=r,
                          serializer=queues.JsonSerializer)
    assert worker.work(burst=True)
    assert records.load_view(r, job_id).status == JobStatus.SUCCEEDED
    rows = [orjson.loads(line) for chunk in records.iter_inline_results(r, job_id, 10) for line in chunk.splitlines()]
    assert [row["custom_id"] for row in rows] == ["p0", "p1"]
    for row in rows:
        assert "error" not in row, row["error"]
        [pack] = row["response"]["packs"]
        assert pack["pack"] == "acme/reviews" and pack["categories"]
    engine = engine_for(model, process_settings)  # the one run_chunk loaded: the same settings give the same engine
    assert engine.config.device == "cpu" and engine.config.max_num_batched_tokens == 2048
    assert engine.config.pack_dirs == (str(extra_packs),)
