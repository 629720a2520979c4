"""The knock of ``doors.py`` itself: it lets a listener on every interface in and is refused by one on loopback, so a
door test that finds every knock refused has looked at doors it could have seen open."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("mgrpo_test_doors", Path(__file__).with_name("doors.py"))
doors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doors)


@pytest.fixture
def routable():
    addresses = doors.routable_addresses()
    if not addresses:
        pytest.skip(doors.NO_ADDRESS)
    return addresses


def _listener(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.bind((host, 0))
    s.listen(4)
    return s


def test_routable_addresses_are_not_loopback(routable):
    assert not set(routable) & set(doors.LOOPBACK)
    assert all(not ip.startswith(("127.", "fe80")) for ip in routable), routable


def test_a_listener_on_every_interface_is_let_in_and_one_on_loopback_is_refused(routable):
    with _listener("0.0.0.0") as everywhere, _listener("127.0.0.1") as loopback:
        ipv4 = [ip for ip in routable if ":" not in ip]
        if not ipv4:
            pytest.skip("no routable IPv4 address")
        out = doors.knock_all([everywhere.getsockname()[1]], ipv4)
        if set(out.values()) != {"accepted"}:
            pytest.skip(f"a listener on 0.0.0.0 is not reachable at this machine's own address (firewall?): {out}")
        assert doors.opened(out) == sorted(out)
        closed = doors.knock_all([loopback.getsockname()[1]], routable)
        assert set(closed.values()) == {"refused"}, closed
        assert doors.knock("127.0.0.1", loopback.getsockname()[1]) == "accepted"  # the control: it does listen


def test_listening_names_our_own_sockets():
    import os

    with _listener("127.0.0.1") as s:
        port = s.getsockname()[1]
        assert [(ip, p) for ip, p, _ in doors.listening({os.getpid()}) if p == port] == [("127.0.0.1", port)]
