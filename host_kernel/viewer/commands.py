"""The ``host-kernel view`` subcommand: serve a record's read-only viewer on loopback.

Owns its arguments, what it prints, when it opens a browser, and how Ctrl-C
ends it (exit 0, quietly). The viewer itself is :mod:`host_kernel.viewer.app`.
"""

from __future__ import annotations

import argparse
import html
import os
import shutil
import sys
import tempfile
import webbrowser
from pathlib import Path

from ..cli import EXIT_OK, Command, UsageError, add_record_arguments, record_argument

__all__ = ["COMMANDS"]


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("a port is 0 (any free port) to 65535")
    return port


def _view_arguments(parser: argparse.ArgumentParser) -> None:
    add_record_arguments(parser, positional=True)
    parser.add_argument("--blobs", metavar="URL", default=None,
                        help="with --ledger: where its artifacts' bytes are (an fsspec URL or "
                             "a path; default: the store each session recorded)")
    parser.add_argument("--port", metavar="N", type=_port, default=0,
                        help="the port on 127.0.0.1 to serve on (default: a free one)")
    parser.add_argument("--no-browser", action="store_true",
                        help="print the URL only; do not open a web browser")


def _browser_available() -> bool:
    """Whether opening a URL would show a graphical browser rather than nothing, or take
    over this terminal with a text browser."""
    if os.environ.get("BROWSER"):
        return True
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY")
                                                 or os.environ.get("WAYLAND_DISPLAY")):
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def _view_run(args: argparse.Namespace) -> int:
    from .app import ViewerServer

    if args.blobs is not None and args.ledger is None:
        raise UsageError("--blobs goes with --ledger: a record folder holds its own blobs")
    record = record_argument(args)
    try:
        server = ViewerServer(record, port=args.port, blobs=args.blobs)
    except OSError as exc:
        raise UsageError(f"cannot listen on 127.0.0.1:{args.port}: "
                         f"{exc.strerror or exc}") from None
    out = sys.stdout
    out.write(f"host-kernel view: serving {record} at {server.url}\n")
    out.write("host-kernel view: press Ctrl-C to stop it\n")
    out.flush()
    opener: Path | None = None
    # Ctrl-C stops the viewer cleanly from the moment its URL is printed: while the
    # browser starts too (a BROWSER command runs to its end before serving begins).
    try:
        if not args.no_browser and _browser_available():
            opener = _opener(server.url)
            try:
                webbrowser.open(opener.as_uri())
            except webbrowser.Error:
                pass  # the URL is printed; that is enough
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if opener is not None:
            shutil.rmtree(opener.parent, ignore_errors=True)
    return EXIT_OK


def _opener(url: str) -> Path:
    """A page only this user can read that sends the browser on to ``url``.

    The browser is started with this file's path rather than the URL: a command
    line is readable by every local user (``/proc/PID/cmdline``), and the URL
    carries the viewer's token. The file is removed when the viewer stops.
    """
    folder = Path(tempfile.mkdtemp(prefix="hk-view-"))  # mode 0700
    page = folder / "open.html"
    target = html.escape(url, quote=True)
    fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f'<!doctype html><meta charset="utf-8">'
                f'<meta http-equiv="refresh" content="0;url={target}">'
                f'<title>host-kernel view</title><a href="{target}">open the record viewer</a>\n')
    return page


VIEW = Command(
    name="view",
    help="serve a read-only web viewer of a record on 127.0.0.1",
    description=(
        "Serve RECORD (a record folder, or a workspace whose record is found) as web pages on "
        "127.0.0.1 only: sessions, each session's cells with their outputs, receipts, "
        "artifacts with their lineage graph and downloads, and verdicts. Every request must "
        "carry the random token in the printed URL (a cookie after the first visit) and "
        "re-verifies the record; a record that fails its checks is shown as a red banner "
        "and nothing else. Only GET and HEAD; the record is never written. Runs until "
        "Ctrl-C (exit 0). Exit 1 when there is no record, 2 when the port cannot be used."),
    add_arguments=_view_arguments,
    run=_view_run,
)

COMMANDS: list[Command] = [VIEW]
