"""A session's record as the Host writes it: the ledger, the blob store, and its anchor.

Owns opening the session's stores (SQLite in the record folder or PostgreSQL by
URL; the record folder's blobs, written through to an fsspec store when asked),
how long they are waited for while they are away (``store_patience``: the session
pauses; store/retry.py), appending events with the foreign-event check (the
ledger's tail must be what this Host last wrote), the seq → hash anchor of
everything it appended (events the ledger found committed after their append
raised among them), the chain's head, projections the Host can vouch for, and
which files open the record's stores (so that no confined process reads them).
It does not decide what is appended: the session, cells, calls and submissions do.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._errors import BadArguments, RecordError
from ..store.blobs import FileBlobStore
from ..store.ledger import Event, ForeignEventError, SQLiteLedger, check_chain, rebuild
from ..store.pg import KEY_ENV, PostgresLedger, keys_folder, redact_url
from ._options import HostOptions

__all__ = ["SessionRecord"]


class SessionRecord:
    """The ledger and blob store one session appends to, and what this Host wrote there.

    Unopened until :meth:`open`; ``ledger`` and ``blobs`` raise a RecordError before.
    """

    def __init__(self, record_dir: Path, session_id: str, options: HostOptions) -> None:
        self.record_dir = record_dir
        #: The session every append goes to (a relay that continues one sets it).
        self.session_id = session_id
        self._options = options
        self._ledger: SQLiteLedger | PostgresLedger | None = None
        self._blobs: FileBlobStore | None = None
        #: seq → hash of every event this Host appended: the anchor that an edit of the
        #: SQLite file (even one that recomputes the whole chain) cannot move.
        self.appended: dict[int, str] = {}
        #: Set once a foreign event is found on the ledger's tail: every append then fails.
        self._foreign: RecordError | None = None
        #: How deep this Host holds the record's sessions lock (host/_session.py).
        self.lock_depth = 0

    # ------------------------------------------------------------------ the stores

    @property
    def ledger(self) -> SQLiteLedger | PostgresLedger:
        if self._ledger is None:
            raise RecordError("the session's record is not open")
        return self._ledger

    @property
    def blobs(self) -> FileBlobStore:
        if self._blobs is None:
            raise RecordError("the session's record is not open")
        return self._blobs

    @property
    def opened(self) -> tuple[SQLiteLedger | PostgresLedger | None, FileBlobStore | None]:
        """The ledger and blob store, each None while not open (for the Host's attributes)."""
        return self._ledger, self._blobs

    @property
    def is_postgres(self) -> bool:
        return isinstance(self._ledger, PostgresLedger)

    def open(self) -> None:
        """The ledger (SQLite in the record folder, or PostgreSQL by URL) and the blob
        store (the record folder's, written through to ``blobs`` when given)."""
        options = self._options
        ledger: SQLiteLedger | PostgresLedger
        if options.ledger is None:
            ledger = SQLiteLedger(self.record_dir / "ledger.sqlite")
        else:
            ledger = PostgresLedger(options.ledger, key=options.ledger_key,
                                    patience=options.store_patience)
        try:
            if options.blobs is None:
                blobs = FileBlobStore(self.record_dir)
            else:
                from ..store.fsblobs import MirroredBlobStore

                try:
                    blobs = MirroredBlobStore(self.record_dir, options.blobs,
                                              patience=options.store_patience)
                except ValueError as exc:  # a URL fsspec cannot use, a path it would glob
                    raise BadArguments(f"blobs: {exc}") from None
        except BaseException:
            ledger.close()
            raise
        self._ledger, self._blobs = ledger, blobs

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()

    def stores_named(self) -> dict[str, str]:
        """Where the record lives when it is not all in the record folder (no password)."""
        named = {}
        if self._options.ledger is not None:
            named["ledger"] = redact_url(self._options.ledger)
        if self._options.blobs is not None:
            named["blobs"] = redact_url(self._options.blobs)
        return named

    def local_blob_folder(self) -> Path | None:
        """The folder of a ``blobs=`` store on a local or shared file system; None for an
        object store, or without ``blobs=``."""
        remote = getattr(self._blobs, "remote", None)
        if remote is None or not remote.local:
            return None
        return Path(os.path.realpath(remote.root))

    def secret_files(self) -> list[str]:
        """Files the kernel must not read because they open the record's stores: a
        PostgreSQL ledger's record key and libpq's password and service files; an object
        store's credentials, or the store's folder when it is on a local file system; and
        the Host's LLM key file."""
        home = Path.home()
        # Every PostgreSQL ledger's key, whatever this session writes to: a kernel that
        # read one could forge events any database writer could then insert. The folder
        # is made now if missing, so that a key made there later is hidden too.
        with contextlib.suppress(OSError):
            keys_folder().mkdir(parents=True, exist_ok=True, mode=0o700)
        found: list[Path] = [keys_folder()]
        if os.environ.get(KEY_ENV):
            found.append(Path(os.environ[KEY_ENV]))
        if self._options.ledger is not None:
            found += [home / ".pgpass", home / ".pg_service.conf"]
            found += [Path(os.environ[n]) for n in ("PGPASSFILE", "PGSERVICEFILE")
                      if os.environ.get(n)]
        if self._options.blobs is not None:
            # A blob store on a local or shared file system: it holds other sessions'
            # artifacts (every task of a batch writes there).
            shared = self.local_blob_folder()
            if shared is not None:
                found.append(shared)
            found += [home / ".aws", home / ".config" / "gcloud", home / ".azure"]
            found += [Path(os.environ[n]) for n in ("AWS_SHARED_CREDENTIALS_FILE",
                                                    "AWS_CONFIG_FILE",
                                                    "GOOGLE_APPLICATION_CREDENTIALS")
                      if os.environ.get(n)]
        return self._options.llm_key_file() + [str(p) for p in found if p.exists()]

    # ------------------------------------------------------------------ appending

    def append(self, kind: str, body: dict[str, Any]) -> Event:
        """Append one event to this session, refusing once the tail is not ours.

        While the ledger is unavailable the append waits (``store_patience``; the session
        pauses: the cell's call, or the cell's start or end, waits with it) and is not
        made twice; past the bound it raises StoreUnavailable (``store_unavailable``),
        naming the outage, and nothing of this event is known to be in the ledger."""
        ledger = self.ledger
        if self._foreign is not None:
            raise self._foreign
        try:
            try:
                event = ledger.append(self.session_id, kind, body)
            except UnicodeEncodeError:
                # A lone surrogate (a kernel can send one, escaped, in any JSON it sends)
                # cannot be hashed as UTF-8: keep the event, with U+FFFD in its place.
                event = ledger.append(self.session_id, kind, scrubbed(body))
        except ForeignEventError as exc:
            raise self._refuse_foreign(kind, exc) from exc
        if isinstance(ledger, PostgresLedger):
            # Events whose append raised (the ledger was away past the bound) and that the
            # ledger found committed since: this Host wrote them, so they are anchored.
            while ledger.adopted:
                late = ledger.adopted.pop(0)
                self.appended[late.seq] = late.hash
        self.appended[event.seq] = event.hash
        return event

    def append_many(self, events: Sequence[tuple[str, dict[str, Any]]]) -> list[Event]:
        """Append ``(kind, body)`` events to this session in order, in one transaction
        where the ledger has one for several events (SQLite): all of them, or none.

        A ledger without it (PostgreSQL, for now) gets them one :meth:`append` at a time:
        each is whole, but a failure part way leaves the first ones in. Refuses, like
        :meth:`append`, once the tail is not ours."""
        ledger = self.ledger
        many = getattr(ledger, "append_many", None)
        if many is None or len(events) < 2:
            return [self.append(kind, body) for kind, body in events]
        if self._foreign is not None:
            raise self._foreign
        kinds = ", ".join(kind for kind, _ in events)
        try:
            try:
                appended: list[Event] = many(self.session_id, events)
            except UnicodeEncodeError:
                appended = many(self.session_id, [(k, scrubbed(b)) for k, b in events])
        except ForeignEventError as exc:
            raise self._refuse_foreign(kinds, exc) from exc
        if isinstance(ledger, PostgresLedger):
            while ledger.adopted:  # as in append: events found committed after all
                late = ledger.adopted.pop(0)
                self.appended[late.seq] = late.hash
        for event in appended:
            self.appended[event.seq] = event.hash
        return appended

    def _refuse_foreign(self, kind: str, exc: ForeignEventError) -> RecordError:
        """Foreign events on the tail: from now on every append is refused with this."""
        self._foreign = RecordError(
            f"the ledger's tail is not what this Host last wrote, and no holder of the "
            f"record key wrote what follows (seq {', '.join(map(str, exc.seqs)) or '?'}): "
            f"events were appended or edited behind the Host's back. The Host writes "
            f"nothing more to this record; "
            f"`host-kernel audit {self.record_dir}` shows the events.", code="foreign_event")
        self._note_foreign(kind, exc)
        return self._foreign

    def _note_foreign(self, kind: str, exc: ForeignEventError) -> None:
        """The chain cannot take our own note once foreign events sit on its tail, so the
        detection goes into a plain log beside it (and audit finds the events themselves)."""
        line = json.dumps({"ts": time.time(), "session": self.session_id, "refused_kind": kind,
                           "seqs": list(exc.seqs), "problems": [str(p) for p in exc.problems]})
        try:
            with open(self.record_dir / "foreign-events.log", "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError:
            pass

    @property
    def head(self) -> str | None:
        """The hash of the last event this Host wrote or verified."""
        known = None if self._ledger is None else self._ledger.known_head
        return None if known is None else known.hash

    # ------------------------------------------------------------------ reading back

    def trusted_projection(self) -> SQLiteLedger:
        """Projections rebuilt from events whose chain and hashes this Host vouches for."""
        ledger = self.ledger
        problems = check_chain(ledger, self.session_id)
        if problems:
            raise RecordError(f"the ledger's hash chain is broken ({problems[0]})")
        rows = ledger.query("SELECT seq, hash FROM events WHERE session = ?",
                            (self.session_id,))
        on_disk = {r["seq"]: r["hash"] for r in rows}
        if on_disk != self.appended:
            raise RecordError("the ledger's events for this session are not the ones this Host "
                              "wrote (edited behind its back)")
        return rebuild(ledger, self.session_id)

    def own_rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of this session's projection as the Host can vouch for them: read from the
        ledger file on SQLite (in the record folder, which the kernel cannot reach); on
        PostgreSQL, a database other writers may reach, from this session's events
        replayed and checked against what this Host wrote (:meth:`trusted_projection`)."""
        ledger = self.ledger
        if not isinstance(ledger, PostgresLedger):
            return list(ledger.query(sql, params))
        with self.trusted_projection() as trusted:
            return list(trusted.query(sql, params))


def scrubbed(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8 (lone surrogates become U+FFFD)."""
    if isinstance(value, str):  # a paired surrogate is one character again, a lone one U+FFFD
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {scrubbed(k): scrubbed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrubbed(v) for v in value]
    return value
