"""The Host folds IOPub messages into notebook outputs without nbformat, and exactly as it.

``host/_outputs.py output_from_msg`` stands in for ``nbformat.v4.output_from_msg`` plus its
schema check (the kernel is untrusted: an output nbformat would refuse is not kept). Here
both judge thousands of messages, well-formed and hostile, and must agree on every one:
the same outputs, keys in the same order, and the same refusals. Then a real session shows
the Host keeps a cell's rich output without ever importing nbformat.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from typing import Any

import nbformat
import pytest

from host_kernel.host._outputs import output_from_msg

#: Values of every JSON shape, and a few a JSON parser never makes but a bug might pass.
ODD: list[Any] = [None, True, False, 0, -1, 3, 2**70, 1.0, -0.5, "", "x", "a\nb", [], ["a"],
                  ["a", 1], [["a"]], {}, {"k": "v"}, {"k": 1}, {"text/plain": "x"}]
MIMES = ["text/plain", "text/html", "image/png", "application/json", "application/vnd+json",
         "application/geo+json", "application/x.json", "application/json\n", "json",
         "text/json", "application/javascript", "Application/JSON", ""]
TYPES = ["execute_result", "display_data", "stream", "error", "status", "clear_output",
         "update_display_data", "", "EXECUTE_RESULT"]


def _pick(rng: random.Random, good: list[Any]) -> Any:
    """Mostly a value the schema allows; now and then any value at all."""
    return rng.choice(good) if rng.random() < 0.8 else rng.choice(ODD)


def _bundle(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return rng.choice(ODD)
    return {rng.choice(MIMES): _pick(rng, ["<b>x</b>", ["l1\n", "l2"], ""])
            for _ in range(rng.randrange(4))}


def _content(rng: random.Random, mtype: object) -> Any:
    if rng.random() < 0.03:
        return rng.choice(ODD)
    fields = {
        "execute_result": {"metadata": lambda: _pick(rng, [{}, {"a": 1}]),
                           "data": lambda: _bundle(rng),
                           "execution_count": lambda: rng.choice([None, 0, 1, 7, -1, True,
                                                                  1.0, "1", 2**64])},
        "display_data": {"metadata": lambda: _pick(rng, [{}, {"a": 1}]),
                         "data": lambda: _bundle(rng)},
        "stream": {"name": lambda: _pick(rng, ["stdout", "stderr", ""]),
                   "text": lambda: _pick(rng, ["out\n", ["a", "b"], ""])},
        "error": {"ename": lambda: _pick(rng, ["ValueError", ""]),
                  "evalue": lambda: _pick(rng, ["bad", ""]),
                  "traceback": lambda: _pick(rng, [[], ["t1", "t2"]])},
    }.get(mtype if isinstance(mtype, str) else "", {"data": lambda: _bundle(rng)})
    content = {}
    for name, make in fields.items():
        if rng.random() < 0.95:  # now and then a field is missing
            content[name] = make()
    if rng.random() < 0.2:
        content["transient"] = {"display_id": "d"}  # not part of an output: left out
    return content


def _nbformat(msg: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return dict(nbformat.v4.output_from_msg(msg))
    except (KeyError, TypeError, ValueError, nbformat.ValidationError):
        return None


def test_it_agrees_with_nbformat_on_every_message() -> None:
    rng = random.Random(20261206)
    kept = refused = 0
    for _ in range(4000):
        mtype = rng.choice(TYPES) if rng.random() < 0.9 else rng.choice(ODD)
        msg: dict[str, Any] = {"header": {"msg_type": mtype}, "content": _content(rng, mtype)}
        if rng.random() < 0.02:
            msg = {"content": msg["content"]}  # no header at all
        # What a kernel sends reaches the Host as JSON: compare on what JSON can carry.
        msg = json.loads(json.dumps(msg))
        expected, got = _nbformat(msg), output_from_msg(msg)
        assert got == expected, msg
        if got is not None:
            assert list(got) == list(expected or {}), msg  # same key order: same record bytes
            kept += 1
        else:
            refused += 1
    assert kept > 600 and refused > 600, (kept, refused)  # both sides well exercised


@pytest.mark.parametrize("msg", [
    {"header": {"msg_type": "stream"}, "content": {"name": "stdout", "text": ["a", "b"]}},
    {"header": {"msg_type": "execute_result"},
     "content": {"metadata": {}, "data": {"application/json": {"any": [1, None]}},
                 "execution_count": 0}},
    {"header": {"msg_type": "display_data"},
     "content": {"metadata": {}, "data": {"application/json\n": 5}}},
])
def test_edge_cases_nbformat_accepts_are_kept(msg: dict[str, Any]) -> None:
    assert output_from_msg(msg) == _nbformat(msg) is not None


@pytest.mark.parametrize("msg", [
    {"header": {"msg_type": "execute_result"},
     "content": {"metadata": {}, "data": {}, "execution_count": -1}},
    {"header": {"msg_type": "execute_result"},
     "content": {"metadata": {}, "data": {}, "execution_count": True}},
    {"header": {"msg_type": "display_data"}, "content": {"metadata": [], "data": {}}},
    {"header": {"msg_type": "display_data"},
     "content": {"metadata": {}, "data": {"text/plain": 5}}},
    {"header": {"msg_type": "error"},
     "content": {"ename": "E", "evalue": "v", "traceback": ["ok", 1]}},
    {"header": {"msg_type": "stream"}, "content": {"name": "stdout"}},
    {"header": {"msg_type": "status"}, "content": {"execution_state": "idle"}},
])
def test_what_nbformat_refuses_is_refused(msg: dict[str, Any]) -> None:
    assert _nbformat(msg) is None
    assert output_from_msg(msg) is None


def test_a_session_keeps_rich_output_without_importing_nbformat(tmp_path: Any) -> None:
    code = textwrap.dedent("""
        import json, sys
        from host_kernel import Host
        with Host(sys.argv[1], factory=False) as host:
            obs = host.execute("from IPython.display import HTML, display\\n"
                               "display(HTML('<b>hi</b>'))\\n"
                               "print('out')\\n"
                               "{'a': 1}")
            kinds = [o["output_type"] for o in obs.outputs]
            html = [o["data"]["text/html"] for o in obs.outputs if "data" in o
                    and "text/html" in o["data"]]
        print(json.dumps({"kinds": kinds, "html": html,
                          "nbformat": "nbformat" in sys.modules,
                          "jsonschema": "jsonschema" in sys.modules}))
    """)
    ws = tmp_path / "ws"
    ws.mkdir()
    done = subprocess.run([sys.executable, "-c", code, str(ws)], capture_output=True, text=True,
                          timeout=180, check=False, env={**__import__("os").environ,
                                                          "HOST_KERNEL_FACTORY": "off"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["kinds"] == ["display_data", "stream", "execute_result"], seen
    assert seen["html"] == ["<b>hi</b>"], seen
    assert seen["nbformat"] is False and seen["jsonschema"] is False, seen
