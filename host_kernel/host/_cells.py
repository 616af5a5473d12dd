"""Cells: sending one to the kernel, collecting what it produced, and recording its end.

Owns ``execute`` (a Host-minted cell id, ``cell_started``/``cell_finished``), the
cell the Host is running now (to which every host call is attributed), the run
loop over the kernel's sockets with its timeout, interrupt and death handling,
the restart a stuck cell makes due, ``host.bash`` commands still running when
their cell ends, the cell's lineage, and the Observation's text. It does not
start kernels (host/_generations.py) or serve host calls (host/_calls.py).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import BadArguments, HostKernelError
from .._ids import mint_cell_id
from ..lineage.taint import TRACED
from ..sandbox.client import SandboxError
from ._bash import Redactor, kill_group
from ._generations import Generations
from ._keep import CopyPass, InputKeeper, KeptInputs
from ._kernel import KernelGeneration
from ._lineage import CellIO, SessionLineage
from ._outputs import CellRun, Outputs, execution_count
from ._record import SessionRecord
from ._render import cell_header, cut, cut_notice, render_outputs
from ._server import RefusalLog
from ._session import Session
from ._trace import TracedAccess, now_ns

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._models import Observation
    from ..lineage.statements import Prepared

__all__ = ["IDLE_GRACE", "INTERRUPT_GRACE", "LIVENESS_POLL", "REPLY_GRACE", "CellRunner",
           "RunningCell", "join"]

#: Seconds the Host waits after interrupting a timed-out cell before restarting.
INTERRUPT_GRACE = 1.5
#: How often a waiting Host checks that the kernel process is still alive (and, in a
#: cell that has not gone idle by then, whether its execute_reply came).
LIVENESS_POLL = 0.2
#: Seconds the Host waits for a cell's ``idle`` once its execute_reply has come and IOPub
#: has gone quiet. ipykernel publishes it right after the reply; code in the kernel can
#: keep it from ever coming, and the Host must not wait for it forever (the relay's
#: END_GRACE does the same). Generous: only a kernel that leaves its idle out pays it,
#: and a starved IOPub thread on a loaded machine must not be taken for one.
IDLE_GRACE = 5.0
#: Seconds the Host waits for a cell's execute_reply once its ``idle`` has come.
REPLY_GRACE = 1.0


@dataclass(frozen=True, slots=True)
class RunningCell:
    """The cell the Host is running: what every host call made now is attributed to."""

    cell_id: str
    generation: int
    token: str
    code: str = ""
    io: CellIO = field(default_factory=CellIO)
    #: When the Host sent the cell: CLOCK_MONOTONIC (the tracer's clock), and the clock
    #: file systems stamp change times with (``_workspace.ctime_clock_ns``).
    start_ns: int = 0
    start_ctime_ns: int = 0

    @classmethod
    def now(cls, cell_id: str, generation: int, token: str, code: str) -> RunningCell:
        """A cell about to be sent, stamped as the tracer will see it."""
        start_ns, start_ctime_ns = now_ns()
        return cls(cell_id, generation, token, code, start_ns=start_ns,
                   start_ctime_ns=start_ctime_ns)


def join(first: str | None, second: str) -> str:
    return second if first is None else f"{first} {second}"


class CellRunner:
    """Runs the session's cells, one at a time, and records each."""

    def __init__(self, record: SessionRecord, session: Session, generations: Generations,
                 lineage: SessionLineage, redactor: Redactor, text_limit: int) -> None:
        self.record = record
        self.session = session
        self.generations = generations
        self.lineage = lineage
        self.redactor = redactor
        self.text_limit = text_limit
        #: The cell being executed now; None between cells.
        self.running: RunningCell | None = None
        #: Held while a cell runs or a generation starts: one at a time.
        self.exec_lock = threading.Lock()
        #: Set when a cell ignored the interrupt after Ctrl-C: the generation is restarted,
        #: with this reason, before the next cell.
        self.restart_due: str | None = None
        #: What the kernel's audit hook reported for a cell (untraced sessions).
        self.pending_access: dict[str, Any] = {}
        #: host.bash processes still running, per cell, with an event set once recorded.
        self._commands: dict[str, list[tuple[subprocess.Popen[bytes], threading.Event]]] = {}
        self._commands_lock = threading.Lock()
        self._confinement_told = False
        self._tracing_told = False
        #: Refused calls, recorded once per cause; the counts are recorded as each cell
        #: ends (host/_server.py, RefusalLog).
        self.refusals = RefusalLog(record.append)
        #: The bytes of the session's inputs, kept in the record's blob store (host/_keep.py).
        self.keeper = InputKeeper(lineage.workspace, lineage.hash_cache,
                                  generations.options.input_budget, lambda: record.blobs)

    def command_started(self, cell_id: str, proc: subprocess.Popen[bytes],
                        recorded: threading.Event) -> None:
        """A host.bash command of ``cell_id`` started; ``recorded`` is set once its
        receipt is in the record."""
        with self._commands_lock:
            self._commands.setdefault(cell_id, []).append((proc, recorded))

    def execute(self, code: str, timeout: float | None = None, *,
                frontend_cell_id: str | None = None) -> Observation:
        """Run one cell in the kernel and return what the Host saw."""
        if not isinstance(code, str):
            raise BadArguments(f"code must be a str, not {type(code).__name__}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise BadArguments("timeout must be a positive number of seconds or None")
        with self.exec_lock:
            if self.restart_due is not None:  # a cell ignored Ctrl-C's interrupt
                reason, self.restart_due = self.restart_due, None
                self.generations.start(reason)
            kernel = self.generations.kernel
            assert kernel is not None
            cell_id = mint_cell_id()
            self.record.append("cell_started", {
                "cell_id": cell_id, "generation": kernel.generation, "code": code,
                "frontend_cell_id": frontend_cell_id})
            running = self.running = RunningCell.now(cell_id, kernel.generation,
                                                     kernel.token, code)
            t0 = time.monotonic()
            run: CellRun | None = None
            finished = False
            prepared: list[Prepared | None] = []
            try:
                try:
                    run = self._run(kernel, code, cell_id, timeout,
                                    on_sent=lambda: prepared.append(self.prepare(code)))
                finally:
                    self.running = None
                duration = time.monotonic() - t0
                notice = self.settle_commands(cell_id)
                # Before any restart below, which forgets every name in memory.
                lineage_body = self.cell_lineage(running, run.access,
                                                 prepared[0] if prepared else None)
                notice = self._after_run(kernel, run, notice, timeout)
                if run.idle_missing:
                    notice = join(notice, f"The kernel answered this cell but never said it "
                                          f"was idle; the Host ended the cell once the kernel "
                                          f"had sent nothing for {IDLE_GRACE:g} s after the "
                                          f"answer. Output the kernel sends later is not in "
                                          f"this cell's record.")
                if run.reply_missing:
                    notice = join(notice, f"The kernel said this cell was idle but never "
                                          f"answered it; the Host ended the cell "
                                          f"{REPLY_GRACE:g} s later and recorded it as an "
                                          f"error.")
                outputs = [self.redactor.deep(o) for o in run.outputs]
                body: dict[str, Any] = {
                    "cell_id": cell_id, "status": run.status,
                    "execution_count": run.execution_count,
                    "outputs": outputs, "duration": duration, "notice": notice,
                }
                if run.idle_missing:
                    body["idle_missing"] = True
                if run.reply_missing:
                    body["reply_missing"] = True
                if run.dropped_chars:
                    body["dropped_chars"] = run.dropped_chars
                if run.output_cut is not None:
                    body["output_cut"] = run.output_cut
                if run.access is not None:
                    body["access"] = run.access
                body.update(lineage_body)
                self.record.append("cell_finished", body)
                finished = True
                self.refusals.flush()
            except BaseException as exc:  # Ctrl-C, or a failure of the Host's own
                if not finished:           # never leave the cell `running` in the record
                    self._record_unfinished(kernel, cell_id, time.monotonic() - t0, exc,
                                            run)
                raise
            if run.host_interrupted:
                raise KeyboardInterrupt  # recorded; the caller's Ctrl-C goes on from here
            if not self._confinement_told:
                self._confinement_told = True
                confinement = self.generations.confinement
                told = None if confinement is None else confinement.notice()
                if told is not None:
                    notice = told if notice is None else f"{told} {notice}"
            if not self._tracing_told:
                self._tracing_told = True
                told = self.generations.tracing_notice()
                if told is not None:
                    notice = told if notice is None else f"{told} {notice}"
            text = self.text(cell_id, run.status, outputs, notice, run.dropped_chars,
                             run.output_cut)
            # The values and their cards are a cell's, not the start's.
            from .._models import Observation

            return Observation(cell_id=cell_id, status=run.status, outputs=tuple(outputs),
                               execution_count=run.execution_count, generation=kernel.generation,
                               text=text, duration=duration, notice=notice)

    def _after_run(self, kernel: KernelGeneration, run: CellRun, notice: str | None,
                   timeout: float | None) -> str | None:
        """What a cell's end does to the kernel (a restart after a death or a stuck cell),
        and the notice that says so."""
        if run.status == "kernel_died":
            old = kernel.generation
            self.generations.start("kernel_died")
            new = self.generations.generation
            notice = join(notice, f"The kernel died while running this cell (generation "
                                  f"{old}). The Host started generation {new}: "
                                  f"every variable, import and object in memory is gone. "
                                  f"What survives: workspace files, saved artifacts and "
                                  f"the record.")
            ended = self.generations.ended  # "limit reached: memory. …", or None
            return notice if ended is None else join(notice, ended)
        if run.status == "interrupted":
            notice = join(notice, "The Host's own process was interrupted (Ctrl-C) while "
                                   "this cell ran; the Host interrupted the cell and kept "
                                   "what it had printed.")
            if run.stuck:
                # Restarted before the next cell, not now: a Ctrl-C is no time to start a
                # kernel, and the cell is recorded first.
                self.restart_due = "interrupted"
                notice = join(notice, f"The cell did not stop within {INTERRUPT_GRACE:g} s, "
                                       f"so the Host will restart the kernel before the next "
                                       f"cell (generation {kernel.generation + 1}); in-memory "
                                       f"state will be gone.")
            return notice
        if run.status == "timeout":
            if run.stuck:
                old = kernel.generation
                self.generations.start("timeout")
                return join(notice, f"The cell ran past its {timeout:g} s timeout and "
                                     f"did not stop within {INTERRUPT_GRACE:g} s of an "
                                     f"interrupt, so the Host restarted the kernel: "
                                     f"generation {old} → {self.generations.generation}; "
                                     f"in-memory state is gone. Workspace files, artifacts and the "
                                     f"record survive.")
            return join(notice, f"The cell ran past its {timeout:g} s timeout; the Host "
                                 f"interrupted it (KeyboardInterrupt). The kernel and its state "
                                 f"are still there (generation {kernel.generation}).")
        return notice

    def _record_unfinished(self, kernel: KernelGeneration, cell_id: str, duration: float,
                           exc: BaseException, run: CellRun | None) -> None:
        """Close the record of a cell whose ``execute`` was stopped before its
        ``cell_finished`` (a KeyboardInterrupt or SystemExit outside the cell loop, or a
        failure of the Host's own), so the record never keeps a cell ``running`` whose
        Host is alive. Best effort and short; the caller re-raises ``exc``.

        When the kernel's run had not ended (``run`` is None), the Host interrupts it and
        waits briefly for it; the cell is ``interrupted`` with no outputs. When it had,
        the cell keeps its outputs and, unless the Host's process was interrupted, its
        own status. Its ``host.bash`` commands are killed either way.
        """
        stopped = isinstance(exc, (KeyboardInterrupt, SystemExit))
        if run is None:
            try:
                kernel.interrupt()  # a signal (or interrupt_request); the reply is awaited below
            except Exception:  # noqa: BLE001 - the kernel may be gone; the record still closes
                pass
        why = (f"The Host's own process was interrupted ({type(exc).__name__})" if stopped
               else f"The Host failed ({type(exc).__name__}: {exc})")
        notice = (f"{why} while this cell ran: the Host asked the kernel to interrupt the "
                  f"cell and did not collect its outputs." if run is None else
                  f"{why} while it recorded this cell's end.")
        try:
            notice = join(self.settle_commands(cell_id), notice)
        except Exception:  # noqa: BLE001 - killing commands is best effort here
            pass
        status = "interrupted" if run is None or stopped else run.status
        outputs: list[dict[str, Any]] = []
        if run is not None:
            try:
                outputs = [self.redactor.deep(o) for o in run.outputs]
            except Exception:  # noqa: BLE001 - the outputs are what made it fail
                outputs = []
        body: dict[str, Any] = {
            "cell_id": cell_id, "status": status,
            "execution_count": None if run is None else run.execution_count,
            "outputs": outputs, "duration": duration, "notice": notice}
        if run is not None and run.output_cut is not None:
            body["output_cut"] = run.output_cut
        for attempt in (body, {**body, "outputs": [], "notice": join(
                notice, "Its outputs could not be recorded.")}):
            try:
                self.record.append("cell_finished", attempt)
                break
            except HostKernelError:
                break  # the record refuses appends (foreign events): nothing more to try
            except Exception:  # noqa: BLE001 - e.g. an output the ledger cannot take
                continue
        if run is None:
            try:
                self._await_interrupted(kernel)
            except Exception:  # noqa: BLE001 - the kernel's sockets may be gone
                pass

    @staticmethod
    def _await_interrupted(kernel: KernelGeneration, wait: float = 2.0) -> None:
        """Wait (at most ``wait`` seconds) for the kernel to go idle after an interrupt,
        and take the interrupted request's reply off the shell socket. ipykernel aborts
        every request queued before it finishes an interrupted one (``stop_on_error``), so
        a next cell sent sooner would come back empty."""
        kc = kernel.client
        if kc is None:
            return
        iopub, shell = kc.iopub_channel.socket, kc.shell_channel.socket
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if not iopub.poll(int(left * 1000) + 1):
                return
            try:
                _, parts = kc.session.feed_identities(iopub.recv_multipart())
                header, parent, content = (json.loads(parts[i]) for i in (1, 2, 4))
            except (ValueError, IndexError):
                continue
            if (header.get("msg_type") == "status"
                    and parent.get("msg_type") == "execute_request"
                    and content.get("execution_state") == "idle"):
                break
        while shell.poll(0):
            shell.recv_multipart()

    def prepare(self, code: str) -> Prepared | None:
        """Lineage's work on the code alone, done while the kernel runs the cell."""
        try:
            return self.lineage.prepare(code)
        except Exception:  # noqa: BLE001 - cell_finished does it again and records any error
            return None

    def cell_lineage(self, running: RunningCell, access: Any,
                     prepared: Prepared | None = None) -> dict[str, Any]:
        """Feed the finished cell to lineage: what the tracer saw the kernel's tree do in
        the cell's window, or, untraced, what the kernel's audit hook reported (``access``).
        Returns what the cell's record adds: ``traced``, ``inputs_kept`` and any
        ``lineage_error``. ``prepared``: lineage's work on the cell's code (:meth:`prepare`).

        The bytes of the cell's reads are kept before lineage hashes them: the copy leaves
        each file's hash in the cache lineage reads, so a kept file is read and hashed once.
        """
        body: dict[str, Any] = {}
        traced: TracedAccess | None = None
        if self.generations.trace is not None:
            try:
                traced = self.generations.trace.for_cell(running.start_ns, time.monotonic_ns(),
                                              since_ctime_ns=running.start_ctime_ns)
            except SandboxError as exc:  # the generation ended (the kernel died)
                body["lineage_error"] = f"trace: {exc}"
        copied = CopyPass()
        own: KeptInputs | None = None
        if traced is not None or self.generations.trace is None:  # what lineage is fed
            seen = traced.access() if traced is not None else access
            reads = seen.get("reads") if isinstance(seen, dict) else None
            try:
                copied = self.keeper.copy_reads([*(reads if isinstance(reads, list) else ()),
                                                 *running.io.reads])
            except Exception as exc:  # noqa: BLE001 - keeping inputs never blocks a cell's record
                own = KeptInputs(errors=[f"{type(exc).__name__}: {exc}"])
        try:
            if traced is not None:
                body["traced"] = traced.to_record()
                self.lineage.cell_finished(running.cell_id, running.code, traced.access(),
                                           running.io, method=TRACED, prepared=prepared)
            elif self.generations.trace is None:
                # The keys the keeper's own stat just found equal to cached ones: no second stat.
                self.lineage.cell_finished(running.cell_id, running.code, access, running.io,
                                           known=copied.keys, prepared=prepared)
        except Exception as exc:  # noqa: BLE001 - lineage is evidence about data, never acceptance
            body["lineage_error"] = f"{type(exc).__name__}: {exc}"
        if copied:
            try:
                own = self.keeper.report(copied)
            except Exception as exc:  # noqa: BLE001 - keeping inputs never blocks a cell's record
                own = KeptInputs(errors=[f"{type(exc).__name__}: {exc}"])
        kept = self.keeper.cell_finished(running.cell_id, own)
        if kept is not None:
            body["inputs_kept"] = kept
        return body

    def settle_commands(self, cell_id: str) -> str | None:
        """Kill host.bash commands of this cell still running, and wait for their receipts.

        The Host never returns from a cell while work it started for it runs on unnoticed.
        """
        with self._commands_lock:
            active = self._commands.pop(cell_id, [])
        killed = 0
        for proc, recorded in active:
            if not recorded.is_set() and proc.poll() is None:
                if kill_group(proc):
                    killed += 1
        for _, recorded in active:
            recorded.wait(timeout=10)
        if not killed:
            return None
        return (f"{killed} host.bash command(s) of this cell were still running when it ended; "
                f"the Host killed them and recorded their receipts.")

    def text(self, cell_id: str, status: str, outputs: list[dict[str, Any]],
             notice: str | None, dropped: int,
             output_cut: dict[str, Any] | None = None) -> str:
        body = render_outputs(outputs)
        if dropped:
            body += f"\n[{dropped} further characters of output were not kept]\n"
        if output_cut is not None:
            body += f"\n{cut_notice(output_cut)}\n"
        if not body.strip():
            body = "(no output)\n" if status in ("ok", "error") else ""
        body = cut(body, self.text_limit)
        head = cell_header(cell_id, self.session.mode.armed)
        tail = f"\n[{notice}]\n" if notice else ""
        return head + body + tail

    def _run(self, kernel: KernelGeneration, code: str, cell_id: str,
             timeout: float | None, on_sent: Callable[[], object] | None = None) -> CellRun:
        """Send the cell and collect what it produced, until the kernel's ``idle`` for it;
        ``on_sent`` is called once the kernel has the cell, to overlap the Host's work.

        Reads the client's IOPub and shell sockets directly, in this thread: each
        message's signature is checked and only the parts this request needs are
        parsed (jupyter_client's blocking getters would add an event-loop turn and
        date parsing to every message).
        """
        kc = kernel.client
        assert kc is not None
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        msg = kc.session.msg("execute_request", content, metadata={"cellId": cell_id})
        run = CellRun(kc.session, msg["header"]["msg_id"])
        iopub = kc.iopub_channel.socket
        collector = Outputs()
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        interrupted_at: float | None = None
        last_alive_check = now
        replied_at: float | None = None  # when the execute_reply was seen, if before idle
        heard_at = now  # when IOPub last had a message: the grace counts from both
        sent = False
        while True:
            try:
                if not sent:
                    # Sent inside the try: a Ctrl-C that lands between the send and the
                    # loop (a loaded machine can run the whole cell up to its first
                    # output in that gap) still interrupts the cell and keeps its outputs.
                    # Marked first, so a Ctrl-C inside the send errs toward waiting.
                    sent = True
                    kc.shell_channel.send(msg)
                    if on_sent is not None:
                        on_sent()
                now = time.monotonic()
                if deadline is not None and now >= deadline and interrupted_at is None:
                    run.status = "timeout"
                    kernel.interrupt()
                    interrupted_at = now
                if interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE:
                    run.stuck = True
                    break
                if now - last_alive_check >= LIVENESS_POLL:
                    last_alive_check = now
                    if not kernel.is_alive():
                        run.status = "kernel_died"
                        break
                    # A cell not idle by now: has its reply come (read at most 256
                    # messages a look, so a kernel sending without end cannot hold us)?
                    if replied_at is None and self._take_reply(run, kc.shell_channel.socket,
                                                               0.0, most=256):
                        replied_at = now
                # The grace runs from the reply and from IOPub's last message: a Host
                # reading a backlog of output late (a loaded machine) is still being
                # sent the cell's messages, its idle at their end.
                if replied_at is not None and now - max(replied_at, heard_at) >= IDLE_GRACE:
                    run.idle_missing = True
                    break
                wait = LIVENESS_POLL
                if deadline is not None and interrupted_at is None:
                    wait = max(0.0, min(wait, deadline - now))
                if replied_at is not None:
                    wait = max(0.0, min(wait, max(replied_at, heard_at) + IDLE_GRACE - now))
                if not iopub.poll(int(wait * 1000) + 1):
                    continue
                heard_at = time.monotonic()
                reply = run.receive(iopub, outputs=collector)
                if reply is None:
                    continue
                mtype = reply["msg_type"]
                if mtype == "status":
                    if reply["content"].get("execution_state") == "idle":
                        break
                elif mtype == "execute_input":
                    run.execution_count = execution_count(reply["content"].get("execution_count"))
                elif mtype in Outputs.KINDS:
                    collector.add(reply)
            except KeyboardInterrupt:
                # Ctrl-C in the Host's own process: interrupt the cell as a timeout would,
                # keep collecting its outputs until the kernel is idle (at most
                # INTERRUPT_GRACE), and let execute() record it, then raise again. A second
                # Ctrl-C stops waiting for the kernel.
                if run.host_interrupted:
                    run.stuck = True
                    break
                run.host_interrupted = True
                run.status = "interrupted"
                interrupted_at = time.monotonic()
                try:
                    kernel.interrupt()
                except KeyboardInterrupt:  # a second Ctrl-C while the signal is sent
                    run.stuck = True
                    break
                except Exception:  # noqa: BLE001 - the outputs so far are still collected
                    pass
        run.outputs = collector.final
        run.dropped_chars = collector.dropped
        run.output_cut = collector.cut
        if replied_at is None and not run.stuck and run.status != "kernel_died":
            # Normally there already: it came before the idle.
            run.reply_missing = not self._take_reply(run, kc.shell_channel.socket, REPLY_GRACE)
        if run.status == "ok" and (collector.saw_error or run.reply_missing
                                   or run.reply_status == "error"):
            run.status = "error"
        run.access = self.pending_access.pop(cell_id, None)
        return run

    @staticmethod
    def _take_reply(run: CellRun, shell: Any, wait: float, most: int | None = None) -> bool:
        """Take the cell's execute_reply off the shell socket (its ``status`` kept); False
        when it is not there within ``wait`` seconds (0: only what is there now), or
        within ``most`` messages. Other messages read meanwhile (a stale reply) are
        dropped, so replies never pile up. Code in the kernel can keep the reply from
        being sent, or send without end: both bounds hold either way."""
        deadline = time.monotonic() + wait
        taken = 0
        while most is None or taken < most:
            left = deadline - time.monotonic()
            if wait > 0 and left <= 0:
                return False
            if not shell.poll(int(left * 1000) + 1 if left > 0 else 0):
                return False
            taken += 1
            reply = run.receive(shell)
            if reply is not None and reply["msg_type"] == "execute_reply":
                status = reply["content"].get("status")
                run.reply_status = status if isinstance(status, str) else None
                return True
        return False
