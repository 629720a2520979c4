"""The Redis store and passwords (issue 29, item 4): a server that requires one refuses a client without it, our
client takes it from ``$MGRPO_REDIS_PASSWORD`` or the URL, a URL without one is refused before any connection (loopback
included: other users of the machine reach it) unless it opts out with ``?allow_no_password=1`` on loopback, and no
message shows the password."""

from __future__ import annotations

import pytest

from mgrpo_verl.store import check_store_reachable, open_store
from mgrpo_verl.store.redis import PASSWORD_ENV, allows_no_password, redacted, url_password
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
        open_store(locked_redis.bare_url + "?allow_no_password=1")  # past our check: the server itself refuses
    assert "authenticat" in str(err.value).lower() or "NOAUTH" in str(err.value)  # the server's words vary by version
    wrong = locked_redis.bare_url.replace("redis://", "redis://:not-the-password@")
    with pytest.raises(ConnectionError) as err:
        open_store(wrong)
    assert "not-the-password" not in str(err.value)  # the URL in the message is masked
    with pytest.raises(ValueError, match="cannot open the statistics store") as err:
        check_store_reachable(wrong, "multi_agent.decoupled.store")
    assert "not-the-password" not in str(err.value) and ":***@127.0.0.1" in str(err.value)


def test_the_password_from_the_environment_or_the_url(locked_redis, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    with open_store(locked_redis.bare_url) as store:
        assert store.put(numbered_stats(0, 3)) == 3
        assert PASSWORD not in store.url
    monkeypatch.delenv(PASSWORD_ENV)
    assert locked_redis.url == locked_redis.bare_url.replace("redis://", f"redis://:{PASSWORD}@")
    with open_store(locked_redis.url) as store:
        assert store.count() == 3  # the same server, the records written above
        assert store.url == locked_redis.bare_url.replace("redis://", "redis://:***@")


@pytest.mark.parametrize("url", ["redis://10.0.0.5:6379/0", "redis://redis-host:6379/0", "rediss://[2001:db8::1]:6380/0"])
def test_a_host_off_loopback_without_a_password_is_refused_before_connecting(url):
    with pytest.raises(ValueError, match=f"not on this machine's loopback, and no password is given.*export {PASSWORD_ENV}"):
        url_password(url, {})
    with pytest.raises(ValueError, match="no password is given"):
        open_store(url)  # before any connection: these hosts do not exist
    assert url_password(url, {PASSWORD_ENV: "from-env"}) == "from-env"
    with_password = url.replace("//", "//:in-url@", 1)
    assert url_password(with_password, {PASSWORD_ENV: "from-env"}) == "in-url"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
def test_loopback_without_a_password_is_refused_before_connecting(host, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    url = f"redis://{host}:6379/0"
    with pytest.raises(ValueError, match=f"no password is given.*every user of this machine.*export {PASSWORD_ENV}"
                                         ".*allow_no_password=1"):
        url_password(url, {})
    with pytest.raises(ValueError, match="no password is given"):
        open_store(url)  # refused by our check: nothing listens on 6379 here, a connection would be ConnectionError
    with pytest.raises(ValueError, match="multi_agent.decoupled.store.*no password is given"):
        check_store_reachable(url, "multi_agent.decoupled.store")
    assert url_password(url, {PASSWORD_ENV: "from-env"}) == "from-env"
    for value in ("1", "true", "YES"):
        assert url_password(f"{url}?prefix=x&allow_no_password={value}", {}) is None
    for value in ("0", "false", ""):
        with pytest.raises(ValueError, match="no password is given"):
            url_password(f"{url}?allow_no_password={value}", {})


def test_a_loopback_connection_without_a_password_is_refused_by_the_default_server(new_redis, monkeypatch):
    """The throw-away server the tests and the benchmark start requires a password unless asked not to; a client
    that skips our check (the opt-out URL against a server that has a password) is refused by the server itself."""
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    server = new_redis("default").start()
    assert server.requirepass and len(server.requirepass) >= 32
    with pytest.raises(ConnectionError, match="cannot reach the Redis server"):
        open_store(server.bare_url + "?allow_no_password=1")
    with pytest.raises(ValueError, match="no password is given"):
        open_store(server.bare_url)
    with open_store(server.url) as store:
        assert store.put(numbered_stats(0, 2)) == 2


def test_the_opt_out_opens_a_loopback_server_without_a_password_and_never_one_off_loopback(new_redis, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    server = new_redis("open", requirepass=None).start()
    assert server.url == server.bare_url + "?allow_no_password=1" and allows_no_password(server.url)
    with open_store(server.url + "&prefix=p:") as store:  # the parameter is ours: redis-py never sees it
        assert store.put(numbered_stats(0, 2)) == 2 and store.prefix == "p:"
    with pytest.raises(ValueError, match="not on this machine's loopback.*applies to loopback only"):
        url_password("redis://10.0.0.5:6379/0?allow_no_password=1", {})


def test_masking():
    assert redacted("redis://user:secret@h:1/0?prefix=x") == "redis://user:***@h:1/0?prefix=x"
    assert redacted("redis://:secret@h:1/0") == "redis://:***@h:1/0"
    assert redacted("redis://h:1/0") == "redis://h:1/0"


def test_the_test_server_is_refused_from_the_routable_address(new_redis):
    """The throw-away server (tests, bench_store) binds 127.0.0.1: a knock on its port at this machine's routable
    address, as from another machine, is refused (tests/security/doors.py); on loopback it answers."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("mgrpo_test_doors", Path(__file__).parents[1] / "security" / "doors.py")
    doors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doors)
    server = new_redis("door").start()
    routable = doors.routable_addresses()
    if not routable:
        pytest.skip(doors.NO_ADDRESS)
    knocks = doors.knock_all([server.port], routable)
    assert set(knocks.values()) == {"refused"}, knocks
    assert doors.knock("127.0.0.1", server.port) == "accepted"
