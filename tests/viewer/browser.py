"""A real headless browser for the viewer's page: Debian's ``chromium`` (``apt-get install chromium``; ``.ci/run``
installs it when it is missing). Without it the browser tests are skipped, except under CI (env ``CI`` set), where
they FAIL, so that nobody takes a green run for a page tested in a browser."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The browser's path; skips the test (fails it under CI) when there is none."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    why = f"no headless browser on PATH ({', '.join(BROWSERS)}): apt-get install -y chromium"
    if os.environ.get("CI"):
        pytest.fail(f"the viewer's browser tests cannot run under CI: {why}", pytrace=False)
    pytest.skip(f"{why} (under CI, with env CI set, this is a failure)")


def dump_dom(page: Path, profile: Path, timeout: float = 120) -> str:
    """The DOM of ``page`` after its scripts ran, as Chromium serialises it (``--dump-dom``), loaded from the file
    with the network off (``--proxy-server`` to a closed port: any request the page made would fail)."""
    result = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
         "--proxy-server=127.0.0.1:9", "--dump-dom", Path(page).resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0 and "<html" in result.stdout, result.stderr[-3000:]
    return result.stdout


class Nodes(HTMLParser):
    """Every ``details.node`` of a DOM: ``data-traj`` -> the ``data-traj`` of the node it sits in (None at the top),
    and ``data-agent`` of each; plus the attributes of ``<html>`` and ``<body>`` and the ``#status`` text."""

    def __init__(self):
        super().__init__()
        self.parent: dict[str, str | None] = {}
        self.agent: dict[str, str] = {}
        self.root: dict[str, str] = {}
        self.body: dict[str, str] = {}
        self.status = ""
        self._stack: list[str | None] = []  # per open <details>: its traj (None for other details)
        self._in_status = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.root = a
        elif tag == "body":
            self.body = a
        elif tag == "span" and a.get("id") == "status":
            self._in_status = True
        elif tag == "details":
            traj = a.get("data-traj") if "node" in (a.get("class") or "").split() else None
            if traj is not None:
                self.parent[traj] = next((t for t in reversed(self._stack) if t is not None), None)
                self.agent[traj] = a.get("data-agent", "")
            self._stack.append(traj)

    def handle_endtag(self, tag):
        if tag == "details" and self._stack:
            self._stack.pop()
        elif tag == "span":
            self._in_status = False

    def handle_data(self, data):
        if self._in_status:
            self.status += data


def parse(dom: str) -> Nodes:
    nodes = Nodes()
    nodes.feed(dom)
    return nodes
