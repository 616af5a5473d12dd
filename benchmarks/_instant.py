"""An instant kernel: the floor under any kernel a Jupyter frontend launches.

It does nothing a kernel is for. It binds its five ports as soon as its interpreter has
ZeroMQ, then answers ``kernel_info_request`` and ``execute_request`` (``ok``, no
output) at once, echoes heartbeats and exits on ``shutdown_request``. Timing a frontend
against it (jupyter_client's ``KernelManager`` and ``BlockingKernelClient``, as
benchmarks/relay.py's ``_Frontend`` drives every kernelspec) measures what the frontend
and ZeroMQ cost by themselves: the frontend connects its channels right after it
launches the process, before any kernel can have bound its ports, and libzmq tries
again only after its reconnect interval (100 ms plus up to 100 ms of random jitter).

``python -m benchmarks._instant CONNECTION_FILE`` runs it; :func:`install` writes its
kernelspec (``instant``) under a Jupyter data folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["NAME", "install", "main"]

NAME = "instant"


def install(data_dir: Path) -> None:
    """The ``instant`` kernelspec under ``data_dir`` (a folder on ``JUPYTER_PATH``)."""
    folder = data_dir / "kernels" / NAME
    folder.mkdir(parents=True, exist_ok=True)
    repo = str(Path(__file__).resolve().parents[1])
    spec = {"argv": [sys.executable, "-c",
                     f"import sys; sys.path.insert(0, {repo!r}); "
                     "from benchmarks._instant import main; main(sys.argv[1])",
                     "{connection_file}"],
            "display_name": "instant (benchmark floor)", "language": "python"}
    (folder / "kernel.json").write_text(json.dumps(spec))


def main(connection_file: str) -> None:
    import zmq

    with open(connection_file) as f:
        conn = json.load(f)
    ctx = zmq.Context()

    def bound(kind: int, key: str) -> zmq.Socket[bytes]:
        sock = ctx.socket(kind)
        sock.bind(f"{conn['transport']}://{conn['ip']}:{conn[key]}")
        return sock

    shell, control = bound(zmq.ROUTER, "shell_port"), bound(zmq.ROUTER, "control_port")
    stdin, iopub = bound(zmq.ROUTER, "stdin_port"), bound(zmq.PUB, "iopub_port")
    heartbeat = bound(zmq.REP, "hb_port")
    from jupyter_client.session import Session  # after binding: its import is not the floor

    session = Session(key=conn["key"].encode(), signature_scheme=conn["signature_scheme"])
    poller = zmq.Poller()
    for sock in (shell, control, heartbeat):
        poller.register(sock, zmq.POLLIN)
    count = 0
    while True:
        for sock, _ in poller.poll():
            if sock is heartbeat:
                heartbeat.send(heartbeat.recv())
                continue
            idents, frames = session.feed_identities(sock.recv_multipart())
            msg = session.deserialize(frames)
            kind = msg["header"]["msg_type"]
            session.send(iopub, "status", {"execution_state": "busy"}, parent=msg)
            if kind == "kernel_info_request":
                session.send(sock, "kernel_info_reply", {
                    "status": "ok", "protocol_version": "5.3", "implementation": NAME,
                    "implementation_version": "0", "banner": "",
                    "language_info": {"name": "python"}}, parent=msg, ident=idents)
            elif kind == "execute_request":
                count += 1
                session.send(sock, "execute_reply", {
                    "status": "ok", "execution_count": count, "user_expressions": {},
                    "payload": []}, parent=msg, ident=idents)
            elif kind == "shutdown_request":
                session.send(sock, "shutdown_reply", {"status": "ok", "restart": False},
                             parent=msg, ident=idents)
                return
            session.send(iopub, "status", {"execution_state": "idle"}, parent=msg)


if __name__ == "__main__":
    main(sys.argv[1])
