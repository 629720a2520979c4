"""A live progress line for a phase of known length (the warm start's SFT steps, its evaluation, training steps).

On a terminal the line is rewritten in place; elsewhere (a log file, CI) a line is printed at most every
``every_s`` seconds and once at the end, so that logs stay readable. The rate and the ETA count from the first
update, not from the start: a phase's start-up (process start, imports, model load) is not a step. The lowest
layer of the package: it imports nothing of ours.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TextIO


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _field(name: str, value: Any) -> str:
    return f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"


class Progress:
    """``label  done/total [pct%] fields  rate  ETA``; :meth:`update` as work is done, :meth:`close` at the end.
    ``total`` 0: the length is unknown (no share, no ETA)."""

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "step",
        stream: Optional[TextIO] = None,
        every_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        live: Optional[bool] = None,
    ):
        self.label, self.total, self.unit = label, max(int(total), 0), unit
        self.stream = stream if stream is not None else sys.stderr
        self.every_s, self.clock = every_s, clock
        isatty = getattr(self.stream, "isatty", None)
        self.live = bool(isatty and isatty()) if live is None else live
        self.start = clock()
        self.first: Optional[tuple[float, int]] = None  # (time, done) of the first update
        self.done, self.fields = 0, {}
        self.last_print: Optional[float] = None
        self.printed: Optional[tuple[int, dict]] = None  # (done, fields) of the last line printed off a terminal
        self.closed = False

    def line(self) -> str:
        """The current line (no newline)."""
        if self.total > 0:
            parts = [f"{self.label} {self.done}/{self.total} {self.unit}s [{100 * self.done // self.total:3d}%]"]
        else:  # length unknown: no share, no ETA
            parts = [f"{self.label} {self.done} {self.unit}s"]
        parts += [_field(k, v) for k, v in self.fields.items() if v is not None]
        now = self.clock()
        if self.first is not None and self.done > self.first[1] and now > self.first[0]:
            per = (now - self.first[0]) / (self.done - self.first[1])
            parts.append(f"{per:.2f} s/{self.unit}" if per < 100 else f"{format_seconds(per)}/{self.unit}")
            if 0 < self.total and self.done < self.total:
                parts.append(f"ETA {format_seconds(per * (self.total - self.done))}")
        parts.append(f"elapsed {format_seconds(now - self.start)}")
        return "  ".join(parts)

    def update(self, done: int, **fields: Any) -> None:
        """``done`` units finished so far (monotonic), with the phase's headline figures (e.g. ``loss=0.51``)."""
        now = self.clock()
        if self.first is None:
            self.first = (now, int(done))
        self.done = max(self.done, min(int(done), self.total) if self.total > 0 else int(done))
        self.fields.update({k: v for k, v in fields.items() if v is not None})
        if self.live:
            self._write("\r" + self.line() + "\x1b[K")
        elif self.last_print is None or now - self.last_print >= self.every_s:
            self._write(self.line() + "\n")
            self.last_print, self.printed = now, (self.done, dict(self.fields))

    def close(self, **fields: Any) -> None:
        """The final line, always printed (once)."""
        if self.closed:
            return
        self.closed = True
        self.fields.update({k: v for k, v in fields.items() if v is not None})
        if self.live:
            self._write("\r" + self.line() + "\x1b[K\n")
        elif self.printed != (self.done, self.fields):  # not the line just printed again
            self._write(self.line() + "\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


class JsonlFollower:
    """The records appended to a JSON-lines file since the last call (verl's file logger writes one line per step,
    unbuffered, to ``VERL_FILE_LOGGER_PATH``); a line not yet complete is left for the next call, a line that is
    not a JSON object is skipped. A file that shrank was truncated: it is read again from its start."""

    def __init__(self, path: str | Path):
        self.path, self.offset = Path(path), 0

    def new_records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                if f.seek(0, 2) < self.offset:
                    self.offset = 0
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out
