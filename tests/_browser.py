"""A small headless-Chromium driver over the DevTools protocol, for the viewer's tests.

Starts Debian's ``/usr/bin/chromium`` headless with a throw-away profile and
``--remote-debugging-port=0``, reads the port it chose from the profile's
``DevToolsActivePort`` file, and talks to one page over the ``websockets`` sync
client: navigate and wait for the load event, evaluate JavaScript, read the DOM
(frames included), and capture screenshots. :meth:`Browser.close` asks the
browser to exit, then kills its process group by the pid it started, and
removes the profile folder.
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM = Path("/usr/bin/chromium")


class BrowserError(Exception):
    """The browser did not start, or a DevTools command failed."""


class Browser:
    def __init__(self, executable: Path = CHROMIUM, *, width: int = 1200, height: int = 900,
                 timeout: float = 30.0) -> None:
        self.width, self.height = width, height
        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="hk-chromium-"))
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        #: DevTools sessions of the page's out-of-process frames (a sandboxed frame is one),
        #: by target id: {"session", "url"}.
        self.frames: dict[str, dict[str, str]] = {}
        self._log = open(self.profile / "chromium.log", "wb")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen(
            [str(executable), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-extensions",
             "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True)
        try:
            self.ws = self._connect()
            self.session = self._open_page()
        except BaseException:
            self.close()
            raise

    # -- starting

    def _connect(self) -> ClientConnection:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode}: "
                                   f"{self._log_tail()}")
            try:
                port, path = active.read_text().split("\n")[:2]
            except (FileNotFoundError, ValueError):
                time.sleep(0.05)
                continue
            if port.strip() and path.strip():
                # Never through a proxy from the environment (websockets 15 added `proxy`).
                direct = {"proxy": None} if "proxy" in inspect.signature(connect).parameters \
                    else {}
                # Entered as a context manager, as websockets 17 wants; closed in close().
                return connect(f"ws://127.0.0.1:{port.strip()}{path.strip()}",
                               max_size=64 * 1024 * 1024, open_timeout=self.timeout,
                               **direct).__enter__()
            time.sleep(0.05)
        raise BrowserError(f"chromium wrote no DevToolsActivePort in {self.timeout} s")

    def _open_page(self) -> str:
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=None)
        attached = self.call("Target.attachToTarget",
                             {"targetId": target["targetId"], "flatten": True}, session=None)
        session: str = attached["sessionId"]
        self.session = session
        self.call("Page.enable")
        self.call("Runtime.enable")
        # Frames in another process (sandboxed srcdoc frames are) are targets of their own.
        self.call("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False,
                                           "flatten": True})
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                   "mobile": False})
        return session

    def _log_tail(self) -> str:
        try:
            return (self.profile / "chromium.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    # -- the protocol

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None | bool = True) -> dict[str, Any]:
        """Send one DevTools command (to the page unless ``session`` is None) and return its
        result; events that arrive meanwhile are kept for :meth:`wait_event`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session is True:
            message["sessionId"] = self.session
        elif isinstance(session, str):
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self._events.append(reply)

    def _receive(self, deadline: float) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrowserError("no answer from chromium in time")
        try:
            raw = self.ws.recv(timeout=left)
        except TimeoutError:
            raise BrowserError("no answer from chromium in time") from None
        data: dict[str, Any] = json.loads(raw)
        params = data.get("params", {})
        if data.get("method") == "Target.attachedToTarget":
            info = params["targetInfo"]
            self.frames[info["targetId"]] = {"session": params["sessionId"],
                                             "url": info.get("url", "")}
        elif data.get("method") == "Target.detachedFromTarget":
            self.frames.pop(params.get("targetId", ""), None)
        return data

    def wait_event(self, method: str, timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method:
                    del self._events[i]
                    return event
            self._events.append(self._receive(deadline))
            self._events = [e for e in self._events if "method" in e]

    # -- what tests use

    def goto(self, url: str) -> None:
        """Navigate and wait for the page's load event (frames and images included)."""
        self._events = [e for e in self._events if e["method"] != "Page.loadEventFired"]
        self.frames.clear()
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"navigation to {url} failed: {result['errorText']}")
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def document(self, session: str | None = None) -> dict[str, Any]:
        """The whole DOM of the page, or of the frame target ``session``, same-process frame
        documents included (``pierce``). Reading the DOM runs no script in the page."""
        tree: dict[str, Any] = self.call("DOM.getDocument", {"depth": -1, "pierce": True},
                                         session=session or True)
        root: dict[str, Any] = tree["root"]
        return root

    def frame_documents(self) -> list[dict[str, Any]]:
        """The DOM of every out-of-process frame of the page (sandboxed frames are)."""
        return [self.document(f["session"]) for f in list(self.frames.values())]

    def screenshot(self, path: str | os.PathLike[str]) -> None:
        """A PNG of the whole page (not just the viewport) at ``path``."""
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": 200, "deviceScaleFactor": 1, "mobile": False})
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)") or 0)
        height = max(200, min(height, 3000))
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": height, "deviceScaleFactor": 1,
                   "mobile": False})
        try:
            shot = self.call("Page.captureScreenshot", {"format": "png"})
        finally:
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                       "mobile": False})
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    # -- ending

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                self.call("Browser.close", session=None)
            except Exception:
                pass
            ws.close()
            self.ws = None  # type: ignore[assignment]
        if self.proc.poll() is None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        # The browser's helpers (zygote, renderers) share its process group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def find_nodes(node: dict[str, Any], name: str, attr: tuple[str, str] | None = None
               ) -> list[dict[str, Any]]:
    """Every element of a :meth:`Browser.document` tree named ``name`` (lower case), with
    attribute ``attr`` = (key, value) when given; frame documents are searched too."""
    found = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.get("localName") == name:
            attrs = n.get("attributes", [])
            pairs = dict(zip(attrs[::2], attrs[1::2], strict=True))
            if attr is None or pairs.get(attr[0]) == attr[1]:
                found.append(n)
        stack.extend(n.get("children", []))
        if "contentDocument" in n:
            stack.append(n["contentDocument"])
        stack.extend(n.get("shadowRoots", []))
    return found


def text_of(node: dict[str, Any]) -> str:
    """The text under a :meth:`Browser.document` node."""
    if node.get("nodeType") == 3:
        return str(node.get("nodeValue", ""))
    return "".join(text_of(c) for c in node.get("children", []))
