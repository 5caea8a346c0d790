"""Which Redis the settings name: the sentinels as host:port (a bad entry refused, naming it),
the Sentinel master's client built with the connection that follows a failover, and no Redis
at all refused. The failover itself: tests/deploy/test_sentinel.py."""

import pytest

from contract.settings import Settings
from jobstore.redis_topology import (AsyncMasterConnection, MasterConnection, async_redis_client, redis_client,
                                     sentinel_addresses, uses_sentinel)


def test_sentinels_are_host_port_pairs():
    settings = Settings(redis_sentinels=["h1:26379", "10.0.0.2:26380", "[::1]:26381"])
    assert uses_sentinel(settings)
    assert sentinel_addresses(settings) == [("h1", 26379), ("10.0.0.2", 26380), ("::1", 26381)]


@pytest.mark.parametrize("entry", ["h1", "h1:", ":26379", "h1:port"])
def test_a_bad_sentinel_entry_is_named(entry):
    with pytest.raises(ValueError, match=f"redis_sentinels: {entry!r} is not host:port"):
        sentinel_addresses(Settings(redis_sentinels=["ok:1", entry]))


def test_the_sentinel_clients_use_the_failover_connection():
    settings = Settings(redis_sentinels=["127.0.0.1:1"], redis_sentinel_service="svc")
    assert redis_client(settings).connection_pool.connection_class is MasterConnection
    assert async_redis_client(settings).connection_pool.connection_class is AsyncMasterConnection


def test_no_url_and_no_sentinels_is_refused():
    with pytest.raises(ValueError, match="redis_url is empty and no redis_sentinels are set"):
        redis_client(Settings(redis_url="", redis_sentinels=[]))
