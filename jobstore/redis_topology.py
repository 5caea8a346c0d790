"""Which Redis the service talks to: one server by URL, or the master a Redis Sentinel names.

    settings.redis_sentinels = []                 -> redis.Redis.from_url(settings.redis_url)
    settings.redis_sentinels = ["h1:26379", ...]  -> Sentinel(those).master_for(redis_sentinel_service)
    redis_client(settings, **client_kwargs)        sync client (workers, the API's sync routes)
    async_redis_client(settings, **client_kwargs)  asyncio client (the API's middleware, sync waits)

`client_kwargs` go to every connection the client opens (socket timeouts, redis-py `Retry`),
so a caller that sets them gets them on either topology. Through Sentinel the client asks the
sentinels for the current master at each (re)connection: after a failover its next command
reconnects to the new master (redis-py's SentinelConnectionPool); a command cut by the switch
raises ConnectionError (or ReadOnlyError from the demoted master) and is retried like any
other connection error: unless the caller passes its own, a Sentinel client retries for up to
FAILOVER_RETRY_S (a failover takes a few seconds).

A connection opened before the failover still reaches the old master, which stays a master
until Sentinel reconfigures it (seconds later): a write it took then would be lost. With
`min-replicas-to-write 1` on the Redis servers (docs/deploy.md), the old master refuses writes
once its replicas have left it (NOREPLICAS); `MasterConnection` treats that reply as
redis-py treats READONLY: drop the connection, ask the sentinels again, retry the command
(and its reconnection does ask them: redis-py's retry alone would reconnect to the old one).

Redis Cluster is not supported: RQ needs multi-key commands on one node.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import ExponentialBackoff
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelManagedConnection
from redis.exceptions import ConnectionError, ResponseError, TimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from contract.settings import Settings


FAILOVER_RETRY_S = 30.0  # about: 40 retries, backoff 0.05 s doubling to at most 1 s
NO_REPLICAS_REPLY = "NOREPLICAS"  # a master with fewer good replicas than min-replicas-to-write


def _failover_error(error: ResponseError) -> ConnectionError | None:
    """A NOREPLICAS reply as the ConnectionError that makes the client ask the sentinels again;
    None for any other reply."""
    if not str(error).startswith(NO_REPLICAS_REPLY):
        return None
    return ConnectionError(f"the master refused a write, asking the sentinels again: {error}")


class MasterConnection(SentinelManagedConnection):
    """A connection to the Sentinel master that takes a NOREPLICAS reply for a failover, and
    asks the sentinels for the master whenever it reconnects: redis-py's own retry of a
    command reconnects to the address it had (redis-py issue 3874)."""

    def send_packed_command(self, command, check_health=True):
        if not self._sock:
            self.connect()
        return super().send_packed_command(command, check_health)

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as error:
            failover = _failover_error(error)
            if failover is None:
                raise
            self.disconnect()
            raise failover from error


class AsyncMasterConnection(AsyncSentinelManagedConnection):
    """The asyncio `MasterConnection`."""

    async def send_packed_command(self, command, check_health=True):
        if not self.is_connected:
            await self.connect()
        return await super().send_packed_command(command, check_health)

    async def read_response(self, *args, **kwargs):
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as error:
            failover = _failover_error(error)
            if failover is None:
                raise
            await self.disconnect()
            raise failover from error


def _failover_retry(client_kwargs: dict, retry_class) -> dict:
    if "retry" in client_kwargs:
        return client_kwargs
    retry = retry_class(ExponentialBackoff(cap=1.0, base=0.05), retries=40)
    return {"retry": retry, "retry_on_error": [ConnectionError, TimeoutError], **client_kwargs}


def sentinel_addresses(settings: Settings) -> list[tuple[str, int]]:
    """The sentinels as (host, port); a bad entry is a ValueError naming it."""
    addresses = []
    for entry in settings.redis_sentinels:
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"redis_sentinels: {entry!r} is not host:port")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def uses_sentinel(settings: Settings) -> bool:
    return bool(settings.redis_sentinels)


@dataclass(frozen=True, slots=True)
class _ClientKind:
    """The classes of one kind of client (sync or asyncio) on either topology."""

    redis: type
    sentinel: type
    master_connection: type
    retry: type


_SYNC = _ClientKind(redis.Redis, Sentinel, MasterConnection, Retry)
_ASYNC = _ClientKind(aioredis.Redis, AsyncSentinel, AsyncMasterConnection, AsyncRetry)


def _client(settings: Settings, kind: _ClientKind, client_kwargs: dict):
    if uses_sentinel(settings):
        sentinel = kind.sentinel(sentinel_addresses(settings), sentinel_kwargs=_sentinel_kwargs(client_kwargs))
        return sentinel.master_for(settings.redis_sentinel_service, connection_class=kind.master_connection,
                                   **_failover_retry(client_kwargs, kind.retry))
    if not settings.redis_url:
        raise ValueError("redis_url is empty and no redis_sentinels are set")
    return kind.redis.from_url(settings.redis_url, **client_kwargs)


def redis_client(settings: Settings, **client_kwargs) -> redis.Redis:
    """A sync client on the service's Redis (the Sentinel master when sentinels are set)."""
    return _client(settings, _SYNC, client_kwargs)


def async_redis_client(settings: Settings, **client_kwargs) -> aioredis.Redis:
    """The asyncio client on the same Redis as `redis_client`."""
    return _client(settings, _ASYNC, client_kwargs)


def _sentinel_kwargs(client_kwargs: dict) -> dict:
    """The sentinels themselves get the same socket timeouts as the data connections."""
    return {k: v for k, v in client_kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")}
