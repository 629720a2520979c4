"""Knocking on a door: connect to a listening port from this machine's routable (non-loopback) address, as
another machine would, and say whether the connection was accepted.

A socket bound to loopback refuses a connection to the machine's routable address with ECONNREFUSED even from
this machine (the kernel matches the destination address against the bind), while one bound to every interface
(``0.0.0.0``, ``::``) or to the routable address accepts it. So a door test that knocks on each listening port at
the routable address tests what an outsider gets, not only which address a socket reports.

Not a test module (pytest collects ``test_*.py`` only); other test folders load it by path with :func:`load`
(pytest's importlib mode and verl's own top-level ``tests`` package rule out ``import tests.security...``), and
subprocess scripts with ``runpy.run_path(os.environ[PATH_ENV])``.
"""

from __future__ import annotations

import errno
import importlib.util
import ipaddress
import socket
import sys
from pathlib import Path

#: the environment variable a subprocess script finds this file's path in (``runpy.run_path``)
PATH_ENV = "MGRPO_DOORS_PY"
PATH = str(Path(__file__).resolve())
LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
NO_ADDRESS = "this machine has no non-loopback address to knock from"


def load():
    """This module, imported by path (for test files of other folders)."""
    name = "mgrpo_test_doors"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _routable(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    return not (addr.is_loopback or addr.is_link_local or addr.is_unspecified or addr.is_multicast)


def routable_addresses() -> list[str]:
    """This machine's addresses other than loopback (and link-local, which needs a scope): every interface's
    (psutil), and the one the default route uses (a UDP socket "connected" to 10.255.255.255 sends nothing but
    gets a source address). Empty on a machine with loopback only."""
    found: set[str] = set()
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6) and _routable(a.address):
                    found.add(a.address.split("%", 1)[0])
    except ImportError:
        pass
    for family, target in ((socket.AF_INET, ("10.255.255.255", 1)), (socket.AF_INET6, ("fd00::ffff", 1, 0, 0))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(target)
                ip = s.getsockname()[0]
        except OSError:
            continue
        if _routable(ip):
            found.add(ip)
    return sorted(found, key=lambda ip: (":" in ip, ip))  # IPv4 first


def knock(ip: str, port: int, timeout: float = 2.0) -> str:
    """``"accepted"`` (the door is open to whoever reaches ``ip``), ``"refused"`` (ECONNREFUSED: nothing listens on
    ``ip:port``), ``"timeout"`` or ``"error: ..."`` (unreachable for another reason: a firewall, no route)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect((ip, port))
        except ConnectionRefusedError:
            return "refused"
        except socket.timeout:
            return "timeout"
        except OSError as err:
            return "refused" if err.errno == errno.ECONNREFUSED else f"error: {err}"
        return "accepted"


def knock_all(ports, addresses=None, timeout: float = 2.0) -> dict[str, str]:
    """:func:`knock` on every port at every routable address: ``{"ip:port": outcome}``."""
    addresses = routable_addresses() if addresses is None else addresses
    return {f"{ip}:{port}": knock(ip, port, timeout) for ip in addresses for port in sorted(set(ports))}


def opened(outcomes: dict[str, str]) -> list[str]:
    """The knocks that were let in."""
    return sorted(k for k, v in outcomes.items() if v == "accepted")


def listening(pids) -> list[tuple[str, int, str]]:
    """``(ip, port, process name)`` of every listening TCP socket of ``pids`` (``ray::...`` workers by their title)."""
    import psutil

    out = set()
    for c in psutil.net_connections("inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                p = psutil.Process(c.pid)
                cmd = p.cmdline()
                name = cmd[0] if cmd and cmd[0].startswith("ray::") else p.name()
            except psutil.Error:
                name = "?"
            out.add((c.laddr.ip, c.laddr.port, name))
    return sorted(out)
