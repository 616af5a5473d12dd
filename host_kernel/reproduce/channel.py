"""The Host's end of a reproduction's output: three pipes read as the run goes, into memory.

Owns :class:`Capture`. A run's standard input is the write end of the report
channel (``boot.py`` moves it to a private descriptor and puts ``/dev/null`` in
its place before anything else runs), and its standard output and error are
pipes too; one thread of the Host reads all three while the run goes, so:

- what the run reported cannot be unwritten: a line, once read, is the Host's
  (there is no file for test code to truncate, rewrite or replace);
- memory is bounded: at most :data:`REPORT_LIMIT` bytes of report lines, and
  of each output stream its last :data:`TAIL` bytes plus every line that looks
  like the runner's final summary (pytest's ``3 passed, 1 failed in 0.12s``,
  unittest's ``Ran 4 tests in 0.01s`` and ``OK``/``FAILED (…)``), counted as
  they pass so one printed early cannot scroll out of sight.

It reads and keeps; what the lines mean is ``outcome.py``'s job.
"""

from __future__ import annotations

import os
import re
import selectors
import threading
import time
from dataclasses import dataclass, field

__all__ = ["REPORT_LIMIT", "Capture", "Captured"]

#: The most report bytes kept; a run that says more is refused (``outcome.py``).
REPORT_LIMIT = 64 * 1024 * 1024
#: How much of each output stream is kept (the verdict shows the last 3000 characters).
TAIL = 64 * 1024
#: A longer output line is never a summary line, and is not scanned.
LINE_LIMIT = 4096
#: Summary-looking lines kept per stream (every one is counted).
MATCHES_KEPT = 20
#: Seconds the reader waits on its pipes between looks at whether it was asked to stop.
POLL = 0.2

ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")
#: The runners' summary lines, by kind: pytest's last line (``-q``, or framed in ``=``),
#: unittest's count and its verdict.
SUMMARIES = {
    "pytest": re.compile(rb"^(?:=+ )?(?:\d+ [a-z ]+?(?:, \d+ [a-z ]+?)*|no tests ran) "
                         rb"in \d+(?:\.\d+)?s(?: \([0-9:]+\))?(?: =+)?$"),
    "ran": re.compile(rb"^Ran \d+ tests? in \d+(?:\.\d+)?s$"),
    "status": re.compile(rb"^(?:OK|FAILED|NO TESTS RAN)(?: \([a-z ]+=\d+(?:, [a-z ]+=\d+)*\))?$"),
}


@dataclass
class Stream:
    """One output stream's tail and its summary-looking lines."""

    tail: bytearray = field(default_factory=bytearray)
    #: The last summary-looking lines seen: (kind, the line), in order.
    matches: list[tuple[str, str]] = field(default_factory=list)
    #: How many of each kind were seen in all.
    counts: dict[str, int] = field(default_factory=dict)
    _partial: bytearray = field(default_factory=bytearray)
    _long: bool = False

    def feed(self, data: bytes) -> None:
        self.tail += data
        if len(self.tail) > TAIL:
            del self.tail[:len(self.tail) - TAIL]
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._line(data[start:end])
            start = end + 1
        rest = data[start:]
        if len(self._partial) + len(rest) > LINE_LIMIT:
            self._long = True
            self._partial.clear()
        elif not self._long:
            self._partial += rest

    def _line(self, piece: bytes) -> None:
        long = self._long or len(self._partial) + len(piece) > LINE_LIMIT
        line = b"" if long else bytes(self._partial + piece)
        self._partial.clear()
        self._long = False
        text = ANSI.sub(b"", line).strip()
        if long or not text or not (text[0:1].isdigit() or text[0:1] in b"=nROFN"):
            return
        for kind, pattern in SUMMARIES.items():
            if pattern.match(text):
                self.counts[kind] = self.counts.get(kind, 0) + 1
                self.matches.append((kind, text.decode("utf-8", "replace")))
                del self.matches[:-MATCHES_KEPT]
                break

    def end(self) -> None:
        if self._partial:
            self._line(b"")


@dataclass
class Captured:
    """What the Host read from one run."""

    #: Every complete line of the report channel, in order.
    lines: list[bytes]
    #: Bytes after the last newline (a line cut off), if any.
    unterminated: bytes
    #: More than :data:`REPORT_LIMIT` bytes came: the rest was read and dropped.
    overflow: bool
    out: Stream
    err: Stream

    def tail(self, size: int) -> str:
        text = bytes(self.out.tail).decode("utf-8", "replace") + \
            bytes(self.err.tail).decode("utf-8", "replace")
        return text[-size:]


class Capture:
    """The pipes of one run: give :meth:`child_fds` to the process, then :meth:`start`;
    :meth:`finish` once it has exited (and been killed with everything it started)."""

    def __init__(self, limit: int = REPORT_LIMIT) -> None:
        self._limit = limit
        self._fds = [os.pipe(), os.pipe(), os.pipe()]  # report, out, err (close-on-exec)
        self._lines: list[bytes] = []
        self._partial = bytearray()
        self._size = 0
        self._overflow = False
        self._out, self._err = Stream(), Stream()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def child_fds(self) -> tuple[int, int, int]:
        """(stdin: the report channel's write end, stdout, stderr) for the run."""
        return self._fds[0][1], self._fds[1][1], self._fds[2][1]

    def start(self) -> None:
        """The run has its ends: close the Host's copies and read as it goes."""
        for _, w in self._fds:
            os.close(w)
        self._thread = threading.Thread(target=self._read, name="reproduction-capture",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Release every descriptor (a run that never started)."""
        for r, w in self._fds:
            for fd in (r, w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _read(self) -> None:
        selector = selectors.DefaultSelector()
        sinks = {self._fds[0][0]: self._report, self._fds[1][0]: self._out.feed,
                 self._fds[2][0]: self._err.feed}
        for fd in sinks:
            selector.register(fd, selectors.EVENT_READ)
        drain_until: float | None = None
        try:
            while sinks:
                ready = selector.select(POLL)
                if self._stop.is_set():
                    # Asked to stop: take what is there, for a second at most (a process
                    # that escaped could write for ever), and go.
                    drain_until = drain_until or time.monotonic() + 1.0
                    if not ready or time.monotonic() > drain_until:
                        break
                for key, _ in ready:
                    fd = int(key.fd)
                    try:
                        data = os.read(fd, 1 << 16)
                    except OSError:
                        data = b""
                    if data:
                        sinks[fd](data)
                    else:
                        selector.unregister(fd)
                        del sinks[fd]
        finally:
            selector.close()
            for r, _ in self._fds:
                os.close(r)

    def _report(self, data: bytes) -> None:
        if self._overflow:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._overflow = True
            self._partial.clear()
            return
        self._partial += data
        if b"\n" in data:
            *complete, rest = bytes(self._partial).split(b"\n")
            self._lines += complete
            self._partial = bytearray(rest)

    def finish(self, grace: float = 5.0) -> Captured:
        """Everything read; waits up to ``grace`` seconds for the pipes to close (a process
        that escaped the run's session may hold them), then stops reading."""
        if self._thread is not None:
            self._thread.join(grace)
            if self._thread.is_alive():
                self._stop.set()
                self._thread.join()
        self._out.end()
        self._err.end()
        return Captured(self._lines, bytes(self._partial), self._overflow, self._out, self._err)
