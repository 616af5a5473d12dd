"""The record viewer's web application and the loopback server that runs it.

Owns the Starlette app (its routes, the token gate, the security headers, the
red banner of a refused record) and :class:`ViewerServer`, which serves it with
uvicorn on 127.0.0.1 only, in the foreground (``host-kernel view``) or in a
thread (:func:`serve_in_thread`, for tests and embedding).

Every request reads the record through :class:`~.reads.VerifiedReads`: the
projection :func:`~host_kernel.store.verified.open_verified` rebuilt from the
checked events, used only while every byte it was verified from is unchanged,
so a record tampered with while the viewer runs is refused on the next request;
the pages are read from that projection (:mod:`.sessions`, :mod:`.pages`,
:mod:`.verdicts`, :mod:`.preview`, :mod:`.graph`, and :mod:`.derivation` for
slices and re-derivations). Links carry the token when the request did
(:func:`link_maker`). Only GET and HEAD are served,
and nothing here writes the record. It does not decide what a page shows
(those modules do) nor how (the templates do).
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any, BinaryIO, Self
from urllib.parse import parse_qs, parse_qsl, urlencode

import uvicorn
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..lineage.svg import lineage_svg
from ..store.ledger import RecordRefused, SQLiteLedger
from ..store.verified import LedgerRecord
from . import derivation, graph, pages, sessions, verdicts
from .preview import IMAGE_TYPES, media_type
from .reads import VerifiedReads

__all__ = ["ViewerServer", "create_app", "serve_in_thread"]

HERE = Path(__file__).parent
STATIC = HERE / "static"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".svg": "image/svg+xml", ".png": "image/png", ".ico": "image/x-icon"}

#: The status of every page of a record that failed its checks (the banner, nothing else).
REFUSED_STATUS = 409

#: The one script a page runs is ours (static/viewer.js: it sizes output frames); record HTML
#: sits in sandboxed frames that run no script and inherit this policy, so nothing in them
#: can reach the network either. Forms are our GET search forms.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; frame-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
#: Added to an artifact image served inline: opened as a page of its own (an SVG), it is
#: a sandboxed document with no script.
IMAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost"})
#: The request state's key for the token its links carry.
LINK_TOKEN = "host_kernel_link_token"


# --------------------------------------------------------------------------- the gate


class TokenGate:
    """ASGI middleware in front of every route: GET and HEAD only (405 otherwise), a
    loopback Host header, and the viewer's token as ``?token=`` or as the cookie that the
    first visit with the token sets (403 otherwise). Adds the security headers to every
    response."""

    def __init__(self, app: ASGIApp, token: str,
                 on_close: Callable[[], None] | None = None) -> None:
        self.app = app
        self.token = token
        self._on_close = on_close

    def close(self) -> None:
        """Let go of what the app holds (the viewer's kept projection)."""
        if self._on_close is not None:
            self._on_close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no websockets, and no lifespan: uvicorn runs with lifespan off
        port = (scope.get("server") or ("", 0))[1]
        cookie_name = f"host_kernel_view_{port}"  # cookies ignore ports; viewers must not
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        from_query = (query.get("token") or [""])[0]
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except CookieError:  # a malformed Cookie header is no token
            jar = SimpleCookie()
        from_cookie = jar[cookie_name].value if cookie_name in jar else ""
        host = headers.get("host", "").rsplit(":", 1)[0].strip("[]").lower()

        response: Response | None = None
        if scope["method"] not in ("GET", "HEAD"):
            response = PlainTextResponse("the viewer is read-only: GET and HEAD only\n",
                                         status_code=405, headers={"Allow": "GET, HEAD"})
        elif host not in LOOPBACK_NAMES:
            response = PlainTextResponse("forbidden: the viewer answers on loopback only\n",
                                         status_code=403)
        elif not (_same(from_query, self.token) or _same(from_cookie, self.token)):
            response = PlainTextResponse(
                "forbidden: open the URL `host-kernel view` printed, with its ?token=\n",
                status_code=403)

        set_cookie = _same(from_query, self.token) and not _same(from_cookie, self.token)
        if response is None and _same(from_query, self.token):
            # Came with the token in its URL: its pages carry it in their links, so they
            # work where the cookie is not kept (another browser, a pasted link, curl).
            scope["state"] = {**scope.get("state", {}), LINK_TOKEN: self.token}

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(HEADERS)
                if set_cookie and response is None:
                    extra.append((b"set-cookie", f"{cookie_name}={self.token}; Path=/; "
                                  f"HttpOnly; SameSite=Strict".encode()))
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        if response is not None:
            await response(scope, receive, with_headers)
        else:
            await self.app(scope, receive, with_headers)


def _same(given: str, token: str) -> bool:
    return bool(given) and secrets.compare_digest(given.encode(), token.encode())


# --------------------------------------------------------------------------- pages


def link_maker(token: str | None) -> Callable[..., str]:
    """The function templates make every link with: ``u(path, **params)``, the path's own
    query and fragment kept, empty parameters dropped, and the token added when the
    request carried it in its URL."""

    def u(path: str, params: dict[str, Any] | None = None, **more: Any) -> str:
        path, _, fragment = path.partition("#")
        base, _, query = path.partition("?")
        pairs = [*parse_qsl(query), *(params or {}).items(), *more.items()]
        pairs = [(k, v) for k, v in pairs if v not in (None, "") and k != "token"]
        if token:
            pairs.append(("token", token))
        encoded = urlencode(pairs)
        return base + (f"?{encoded}" if encoded else "") + (f"#{fragment}" if fragment else "")

    return u


class Viewer:
    """The routes of one record's viewer: a record folder, or a PostgreSQL ledger
    (``blobs``: where its blobs are, else where its sessions say they put them)."""

    def __init__(self, record: Path | LedgerRecord, blobs: str | None = None) -> None:
        self.record = record
        self.blobs_url = blobs
        self.reads = VerifiedReads(record)
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True,
                               undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self.static = {p.name: p for p in STATIC.iterdir() if p.is_file()} \
            if STATIC.is_dir() else {}

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        context.setdefault("header", None)
        context.setdefault("refused", None)
        context.setdefault("record_path", str(self.record))
        token = _link_token(request)
        context["u"] = link_maker(token)
        context["link_token"] = token
        html = self.env.get_template(template).render(**context)
        return HTMLResponse(html, status_code=status)

    def page(self, request: Request, template: str,
             build: Callable[[SQLiteLedger], dict[str, Any]]) -> Response:
        """A page read from the verified record (:class:`~.reads.VerifiedReads`): the red
        banner alone when the record is refused, a 404 page when what is asked for is not
        in it."""
        try:
            with self.reads.open() as ledger:
                header = pages.record_header(ledger, self.record)
                try:
                    context = build(ledger)
                except pages.NotFound as exc:
                    return self.render(request, "not_found.html", 404, header=header,
                                       message=str(exc))
        except RecordRefused as exc:
            return self.render(request, "base.html", REFUSED_STATUS,
                               refused={"code": exc.code, "message": exc.message})
        return self.render(request, template, header=header, **context)

    def download(self, name: str, build: Callable[[SQLiteLedger], bytes | BinaryIO],
                 media_type: str, *, inline: bool = False) -> Response:
        """A file read from the verified record, as an attachment (never shown in the
        viewer's origin) unless ``inline`` (an image, under its own sandboxing policy):
        plain text 409 for a refused record, 404 for unknown ids."""
        try:
            with self.reads.open() as ledger:
                data = build(ledger)
        except RecordRefused as exc:
            return PlainTextResponse(f"refused: [{exc.code}] {exc.message}\n",
                                     status_code=REFUSED_STATUS)
        except pages.NotFound as exc:
            return PlainTextResponse(f"not found: {exc}\n", status_code=404)
        except pages.BlobUnavailable as exc:
            return PlainTextResponse(f"not served: {exc}\n", status_code=REFUSED_STATUS)
        headers = ({"Content-Security-Policy": IMAGE_CSP} if inline
                   else {"Content-Disposition": pages.content_disposition(name)})
        if isinstance(data, bytes):
            return Response(data, media_type=media_type, headers=headers)
        return StreamingResponse(_chunks(data), media_type=media_type, headers=headers)

    def _blobs(self, ledger: SQLiteLedger) -> pages.BlobSource:
        """Where the artifacts' bytes are read: the record folder's store, or the stores a
        PostgreSQL ledger's verified sessions name (each read verified)."""
        if isinstance(self.record, Path):
            return self.record
        from ..audit import ledger_blob_sources

        sources, _ = ledger_blob_sources(ledger, self.blobs_url)  # none opened: "not in"
        return sources

    # -- routes

    def sessions(self, request: Request) -> Response:
        query = sessions.Query.of(request.query_params)
        return self.page(request, "sessions.html",
                         lambda led: sessions.sessions_page(led, query))

    def session(self, request: Request) -> Response:
        sid = request.path_params["session_id"]
        query = sessions.Query.of(request.query_params)
        return self.page(request, "session.html", lambda led: derivation.mark_rederivations(
            led, sessions.session_page(led, sid, query)))

    def artifact(self, request: Request) -> Response:
        aid = request.path_params["artifact_id"]
        u = link_maker(_link_token(request))

        def build(ledger: SQLiteLedger) -> dict[str, Any]:
            page = pages.artifact_page(ledger, self._blobs(ledger), aid)
            lineage = page["graph"]
            links = graph.node_links(ledger, lineage)
            # lineage_svg escapes every label it writes (host_kernel/lineage/svg.py) and
            # graph.linked_svg every href; the page's policy runs no inline script anyway.
            svg = lineage_svg(graph.drawn(lineage), title=f"lineage of {page['filename']}")
            page["svg"] = Markup(graph.linked_svg(svg, links, u))
            page["nodes"] = [{"id": n.id, "kind": n.kind, "label": n.label,
                              "link": links.get(n.id)} for n in lineage.nodes]
            page["legend"] = graph.legend(lineage)
            page["edges"] = graph.edges(lineage, links)
            page["slice"] = derivation.slice_section(ledger, aid)
            page["rederived"] = derivation.rederivation_section(ledger, aid)
            return page

        return self.page(request, "artifact.html", build)

    def prov(self, request: Request) -> Response:
        aid = request.path_params["artifact_id"]
        return self.download(f"{aid}.prov.json", lambda led: _json_bytes(
            pages.artifact_prov(led, aid)), "application/json")

    def slice_script(self, request: Request) -> Response:
        return self._slice(request.path_params["artifact_id"], derivation.slice_script,
                           "text/x-python")

    def slice_notebook(self, request: Request) -> Response:
        return self._slice(request.path_params["artifact_id"], derivation.slice_notebook,
                           "application/x-ipynb+json")

    def _slice(self, aid: str, write: Callable[[SQLiteLedger, str], tuple[str, bytes]],
               media_type: str) -> Response:
        """The artifact's slice as a download named after the artifact's file."""
        names: list[str] = []

        def build(ledger: SQLiteLedger) -> bytes:
            name, data = write(ledger, aid)
            names.append(name)
            return data

        response = self.download("slice", build, media_type)
        if names and response.status_code == 200:
            response.headers["Content-Disposition"] = pages.content_disposition(names[0])
        return response

    def _artifact_row(self, ledger: SQLiteLedger, aid: str) -> Any:
        rows = ledger.query("SELECT filename, sha256, media_type FROM artifacts "
                            "WHERE artifact_id = ?", (aid,))
        if not rows:
            raise pages.NotFound(f"no artifact {aid!r} in this record")
        return rows[0]

    def artifact_bytes(self, request: Request) -> Response:
        aid = request.path_params["artifact_id"]
        names: list[str] = []

        def build(ledger: SQLiteLedger) -> BinaryIO:
            row = self._artifact_row(ledger, aid)
            names.append(row["filename"])
            return pages.artifact_blob(self._blobs(ledger), row["sha256"])

        response = self.download("artifact", build, "application/octet-stream")
        if names and response.status_code == 200:
            response.headers["Content-Disposition"] = pages.content_disposition(names[0])
        return response

    def artifact_image(self, request: Request) -> Response:
        """An image artifact's checked bytes, inline, for its preview's ``<img>``: only the
        image types, each served as its own type (with nosniff), an SVG under a sandboxing
        policy; anything else is 404."""
        aid = request.path_params["artifact_id"]
        types: list[str] = []

        def build(ledger: SQLiteLedger) -> BinaryIO:
            row = self._artifact_row(ledger, aid)
            mime = media_type(row["filename"], row["media_type"])
            if mime not in IMAGE_TYPES:
                raise pages.NotFound(f"artifact {aid!r} is not an image ({mime})")
            types.append(mime)
            return pages.artifact_blob(self._blobs(ledger), row["sha256"])

        response = self.download("image", build, "application/octet-stream", inline=True)
        if types and response.status_code == 200:
            response.headers["Content-Type"] = types[0]
        return response

    def receipt(self, request: Request) -> Response:
        rid = request.path_params["receipt_id"]
        return self.page(request, "receipt.html", lambda led: pages.receipt_page(led, rid))

    def statement(self, request: Request) -> Response:
        rid = request.path_params["receipt_id"]
        return self.download(f"{rid}.intoto.json", lambda led: _json_bytes(
            pages.receipt_json(led, rid)), "application/json")

    def verdict(self, request: Request) -> Response:
        sid = request.path_params["submission_id"]
        return self.page(request, "verdict.html", lambda led: {
            "verdict": verdicts.verdict_page(led, self._blobs(led), sid)})

    def static_file(self, request: Request) -> Response:
        path = self.static.get(request.path_params["name"])
        if path is None:
            return PlainTextResponse("not found\n", status_code=404)
        return Response(path.read_bytes(),
                        media_type=STATIC_TYPES.get(path.suffix, "application/octet-stream"))

    def not_found(self, request: Request, exc: Exception) -> Response:
        return PlainTextResponse("not found\n", status_code=404)


def _link_token(request: Request) -> str | None:
    token = request.scope.get("state", {}).get(LINK_TOKEN)
    return token if isinstance(token, str) else None


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    """The file's bytes in chunks, closing it at the end (or when the client goes away)."""
    try:
        while chunk := file.read(pages.BLOB_CHUNK):
            yield chunk
    finally:
        file.close()


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def create_app(record: str | Path | LedgerRecord, token: str, *,
               blobs: str | None = None) -> TokenGate:
    """The viewer of the record folder (or PostgreSQL ledger) ``record``, behind its token
    gate; ``blobs``: a ledger's blob store, when not the one its sessions recorded."""
    viewer = Viewer(record if isinstance(record, LedgerRecord) else Path(record), blobs)
    routes = [
        Route("/", viewer.sessions, methods=["GET"]),
        Route("/session/{session_id}", viewer.session, methods=["GET"]),
        Route("/artifact/{artifact_id}", viewer.artifact, methods=["GET"]),
        Route("/artifact/{artifact_id}/prov.json", viewer.prov, methods=["GET"]),
        Route("/artifact/{artifact_id}/bytes", viewer.artifact_bytes, methods=["GET"]),
        Route("/artifact/{artifact_id}/image", viewer.artifact_image, methods=["GET"]),
        Route("/artifact/{artifact_id}/slice.py", viewer.slice_script, methods=["GET"]),
        Route("/artifact/{artifact_id}/slice.ipynb", viewer.slice_notebook, methods=["GET"]),
        Route("/receipt/{receipt_id}", viewer.receipt, methods=["GET"]),
        Route("/receipt/{receipt_id}/statement.json", viewer.statement, methods=["GET"]),
        Route("/verdict/{submission_id}", viewer.verdict, methods=["GET"]),
        Route("/static/{name}", viewer.static_file, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: viewer.not_found})
    return TokenGate(app, token, on_close=viewer.reads.close)


# --------------------------------------------------------------------------- the server


class ViewerServer:
    """One record's viewer on 127.0.0.1: bound when made (``port`` 0 picks a free port), so
    :attr:`url` (with the token) is known before it serves. The record is a folder, or a
    :class:`~host_kernel.store.verified.LedgerRecord` (``blobs``: its blob store's URL when
    not the one its sessions recorded)."""

    def __init__(self, record_dir: str | Path | LedgerRecord, *, port: int = 0,
                 token: str | None = None, blobs: str | None = None) -> None:
        self.record_dir = (record_dir if isinstance(record_dir, LedgerRecord)
                           else Path(record_dir))
        self.token = token or secrets.token_urlsafe(24)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.bind(("127.0.0.1", port))
            self.socket.listen(64)
        except OSError:
            self.socket.close()
            raise
        self.port: int = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/?token={self.token}"
        self._app = create_app(self.record_dir, self.token, blobs=blobs)
        config = uvicorn.Config(self._app, lifespan="off",
                                log_config=None, log_level="warning", access_log=False,
                                server_header=False)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`stop` (or, in the main thread, Ctrl-C: uvicorn
        then re-raises the signal, so the caller sees KeyboardInterrupt)."""
        try:
            self._server.run(sockets=[self.socket])
        finally:
            self.socket.close()
            self._app.close()

    def start(self, timeout: float = 10.0) -> None:
        """Serve in a daemon thread; return once it accepts connections."""
        self._thread = threading.Thread(target=self.serve_forever, name="host-kernel-view",
                                        daemon=True)
        self._thread.start()
        self._thread.join(0)
        deadline = threading.Event()
        waited = 0.0
        while not self._server.started and self._thread.is_alive() and waited < timeout:
            deadline.wait(0.02)
            waited += 0.02
        if not self._server.started:
            self.stop()
            raise RuntimeError("the viewer's server did not start")

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self.socket.close()
        self._app.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(record_dir: str | Path, port: int = 0) -> tuple[str, Callable[[], None]]:
    """Serve the record folder's viewer in a thread; return its URL (with the token) and a
    function that stops it."""
    server = ViewerServer(record_dir, port=port)
    server.start()
    return server.url, server.stop
