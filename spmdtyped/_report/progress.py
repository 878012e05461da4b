"""The report's progress display: one line per phase on stderr (trace, walk, lower, compile,
parse HLO, match, flags), with its count and its time.

`Progress(None)` is on when stderr is a terminal; on a terminal the running phase is shown
first (`... compile`) and overwritten (`\\r`) by its finished line; elsewhere only finished
lines are written. Off, it writes nothing. Plain text, no dependency.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

#: the phases of one report, in order (a report without the compiled program skips the middle)
PHASES = ("trace", "walk", "lower", "compile", "parse HLO", "match", "flags")


class Progress:
    """Writes the phases of one `st.report` to `stream` (default: stderr)."""

    def __init__(self, on: bool | None, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.on = tty if on is None else bool(on)
        self.tty = tty
        self.start = time.perf_counter()

    @contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[list[str]]:
        """Time one phase; the body may append the count it found (`note.append("12 ops")`)."""
        note: list[str] = []
        if not self.on:
            yield note
            return
        k = PHASES.index(name) + 1 if name in PHASES else 0
        head = f"st.report [{k}/{len(PHASES)}] {name}"
        if self.tty:
            self.stream.write(f"\r{head} {detail}...".rstrip())
            self.stream.flush()
        t = time.perf_counter()
        yield note
        text = ", ".join(x for x in (detail, *note) if x)
        line = f"{head}: {text} ({time.perf_counter() - t:.2f} s)" if text else \
            f"{head} ({time.perf_counter() - t:.2f} s)"
        self.stream.write(("\r\033[K" if self.tty else "") + line + "\n")
        self.stream.flush()

    def done(self, summary: str) -> None:
        if self.on:
            self.stream.write(f"st.report: {summary} in {time.perf_counter() - self.start:.2f} s\n")
            self.stream.flush()
