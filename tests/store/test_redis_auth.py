"""The Redis store and passwords (issue 29, item 4): a server that requires one refuses a client without it, our
client takes it from ``$MGRPO_REDIS_PASSWORD`` or the URL, a host off loopback without one is refused before any
connection, and no message shows it."""

from __future__ import annotations

import pytest

from mgrpo_verl.store import check_store_reachable, open_store
from mgrpo_verl.store.redis import PASSWORD_ENV, is_loopback, redacted, url_password
from mgrpo_verl.store.testing import numbered_stats

from .conftest import require_redis

PASSWORD = "store-password-0123456789"


@pytest.fixture
def locked_redis(new_redis):
    require_redis()
    return new_redis("locked", requirepass=PASSWORD).start()


def test_a_client_without_the_password_is_refused(locked_redis, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(ConnectionError, match="cannot reach the Redis server") as err:
        open_store(locked_redis.url)
    assert "authenticat" in str(err.value).lower() or "NOAUTH" in str(err.value)  # the server's words vary by version
    wrong = locked_redis.url.replace("redis://", "redis://:not-the-password@")
    with pytest.raises(ConnectionError) as err:
        open_store(wrong)
    assert "not-the-password" not in str(err.value)  # the URL in the message is masked
    with pytest.raises(ValueError, match="cannot open the statistics store") as err:
        check_store_reachable(wrong, "multi_agent.decoupled.store")
    assert "not-the-password" not in str(err.value) and ":***@127.0.0.1" in str(err.value)


def test_the_password_from_the_environment_or_the_url(locked_redis, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    with open_store(locked_redis.url) as store:
        assert store.put(numbered_stats(0, 3)) == 3
        assert PASSWORD not in store.url
    monkeypatch.delenv(PASSWORD_ENV)
    with open_store(locked_redis.url.replace("redis://", f"redis://:{PASSWORD}@")) as store:
        assert store.count() == 3  # the same server, the records written above
        assert store.url == locked_redis.url.replace("redis://", "redis://:***@")


@pytest.mark.parametrize("url", ["redis://10.0.0.5:6379/0", "redis://redis-host:6379/0", "rediss://[2001:db8::1]:6380/0"])
def test_a_host_off_loopback_without_a_password_is_refused_before_connecting(url):
    with pytest.raises(ValueError, match=f"not on this machine's loopback, and no password is given.*export {PASSWORD_ENV}"):
        url_password(url, {})
    with pytest.raises(ValueError, match="no password is given"):
        open_store(url)  # before any connection: these hosts do not exist
    assert url_password(url, {PASSWORD_ENV: "from-env"}) == "from-env"
    with_password = url.replace("//", "//:in-url@", 1)
    assert url_password(with_password, {PASSWORD_ENV: "from-env"}) == "in-url"


def test_loopback_needs_no_password_and_masking():
    assert url_password("redis://127.0.0.1:6379/0", {}) is None
    assert url_password("redis://localhost:6379/0", {}) is None
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST"]))
    assert not any(map(is_loopback, ["10.0.0.1", "0.0.0.0", "redis-host", "", None]))
    assert redacted("redis://user:secret@h:1/0?prefix=x") == "redis://user:***@h:1/0?prefix=x"
    assert redacted("redis://:secret@h:1/0") == "redis://:***@h:1/0"
    assert redacted("redis://h:1/0") == "redis://h:1/0"
