"""Redis clients built from settings: one place for timeouts, retries and health checks.

    Settings.redis_url, redis_socket_timeout_s, redis_connect_timeout_s, redis_num_retries,
    redis_backoff_base_s, redis_backoff_cap_s
      -> redis.Redis / redis.asyncio.Redis with Retry(ExponentialWithJitterBackoff, retries)
         retrying ConnectionError and TimeoutError (a Redis restart of a few seconds is bridged)

Every blocking read waits in slices shorter than the socket timeout (`wait_for_element`), so a
frozen Redis still ends the call within socket timeout x (retries + 1) plus the backoff,
and a long wait never trips the socket timeout.
"""

from __future__ import annotations

import time

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from contract.settings import Settings
from jobstore.redis_topology import async_redis_client, redis_client

RETRIED_ERRORS = (RedisConnectionError, RedisTimeoutError)
SLICE_MARGIN_S = 1.0  # a blocking slice is this much shorter than the socket timeout


def _options(settings: Settings) -> dict:
    return {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "health_check_interval": settings.redis_health_check_interval_s,
        "retry_on_error": list(RETRIED_ERRORS),
    }


def _backoff(settings: Settings) -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(cap=settings.redis_backoff_cap_s, base=settings.redis_backoff_base_s)


def sync_client(settings: Settings, url: str | None = None) -> redis.Redis:
    """By `url`, else as the settings say: `redis_url` or the master the Sentinels name."""
    retry = Retry(_backoff(settings), settings.redis_num_retries)
    if url is not None:
        return redis.Redis.from_url(url, retry=retry, **_options(settings))
    return redis_client(settings, retry=retry, **_options(settings))


def async_client(settings: Settings, url: str | None = None) -> aioredis.Redis:
    retry = AsyncRetry(_backoff(settings), settings.redis_num_retries)
    if url is not None:
        return aioredis.Redis.from_url(url, retry=retry, **_options(settings))
    return async_redis_client(settings, retry=retry, **_options(settings))


def blocking_slice_s(settings: Settings) -> float:
    """The longest single blocking wait (BLMOVE timeout) that stays under the socket timeout."""
    return max(1.0, settings.redis_socket_timeout_s - SLICE_MARGIN_S)


def unavailable_bound_s(settings: Settings) -> float:
    """How long a call to an unreachable or frozen Redis can take before it raises."""
    attempts = settings.redis_num_retries + 1
    per_attempt = max(settings.redis_socket_timeout_s, settings.redis_connect_timeout_s)
    return attempts * per_attempt + settings.redis_num_retries * settings.redis_backoff_cap_s


async def wait_for_element(client: aioredis.Redis, key: str, timeout_s: float, settings: Settings):
    """The first element of the list `key` once there is one, waiting up to `timeout_s` in
    slices shorter than the socket timeout; None past it. The element stays in the list
    (BLMOVE from the list to itself), so every caller waiting on the same job wakes."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        # BLMOVE's timeout is in seconds (float allowed since Redis 6); never 0 (= forever)
        wait = max(0.01, min(left, blocking_slice_s(settings)))
        moved = await client.blmove(key, key, wait, "LEFT", "RIGHT")
        if moved is not None:
            return moved
