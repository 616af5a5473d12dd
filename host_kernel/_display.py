"""Rich displays of the values the Host hands to a notebook: small HTML and Markdown cards.

Owns the pieces every card is made of (a coloured status badge, shortened
hashes and ids with the whole value on hover, human-readable sizes, output
tails) and the card of each value (``receipt_html``, ``verdict_markdown``, …),
which it registers for the value types (:mod:`host_kernel._values`,
:class:`~host_kernel.lineage.model.Lineage`) in the table their ``_repr_*_``
methods look in (:mod:`host_kernel._displayed`, which also owns IPython's
display protocol around them, :func:`mimebundle`). The cards are not
evidence, only a view; the values do not import this module.

Everything shown comes from a record an agent wrote, so every string is escaped
(:func:`esc` for HTML, :func:`md` and :func:`fence` for Markdown) before it is
placed. Styles are inline (some frontends strip ``<style>``) and use borders
and translucent backgrounds, never a hard white, so cards read in light and
dark themes. The plain-text form stays the value's ``repr``-like text
(:func:`verdict_text` is a verdict's, kept with the values): it is what a
terminal shows, and what an agent reads in an Observation.

Imported with the values, by the modules that hand them out
(:mod:`host_kernel._models`, :mod:`host_kernel.lineage.graph`); it needs
nothing but the standard library.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any

from ._displayed import mimebundle, register
from ._values import Artifact, FileRecord, Observation, Receipt, Verdict, verdict_text
from .lineage.model import Lineage
from .lineage.svg import lineage_svg, short_name

__all__ = [
    "TONES",
    "artifact_html",
    "artifact_markdown",
    "badge",
    "card",
    "file_html",
    "file_markdown",
    "lineage_html",
    "lineage_markdown",
    "observation_html",
    "observation_markdown",
    "receipt_html",
    "receipt_markdown",
    "verdict_html",
    "verdict_markdown",
    "esc",
    "fence",
    "human_size",
    "md",
    "mimebundle",
    "pre",
    "row",
    "short",
    "wide",
    "short_hash",
    "tail",
    "verdict_text",
]

#: Badge colours: mid-brightness hues that read on light and dark backgrounds.
TONES = {
    "ok": "#2da44e",
    "bad": "#d1242f",
    "warn": "#bf8700",
    "info": "#4c78a8",
    "muted": "#888888",
}

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
# Markdown's inline markup; md() text never starts a line, so list, heading and
# quote markers need no escape.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")

_CARD_STYLE = (
    "border:1px solid rgba(128,128,128,0.45);border-left:4px solid {colour};"
    "border-radius:6px;padding:6px 10px;margin:2px 0;max-width:60em;"
    "background:rgba(128,128,128,0.06);font-family:ui-sans-serif,system-ui,sans-serif;"
    "font-size:13px;line-height:1.45;text-align:left"
)
# Rows are a table so labels line up; notebook stylesheets right-align and stripe
# table cells, so every cell says how it wants to look.
_TABLE_STYLE = "border-collapse:collapse;border:none;margin:0;width:auto"
_TR_STYLE = "background:transparent;border:none"
_CELL_STYLE = ("text-align:left;vertical-align:top;padding:1px 10px 1px 0;border:none;"
               "line-height:1.45;white-space:normal;font-weight:normal")
_LABEL_STYLE = _CELL_STYLE + ";opacity:0.7;white-space:nowrap"
_PRE_STYLE = (
    "margin:1px 0;padding:3px 6px;max-height:7.5em;overflow:auto;text-align:left;"
    "background:rgba(128,128,128,0.12);border-radius:4px;font-size:12px;"
    "white-space:pre-wrap;word-break:break-all"
)


def esc(text: object) -> str:
    """``text`` as HTML text or attribute value: escaped, control characters replaced."""
    return html.escape(_CONTROL.sub("\ufffd", str(text)), quote=True)


def short(text: object, limit: int = 80) -> str:
    """One line of at most ``limit`` characters, ending in … when cut (plain text)."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def short_hash(value: str | None, keep: int = 12) -> str:
    """HTML for a hash or id: its first ``keep`` characters and …, the whole in ``title``."""
    if not value:
        return "<span style='opacity:0.6'>none</span>"
    shown = value if len(value) <= keep + 1 else value[:keep] + "…"
    return f"<code title='{esc(value)}'>{esc(shown)}</code>"


def human_size(size: int | None) -> str:
    """Bytes as ``53 B``, ``1.2 KiB``, ``3.4 MiB``, …"""
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop always returns


def tail(text: str, lines: int = 4, chars: int = 300) -> str:
    """The last ``lines`` lines of ``text``, at most ``chars`` characters, … when cut."""
    body = text.rstrip("\n")
    kept = body.split("\n")[-lines:]
    out = "\n".join(kept)
    if len(out) > chars:
        out = out[-chars:]
    return ("…" + out) if out != body else out


def badge(label: str, tone: str) -> str:
    """A small coloured badge (HTML) with ``label``; ``tone`` is a key of :data:`TONES`."""
    colour = TONES.get(tone, TONES["muted"])
    return (
        f"<span style='display:inline-block;padding:0 7px;border-radius:9px;"
        f"border:1px solid {colour};color:{colour};background:{colour}22;"
        f"font-weight:600;font-size:11px;line-height:1.6'>{esc(label)}</span>"
    )


def row(label: str, value_html: str, attrs: str = "", label_style: str = "") -> str:
    """One labelled line of a card (a table row); ``value_html`` is HTML the caller has
    escaped, ``attrs`` extra attributes for the row (escaped too), ``label_style`` CSS
    added to the label's."""
    return (f"<tr style='{_TR_STYLE}'{attrs}>"
            f"<td style='{_LABEL_STYLE}{';' + label_style if label_style else ''}'>"
            f"{esc(label)}</td><td style='{_CELL_STYLE}'>{value_html}</td></tr>")


def pre(text: str) -> str:
    """A short, scrollable block of output text under the row above it (HTML)."""
    return (f"<tr style='{_TR_STYLE}'><td style='{_CELL_STYLE}'></td><td style='{_CELL_STYLE}'>"
            f"<pre style='{_PRE_STYLE}'>{esc(text)}</pre></td></tr>")


def wide(content_html: str) -> str:
    """A row across the whole card (HTML the caller has escaped)."""
    return (f"<tr style='{_TR_STYLE}'><td colspan='2' style='{_CELL_STYLE}'>"
            f"{content_html}</td></tr>")


def card(kind: str, heading_html: str, body: Iterable[str], *, tone: str) -> str:
    """A card: ``kind`` (``receipt``, ``artifact``, …) names it in ``data-hk-card``.

    ``heading_html`` and ``body`` (rows from :func:`row`, :func:`pre`,
    :func:`wide`) are HTML the caller has escaped.
    """
    colour = TONES.get(tone, TONES["muted"])
    rows = "".join(body)
    table = f"<table style='{_TABLE_STYLE}'><tbody>{rows}</tbody></table>" if rows else ""
    return (
        f"<div data-hk-card='{esc(kind)}' style='{_CARD_STYLE.format(colour=colour)}'>"
        f"<div style='margin-bottom:3px'>{heading_html}</div>{table}</div>"
    )


def md(text: object) -> str:
    """``text`` as inline Markdown: one line, punctuation escaped, HTML characters as
    entities (Markdown passes raw HTML through)."""
    one = " ".join(_CONTROL.sub("\ufffd", str(text)).split())
    return html.escape(_MD_SPECIAL.sub(r"\\\1", one), quote=False)


def fence(text: str) -> str:
    """``text`` in a fenced code block longer than any run of backticks inside it."""
    longest = max((len(m) for m in re.findall("`+", text)), default=0)
    bar = "`" * max(3, longest + 1)
    return f"{bar}\n{_CONTROL.sub(chr(0xFFFD), text)}\n{bar}"


# --------------------------------------------------------------------------- the cards


def _hash_line(size: int | None, sha256: str | None) -> str:
    return (f"<span title='{esc(size)} bytes'>{esc(human_size(size))}</span> · sha256 "
            + short_hash(sha256))


def _cell_line(cell_id: str, generation: int) -> str:
    return f"<code>{esc(cell_id)}</code> · generation {esc(generation)}"


def _receipt_state(r: Receipt) -> tuple[str, str]:
    if r.timed_out:
        return "timed out", "bad"
    if r.signal is not None:
        return "killed", "bad"
    return ("ok", "ok") if r.exit_status == 0 else ("failed", "bad")


_CHANGES_SHOWN = 8


def receipt_html(r: Receipt) -> str:
    label, tone = _receipt_state(r)
    heading = (f"{badge(label, tone)} <b>Receipt</b> "
               f"<code title='{esc(r.command)}'>{esc(short(r.command, 100))}</code>")
    body = [
        row("outcome", f"{esc(r.outcome())} in {r.duration:.3f} s"),
        row("cell", _cell_line(r.cell_id, r.generation)),
        row("receipt", short_hash(r.receipt_id, 8)),
        row("stdout", _hash_line(r.stdout_size, r.stdout_sha256)),
    ]
    if r.stdout_tail.strip():
        body.append(pre(tail(r.stdout_tail)))
    body.append(row("stderr", _hash_line(r.stderr_size, r.stderr_sha256)))
    if r.stderr_tail.strip():
        body.append(pre(tail(r.stderr_tail)))
    if r.changes:
        shown = ", ".join(f"{esc(c.change)} <code>{esc(c.path)}</code>"
                          + (f" ({esc(human_size(c.size))})" if c.size is not None else "")
                          for c in r.changes[:_CHANGES_SHOWN])
        more = len(r.changes) - _CHANGES_SHOWN
        if more > 0 or r.changes_truncated:
            shown += f", +{max(more, 0)} more" if more > 0 else ", … (list cut)"
        body.append(row("changed", shown))
    warnings = []
    if r.executable_in_workspace:
        warnings.append(f"the executable is inside the workspace: <code>{esc(r.executable)}</code>")
    if r.path_differs:
        warnings.append("PATH differs from the kernel's launch PATH")
    if r.shadowed_modules:
        warnings.append("shadowed modules: " + esc(", ".join(r.shadowed_modules)))
    if warnings:
        body.append(row("note", badge("note", "warn") + " " + "; ".join(warnings)))
    return card("receipt", heading, body, tone=tone)


def receipt_markdown(r: Receipt) -> str:
    label, _ = _receipt_state(r)
    lines = [
        f"**Receipt** · {label} · {md(r.outcome())} in {r.duration:.3f} s  ",
        f"command: {md(short(r.command, 200))}  ",
        f"cell {md(r.cell_id)} (generation {r.generation}) · receipt {md(r.receipt_id[:8])}…  ",
        f"stdout {human_size(r.stdout_size)} · stderr {human_size(r.stderr_size)}"
        + (f" · {len(r.changes)} file(s) changed" if r.changes else ""),
    ]
    out = "\n".join(lines)
    if r.stdout_tail.strip():
        out += "\n\n" + fence(tail(r.stdout_tail))
    if r.stderr_tail.strip():
        out += "\n\nstderr:\n\n" + fence(tail(r.stderr_tail))
    return out + "\n"


def artifact_html(a: Artifact) -> str:
    heading = f"{badge('saved', 'info')} <b>Artifact</b> <code>{esc(a.filename)}</code>"
    body = [
        row("size", f"<span title='{esc(a.size)} bytes'>{esc(human_size(a.size))}</span>"
                    f" · {esc(a.media_type)}"),
        row("sha256", short_hash(a.sha256)),
        row("artifact", short_hash(a.artifact_id, 8)),
        row("made by", "cell " + _cell_line(a.cell_id, a.generation)),
    ]
    if a.source_path and a.source_path != a.filename:
        body.append(row("from", f"<code>{esc(a.source_path)}</code>"))
    return card("artifact", heading, body, tone="info")


def artifact_markdown(a: Artifact) -> str:
    return (f"**Artifact** {md(a.filename)} · {human_size(a.size)} · {md(a.media_type)}  \n"
            f"sha256 {a.sha256[:12]}… · artifact {md(a.artifact_id)}  \n"
            f"made by cell {md(a.cell_id)} (generation {a.generation})\n")


def file_html(f: FileRecord) -> str:
    heading = f"{badge('written', 'ok')} <b>File</b> <code>{esc(f.path)}</code>"
    return card("file", heading, [row("size", _hash_line(f.size, f.sha256))], tone="ok")


def file_markdown(f: FileRecord) -> str:
    return f"**File** {md(f.path)} · {human_size(f.size)} · sha256 {md(f.sha256[:12])}…\n"


def _ordered_checks(v: Verdict) -> list[tuple[str, str, Any]]:
    """(mark, tone, check): blocking failures first, then advice, then what passed."""
    failed = [("✗", "bad", c) for c in v.checks if not c.ok and not c.advisory]
    advice = [("!", "warn", c) for c in v.checks if not c.ok and c.advisory]
    passed = [("✓", "ok", c) for c in v.checks if c.ok]
    return failed + advice + passed


def verdict_html(v: Verdict) -> str:
    tone = "ok" if v.accepted else "bad"
    heading = (f"{badge('accepted' if v.accepted else 'refused', tone)} <b>Verdict</b> "
               f"{short_hash(v.submission_id, 8)} · {esc(v.mode)}"
               + (" (armed)" if v.armed else ""))
    body = []
    for mark, mtone, c in _ordered_checks(v):
        colour = TONES[mtone]
        extra = " " + badge("advisory", "warn") if c.advisory else ""
        style = "" if c.ok else f" style='color:{colour}'"
        body.append(row(
            mark,
            f"<code{style}>{esc(c.code)}</code>{extra} "
            f"<span style='opacity:{1 if not c.ok else 0.75}'>{esc(short(c.message, 300))}</span>",
            f" data-check='{esc(c.code)}' data-ok='{str(c.ok).lower()}'"
            f" title='{'passed' if c.ok else 'failed'}'",
            f"opacity:1;color:{colour};font-weight:700",
        ))
    for rep in v.reproduction:
        outcome = str(rep.get("outcome", "?"))
        body.append(row("reproduction", badge(outcome, "ok" if outcome == "passed" else "bad")
                        + f" <code>{esc(short(rep.get('command', ''), 100))}</code>"))
    return card("verdict", heading, body, tone=tone)


def verdict_markdown(v: Verdict) -> str:
    head = (f"**Verdict** · {'accepted' if v.accepted else 'refused'} · {md(v.mode)}"
            + (" (armed)" if v.armed else "") + f" · submission {md(v.submission_id)}\n")
    lines = [f"- {mark} {md(c.code)}" + (" (advisory)" if c.advisory else "")
             + f": {md(short(c.message, 300))}" for mark, _, c in _ordered_checks(v)]
    return head + "\n" + "\n".join(lines) + "\n"


_KIND_WORDS = {"artifact": ("artifact", "artifacts"), "file": ("file", "files"),
               "cell": ("cell", "cells"), "receipt": ("command", "commands")}
_LINEAGE_LISTED = 12


def _kind_counts(g: Lineage) -> str:
    counts: dict[str, int] = {}
    for n in g.nodes:
        counts[n.kind] = counts.get(n.kind, 0) + 1
    return " · ".join(f"{k} {_KIND_WORDS.get(kind, (kind, kind))[k != 1]}"
                      for kind, k in counts.items())


def lineage_html(g: Lineage) -> str:
    root = next((n for n in g.nodes if n.id == g.root), None)
    name = root.label if root else g.root
    heading = (f"{badge('lineage', 'info')} <b>Lineage</b> of <code>{esc(name)}</code> "
               f"<span style='opacity:0.7'>{esc(_kind_counts(g))}"
               + (" · cut at the node bound" if g.truncated else "") + "</span>")
    body = [wide(f"<div style='overflow:auto;max-height:32em'>{lineage_svg(g)}</div>")]
    for n in g.nodes[:_LINEAGE_LISTED]:
        sha = n.attrs.get("sha256")
        body.append(row(
            n.kind,
            f"<code title='{esc(n.label)}'>{esc(short_name(n))}</code>"
            + (f" · sha256 {short_hash(str(sha))}" if sha else ""),
            f" data-node='{esc(n.id)}'"))
    if len(g.nodes) > _LINEAGE_LISTED:
        body.append(wide(f"<span style='opacity:0.7'>+{len(g.nodes) - _LINEAGE_LISTED} "
                         "more</span>"))
    return card("lineage", heading, body, tone="info")


def lineage_markdown(g: Lineage) -> str:
    root = next((n for n in g.nodes if n.id == g.root), None)
    head = f"**Lineage** of {md(root.label if root else g.root)} · {md(_kind_counts(g))}\n\n"
    return head + fence(g.to_text().rstrip("\n")) + "\n"


_STATUS_TONES = {"ok": "ok", "error": "bad"}


def observation_html(o: Observation) -> str:
    tone = _STATUS_TONES.get(o.status, "warn")
    heading = (f"{badge(o.status, tone)} <b>Observation</b> cell <code>{esc(o.cell_id)}</code>"
               f" · generation {esc(o.generation)}"
               + (f" · In [{esc(o.execution_count)}]" if o.execution_count is not None else "")
               + f" · {o.duration:.3f} s")
    body = [pre(tail(o.text, lines=12, chars=1500))] if o.text.strip() else []
    if o.notice:
        body.append(row("notice", badge("notice", "warn") + " " + esc(o.notice)))
    return card("observation", heading, body, tone=tone)


def observation_markdown(o: Observation) -> str:
    head = (f"**Observation** · {md(o.status)} · cell {md(o.cell_id)} · generation "
            f"{o.generation} · {o.duration:.3f} s\n")
    out = head + ("\n" + fence(tail(o.text, lines=12, chars=1500)) + "\n" if o.text.strip() else "")
    if o.notice:
        out += f"\nnotice: {md(o.notice)}\n"
    return out


# --------------------------------------------------------------------------- registered

register(Observation, {"text/html": observation_html, "text/markdown": observation_markdown})
register(FileRecord, {"text/html": file_html, "text/markdown": file_markdown})
register(Receipt, {"text/html": receipt_html, "text/markdown": receipt_markdown})
register(Artifact, {"text/html": artifact_html, "text/markdown": artifact_markdown})
register(Verdict, {"text/html": verdict_html, "text/markdown": verdict_markdown})
register(Lineage, {"text/html": lineage_html, "text/markdown": lineage_markdown,
                   "image/svg+xml": lineage_svg})
