"""The ``host`` object inside the kernel: a thin client of the Host.

Runs in the untrusted kernel. Every method is one HTTP call over the Host's
Unix socket carrying this generation's token; the Host does the work and keeps
the record. Nothing returned here is evidence: a Receipt or Artifact object in
the kernel is a copy for display, and the Host verifies against its own record.
"""

from __future__ import annotations

import base64
import builtins
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from io import BufferedReader
from typing import Any

from .._errors import BadArguments, HostCallError, SubmissionRefused, error_for_code
from .._models import Artifact, FileRecord, Receipt, Verdict

__all__ = ["HostClient", "Skills", "Subtask", "SubtaskResult"]


#: Seconds after which a kept-alive connection is not used again but replaced: a third
#: of the Host's idle timeout (host/_server.py, IDLE_TIMEOUT), so the Host never closes
#: a connection as the next call goes out on it.
REUSE_FOR = 20.0
#: Longest line of a reply's status and headers, and most header lines, read.
_LINE_LIMIT = 65536
_MAX_HEADERS = 100
#: Bodies up to this size go out in the same write as the request's headers.
_JOIN_BODY = 1 << 20


class _AnswerCut(Exception):
    """The Host's answer broke the HTTP/1.1 framing it promised (or ended early)."""


class _Connection:
    """One kept-alive HTTP/1.1 connection to the Host's call socket (a Unix-domain socket).

    A lean client of the standard library's sockets: a request goes out in one write
    (request line, headers and body), and the reply, a chunked stream of JSON lines, is
    read line by line as it comes, so a call costs each side one wake-up per message and
    the first call imports no HTTP stack.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self.sock: socket.socket | None = None
        self.used = 0.0

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10.0)
            sock.connect(self._path)
            sock.settimeout(None)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        return sock

    def close(self) -> None:
        """Hang up now (a reader still open on the socket does not keep it up)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def fresh(self) -> None:
        """Before a call: drop the kept-alive connection if it sat idle too long, or the
        Host has closed it (it is readable: the end of the stream), so the call goes out
        on a connection the Host is reading. A call is never sent twice."""
        sock = self.sock
        now = time.monotonic()
        if sock is not None and (now - self.used > REUSE_FOR or _readable(sock)):
            self.close()
        self.used = now

    def send(self, head: bytes, body: bytes) -> None:
        """The request, in one write when the body is small enough to join its headers."""
        sock = self.sock if self.sock is not None else self.connect()
        if len(body) <= _JOIN_BODY:
            sock.sendall(head + body)
        else:
            sock.sendall(head)
            sock.sendall(body)

    def lines(self) -> Generator[bytes, None, None]:
        """The reply's body, one line at a time, as each arrives. Afterwards the connection
        is ready for the next call, or closed when the Host said it closes it. (A reader
        per reply, as the standard library's client has: nothing one reply's reader took
        is ever read as the next reply.)"""
        if self.sock is None:
            raise _AnswerCut("no connection")
        with self.sock.makefile("rb") as rfile:
            closes = yield from self._reply(rfile)
        if closes:
            self.close()

    def _reply(self, rfile: BufferedReader) -> Generator[bytes, None, bool]:
        """The lines of one reply; returns whether the Host closes the connection after it."""
        status = self._line(rfile)
        if not status.startswith(b"HTTP/1."):
            raise _AnswerCut(f"not an HTTP/1.x reply: {status[:80]!r}")
        closes = status.startswith(b"HTTP/1.0")
        chunked, length = False, -1
        for _ in range(_MAX_HEADERS + 1):
            line = self._line(rfile)
            if line in (b"\r\n", b"\n"):
                break
            key, _, value = line.partition(b":")
            key, value = key.strip().lower(), value.strip().lower()
            if key == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif key == b"content-length" and value.isdigit():
                length = int(value)
            elif key == b"connection":
                closes = value == b"close"
        else:
            raise _AnswerCut(f"more than {_MAX_HEADERS} header lines")
        if chunked:
            yield from _split(_chunks(rfile, self._line))
        elif length >= 0:
            yield from _split(iter([_exactly(rfile, length)]))
        else:
            closes = True
            yield from _split(iter(lambda: rfile.read1(1 << 16), b""))
        return closes

    @staticmethod
    def _line(rfile: BufferedReader) -> bytes:
        line = rfile.readline(_LINE_LIMIT + 1)
        if not line:
            raise _AnswerCut("the Host closed the connection before its answer ended")
        if len(line) > _LINE_LIMIT:
            raise _AnswerCut("a line of the answer's head is too long")
        return line


def _chunks(rfile: BufferedReader, line: Callable[[BufferedReader], bytes]) -> Iterator[bytes]:
    """The data of a chunked body, chunk by chunk, up to and past its last (empty) chunk."""
    while True:
        size_line = line(rfile).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise _AnswerCut(f"a chunk size that is not a number: {size_line[:40]!r}") from None
        if size == 0:
            while line(rfile) not in (b"\r\n", b"\n"):  # trailers, if any
                pass
            return
        yield _exactly(rfile, size)
        if line(rfile) not in (b"\r\n", b"\n"):
            raise _AnswerCut("a chunk did not end where its size said")


def _exactly(rfile: BufferedReader, size: int) -> bytes:
    data = rfile.read(size)
    if len(data) != size:
        raise _AnswerCut("the Host closed the connection before its answer ended")
    return data


def _split(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Whole lines out of pieces of a body (a line may span pieces, or a piece hold many)."""
    rest = b""
    for piece in pieces:
        rest += piece
        *whole, rest = rest.split(b"\n")
        yield from whole
    if rest:
        yield rest


def _readable(sock: socket.socket) -> bool:
    """Whether the Host has sent something unasked on a kept-alive connection: the end of
    the stream (it closed it), or bytes no call asked for; either way it is not reused.
    (A peek, not select(): a kernel may hold more files than select() can name.)"""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


class HostClient:
    """Talks to the Host. Created by the kernel extension as ``host``."""

    def __init__(self, socket_path: str, token: str, generation: int) -> None:
        self._socket_path = socket_path
        self._token = token
        self._generation = generation
        self._http: Any = None  # per thread, the connection to the Host, made on first use
        self._capture: Any = None  # the extension's Capture, for reads so far in this cell

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> HostClient | None:
        try:
            return cls(env["HOST_KERNEL_SOCKET"], env["HOST_KERNEL_TOKEN"],
                       int(env["HOST_KERNEL_GENERATION"]))
        except (KeyError, ValueError):
            return None

    def __repr__(self) -> str:
        return f"<host: Host client, generation {self._generation}>"

    # -- the wire

    def _connection(self) -> _Connection:
        """This thread's connection (calls from several threads run side by side)."""
        if self._http is None:
            self._http = threading.local()
        conn: _Connection | None = getattr(self._http, "conn", None)
        if conn is None:
            conn = self._http.conn = _Connection(self._socket_path)
        return conn

    def _call(self, name: str, /, *, _raw: bytes | None = None, **args: Any) -> Any:
        """One call. ``_raw``: a file's bytes sent as the body itself (write_file), its
        other arguments in a header, so neither side ever holds them as JSON."""
        if not name.isprintable() or " " in name:
            raise HostCallError(f"the call {name!r} did not reach the Host: a call's name is "
                                f"one word of printable characters")
        if _raw is None:
            body = json.dumps(args, ensure_ascii=False).encode("utf-8")
            kind = b"application/json"
            extra = b""
        else:
            body = _raw
            kind = b"application/octet-stream"
            # ASCII (json.dumps' default): fits a header
            extra = b"Host-Kernel-Args: %s\r\n" % json.dumps(args).encode("ascii")
        head = (b"POST /call/%s HTTP/1.1\r\nHost: host\r\nAuthorization: Bearer %s\r\n"
                b"Content-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
                % (name.encode("utf-8", "surrogateescape"), self._token.encode("utf-8"), kind,
                   len(body), extra))
        result: Any = None
        error: dict[str, str] | None = None
        conn = self._connection()
        conn.fresh()
        cut_short = False
        reply: Generator[bytes, None, None] | None = None
        try:
            # One kept-alive connection: the Host answers each call in full (a chunked
            # stream of lines) before the next is sent. A call is never sent twice.
            try:
                conn.send(head, body)
            except (BrokenPipeError, ConnectionResetError):
                # The Host refuses a body over its limit without reading it, answers and
                # closes: the answer is already waiting, so read it (if the Host is gone
                # instead, reading fails below and says so), then drop the connection.
                cut_short = True
            reply = conn.lines()
            for line in reply:
                if not line.strip():
                    continue
                msg = json.loads(line)
                if "stream" in msg:
                    out = sys.stderr if msg["stream"] == "stderr" else sys.stdout
                    out.write(msg["text"])
                    out.flush()
                elif "result" in msg:
                    result = msg["result"]
                elif "error" in msg:
                    error = msg["error"]
        except (OSError, ValueError, _AnswerCut) as exc:
            conn.close()
            raise HostCallError(f"the call {name!r} did not reach the Host or its answer was "
                                f"cut short: {type(exc).__name__}: {exc}") from None
        except BaseException:
            # Interrupted (Ctrl-C) with the answer half read: never read its rest as the
            # next call's answer. The Host sees the connection close and stops streaming.
            conn.close()
            raise
        finally:
            if reply is not None:
                reply.close()
        if cut_short:
            conn.close()  # the Host closed its end; the next call opens a new connection
        if error is not None:
            raise error_for_code(error.get("type", ""), error.get("code", "call_failed"),
                                 error.get("message", ""))
        return result

    # -- where am I

    def ping(self) -> dict[str, Any]:
        """Ask the Host whether this cell's calls reach it; returns the cell id it sees."""
        return dict(self._call("ping"))

    @property
    def cell_id(self) -> str:
        """The Host-minted id of the running cell."""
        return str(self._call("whoami")["cell_id"])

    @property
    def generation(self) -> int:
        return int(self._call("whoami")["generation"])

    @property
    def mode(self) -> Any:
        from ..modes import TaskMode

        m = self._call("whoami")["mode"]
        return TaskMode(m["name"], bool(m["armed"]), tuple(m.get("signals", ())))

    @property
    def confinement(self) -> dict[str, Any]:
        """What the Host enforces on this kernel: ``{"status": "landlock" | "none", "abi",
        "network", "pid_namespace"}`` (the Host's word, from its record)."""
        return dict(self._call("whoami").get("confinement") or {"status": "none"})

    # -- files

    def write_file(self, path: str | os.PathLike[str], content: str | bytes) -> FileRecord:
        """Have the Host write ``content`` to ``path`` (workspace-relative), atomically."""
        if isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        elif isinstance(content, str):
            try:
                data = content.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise BadArguments("write_file: content holds characters that UTF-8 cannot "
                                   "encode (lone surrogates); pass bytes") from None
        else:
            raise BadArguments(f"write_file: content must be str or bytes, not "
                            f"{type(content).__name__}")
        return FileRecord.from_dict(self._call("write_file", _raw=data, path=_path_arg(path)))

    def edit_file(self, path: str | os.PathLike[str], old: str, new: str) -> FileRecord:
        """Replace the one occurrence of ``old`` with ``new``; refuses zero or several."""
        return FileRecord.from_dict(self._call("edit_file", path=_path_arg(path), old=old,
                                               new=new))

    def read_file(self, path: str | os.PathLike[str], *, binary: bool = False) -> Any:
        """The file's text (or bytes with ``binary=True``)."""
        result = self._call("read_file", path=_path_arg(path), binary=bool(binary))
        if binary:
            return base64.b64decode(result["content_b64"])
        return result["content"]

    # -- commands

    def bash(self, command: str, timeout: float | None = None) -> Receipt:
        """Have the Host run ``bash -c command`` here, streaming output; returns the receipt.

        A non-zero exit does not raise: read ``receipt.exit_status``.
        """
        if not isinstance(command, str):
            raise BadArguments(f"bash: command must be str, not {type(command).__name__}")
        return Receipt.from_dict(self._call("bash", command=command, timeout=timeout,
                                            cwd=os.getcwd(), env=dict(os.environ)))

    # -- artifacts

    def save_artifact(self, path: str | os.PathLike[str], filename: str | None = None) -> Artifact:
        """Copy a workspace file into the content-addressed store, with lineage."""
        access = None
        if self._capture is not None:
            try:
                access = self._capture.peek().to_dict()
            except Exception:  # lineage is best effort; the save must not fail for it
                access = None
        return Artifact.from_dict(self._call("save_artifact", path=_path_arg(path),
                                             filename=filename, access=access))

    def lineage(self, artifact_id: str) -> Any:
        """The artifact's upstream graph (bounded; ``truncated`` says when cut)."""
        from ..lineage.graph import Lineage

        return Lineage.from_dict(self._call("lineage", artifact_id=artifact_id))

    def slice(self, artifact_id: str) -> Any:
        """The smallest ordered set of this session's cells that makes the artifact, with
        the inputs it needs (a :class:`~host_kernel.lineage.slice.Slice`: ``to_script()``,
        ``to_notebook()``), computed by the Host from its record."""
        from ..lineage.slice import Slice

        return Slice.from_dict(self._call("slice", artifact_id=artifact_id))

    def load_artifact(self, artifact_id: str, path: str | None = None) -> str:
        """Materialise an artifact's bytes into the workspace; returns the path written."""
        return str(self._call("load_artifact", artifact_id=artifact_id, path=path)["path"])

    def artifacts(self) -> list[Artifact]:
        """This session's artifacts, oldest first."""
        return [Artifact.from_dict(a) for a in self._call("artifacts")]

    # -- skills

    @property
    def skills(self) -> Skills:
        """The skills catalog, as the agent's skill tools give it: ``list``, ``search``,
        ``get``."""
        return Skills(self)

    # -- sub-tasks

    def delegate(self, task: str, inputs: Any = (), mode: str | None = None, *,
                 folder: str | os.PathLike[str] | None = None,
                 timeout: float | None = None) -> Subtask:
        """Start a sub-task: a child agent session with its own Host, kernel and record.

        ``inputs`` are workspace files or folders, or artifact ids of this session (or
        of a sub-task it collected); the child works on copies of them, in a folder of
        its own that no cell can reach (``folder`` is refused: see docs/agent.md).
        ``timeout`` bounds the child's wall-clock time (seconds). Returns at once;
        collect it.
        """
        if isinstance(inputs, (str, os.PathLike)):
            inputs = [inputs]
        try:
            listed = [_path_arg(i) for i in inputs]
        except TypeError:
            raise BadArguments("delegate: inputs must be a list of paths or artifact ids") \
                from None
        return Subtask.from_dict(self._call(
            "delegate", task=task, inputs=listed, mode=mode,
            folder=None if folder is None else _path_arg(folder), timeout=timeout))

    def collect(self, subtask: Subtask | str, timeout: float | None = None) -> SubtaskResult:
        """Wait for a sub-task and return its result. A sub-task still running when
        ``timeout`` (seconds) ends is cut, and its result says so."""
        handle = subtask.handle if isinstance(subtask, Subtask) else subtask
        return SubtaskResult.from_dict(self._call("collect", handle=handle, timeout=timeout),
                                       self)

    # -- completion

    def submit_output(self, output: Any, completion_bullets: Any, *, task_status: Any = None,
                      output_schema: Any = None, source_files: Any = None,
                      entry_points: Any = None, architecture_summary: Any = None,
                      test_evidence: Any = None, intended_changes: Any = None,
                      regenerates: Any = None, rederive: Any = None) -> Verdict:
        """Ask the Host to verify and accept a completion.

        ``intended_changes`` (``codebase_change``): the baseline tests whose behaviour the
        change means to alter, ``[{"test": node id or file, "reason": why}]``; the Host
        runs every baseline test at its baseline bytes, and one that passed before and
        fails now is refused unless it is named here (a reviewer reads these first).

        ``regenerates`` (``reusable_pipeline``): ``[{"command": …, "artifacts": [ids]}]``,
        commands the Host runs in the reproduction sandbox on the declared tree and the
        recorded inputs; accepted only when each writes its artifacts' exact bytes.
        ``rederive=True`` (``analysis_run``): accepted only when the Host re-derives every
        artifact the output names from its slice, in a fresh confined kernel.

        Returns the Verdict when accepted; raises SubmissionRefused (carrying the
        Verdict, its message listing every failed check) when refused. Both are
        recorded by the Host.
        """
        args: dict[str, Any] = {
            "completion_bullets": completion_bullets, "task_status": task_status,
            "output_schema": output_schema, "source_files": source_files,
            "entry_points": entry_points, "architecture_summary": architecture_summary,
            "test_evidence": test_evidence,
        }
        for key, value in (("intended_changes", intended_changes),
                           ("regenerates", regenerates), ("rederive", rederive)):
            if value is not None:
                args[key] = value
        for key, value in list(args.items()):
            args[key] = _jsonable(value, key)
        try:
            json.dumps(output)
            args["output"] = output
        except (TypeError, ValueError, RecursionError) as exc:
            # Let the Host refuse (and record) it, rather than fail before it is seen.
            args["output"] = None
            args["output_error"] = f"{type(exc).__name__}: {exc}"[:300]
        verdict = Verdict.from_dict(self._call("submit_output", **args))
        if not verdict.accepted:
            raise SubmissionRefused(verdict.explain(), verdict)
        return verdict

    # -- reporting the audit hook's findings (used by the extension)

    def _report_access(self, access: dict[str, Any]) -> None:
        try:
            self._call("cell_access", access=access)
        except HostCallError:
            pass


def _jsonable(value: Any, key: str) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        raise BadArguments(f"submit_output: {key} must be JSON-serialisable "
                           f"(lists, dicts, strings, numbers)") from None
    return value


def _path_arg(path: Any) -> Any:
    return os.fspath(path) if isinstance(path, os.PathLike) else path


class Skills:
    """``host.skills``: the catalog of reviewed recipes (docs/agent.md, Skills)."""

    def __init__(self, client: HostClient) -> None:
        self._client = client

    def __repr__(self) -> str:
        return "<host.skills: list(collection=None, offset=0), search(query), get(name)>"

    def list(self, collection: str | None = None,  # noqa: A003 - the catalog's verb
             offset: int = 0) -> dict[str, Any]:
        """One page: ``items`` (name, summary, collection, tags), ``total``, ``next_offset``."""
        return dict(self._client._call("skills", op="list", collection=collection,
                                       offset=offset))

    def search(self, query: str | builtins.list[str]) -> builtins.list[dict[str, Any]]:
        """Skills sharing literal words with the query (or queries), best first, with bodies."""
        return list(self._client._call("skills", op="search", query=query))

    def get(self, name: str) -> dict[str, Any]:
        """One skill, with its ``body``."""
        return dict(self._client._call("skills", op="get", name=name))


@dataclass(frozen=True)
class Subtask:
    """A started sub-task: its handle, the folder it works in, its inputs."""

    handle: str
    folder: str
    inputs: tuple[dict[str, Any], ...] = ()
    state: str = "queued"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Subtask:
        return cls(str(data["handle"]), str(data["folder"]),
                   tuple(dict(i) for i in data.get("inputs", ())), str(data.get("state", "")))


@dataclass(frozen=True)
class SubtaskResult:
    """What a collected sub-task returned, as the Host recorded it.

    ``accepted`` is the child Host's verdict; ``output`` the accepted submission's output
    (None when none was accepted); ``artifacts`` the child's artifacts (id, filename,
    sha256, size), whose bytes the Host keeps: ``load(artifact_id, path=None)`` copies one
    into this workspace.
    """

    handle: str
    outcome: str
    accepted: bool
    output: Any = None
    artifacts: tuple[dict[str, Any], ...] = ()
    error: str | None = None
    session: str | None = None
    _client: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], client: Any = None) -> SubtaskResult:
        return cls(str(data["handle"]), str(data["outcome"]), bool(data["accepted"]),
                   data.get("output"), tuple(dict(a) for a in data.get("artifacts", ())),
                   data.get("error"), data.get("session"), client)

    def load(self, artifact_id: str, path: str | None = None) -> str:
        if self._client is None:
            raise BadArguments("this result is not attached to a Host")
        return str(self._client.load_artifact(artifact_id, path))
