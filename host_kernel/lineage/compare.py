"""How an artifact's recorded bytes compare with the bytes a re-derivation wrote.

Owns :func:`compare_bytes` and its answer, :class:`Comparison`: the outcome
(``reproduced`` when the bytes are the same, or when a ``tolerance`` was given
and every value of a CSV or Parquet table is equal within it; else
``differs``), what kind of content was compared, a one-line summary, a short
diff a person can read (unified for text, a cell list for tables, pixel counts
for images, a hex window for the rest) and, when the difference has a common
cause, a hint naming it (a timestamp, or randomness the code never seeded).

It is pure: it reads nothing but its arguments, starts nothing and does not
know the Host or the record. Text is diffed only up to :data:`TEXT_DIFF_LIMIT`
bytes and tables parsed only up to :data:`TABLE_LIMIT`; beyond that, and for
content it cannot parse, it reports the sizes and the first differing byte, so
a GiB pair costs a few linear passes, never quadratic work. Pillow and
pyarrow are used when importable; without them images and Parquet files are
compared as binary. The diff never holds control characters (they are written
as ``\\xNN``) but is not escaped for any terminal or markup: callers do that.

Rows are counted from 1, a CSV's header row not counted (it is ``header``);
columns are named by the expected side's header, or ``#N`` (from 1).
"""

from __future__ import annotations

import codecs
import csv
import difflib
import importlib
import io
import math
import re
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from itertools import zip_longest
from typing import Any

__all__ = ["TABLE_LIMIT", "TEXT_DIFF_LIMIT", "Comparison", "compare_bytes"]

#: Largest side (bytes) diffed line by line; larger text gets its first differing line.
TEXT_DIFF_LIMIT = 4 << 20
#: Largest side (bytes) parsed as a CSV or Parquet table.
TABLE_LIMIT = 8 << 20
#: Most lines (both sides) handed to difflib once the common head and tail are set aside.
DIFFLIB_LINES = 4000
#: Most lines a side paired line by line when difflib would take too long.
POSITIONAL_LINES = 500_000
#: Most pixels of an image compared pixel by pixel.
PIXEL_LIMIT = 40_000_000
#: Most Parquet cells read into Python to list differences.
CELL_BUDGET = 1_000_000
MAX_DIFF_LINES = 40
MAX_DIFF_CHARS = 4000
MAX_LINE = 200

#: How a name's suffix says to read the bytes; other names are sniffed.
_SUFFIXES = {
    **dict.fromkeys((".txt", ".md", ".json", ".jsonl", ".svg", ".html", ".htm", ".xml", ".py",
                     ".log", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".rst", ".tex", ".js",
                     ".css", ".ipynb", ".r", ".sh", ".sql"), "text"),
    ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet",
    **dict.fromkeys((".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff"), "image"),
}
Opcode = tuple[str, int, int, int, int]


@dataclass(frozen=True, slots=True)
class Comparison:
    """What comparing the recorded bytes with the re-derived bytes found."""

    outcome: str  # "reproduced" | "differs"
    kind: str  # "identical" | "text" | "csv" | "parquet" | "image" | "binary"
    summary: str  # one line
    diff: str  # at most MAX_DIFF_LINES lines (plus one "… N more" line), MAX_DIFF_CHARS chars
    hint: str | None  # a likely cause of the difference, when one shows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_bytes(expected: bytes, got: bytes, *, name: str = "", code: str = "",
                  tolerance: float | None = None) -> Comparison:
    """Compare ``expected`` (the recorded bytes) with ``got`` (the re-derived bytes).

    ``name`` (the artifact's file name) picks how the content is read, with the
    bytes themselves sniffed when its suffix says nothing; ``code`` (the slice
    that re-derived it) is only read for the randomness hint. ``tolerance``
    makes numbers in CSV and Parquet cells equal when ``math.isclose`` with
    ``rel_tol=abs_tol=tolerance`` says so; it must be finite and not negative.
    """
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, not {tolerance!r}")
    if expected == got:
        return Comparison("reproduced", "identical", f"identical ({_size(len(got))})", "", None)
    kind = _kind(name, expected, got)
    if kind in ("csv", "tsv") and max(len(expected), len(got)) <= TABLE_LIMIT:
        table = _compare_csv(expected, got, "\t" if kind == "tsv" else ",", tolerance, code)
        if table is not None:
            return table
    if kind in ("text", "csv", "tsv"):
        return _compare_text(expected, got, name, code)
    result = (_compare_parquet(expected, got, tolerance, code) if kind == "parquet"
              else _compare_image(expected, got, code) if kind == "image" else None)
    if isinstance(result, Comparison):
        return result
    return _compare_binary(expected, got, code, note=result)


# --- what the content is ------------------------------------------------------------------

def _kind(name: str, expected: bytes, got: bytes) -> str:
    base = name.lower().rpartition("/")[2]
    if "." in base and base[base.rfind("."):] in _SUFFIXES:
        return _SUFFIXES[base[base.rfind("."):]]
    a, b = _sniff(expected), _sniff(got)
    return a if a == b else "binary"


def _sniff(data: bytes) -> str:
    if data[:4] == b"PAR1":
        return "parquet"
    if (data[:8] == b"\x89PNG\r\n\x1a\n" or data[:3] == b"\xff\xd8\xff" or data[:4] == b"GIF8"
            or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")):
        return "image"
    head = data[:1 << 16]
    try:
        # An incremental decoder accepts a character the 64 KiB cut split in two.
        codec = "utf-8-sig" if head[:3] == b"\xef\xbb\xbf" else "utf-8"
        codecs.getincrementaldecoder(codec)().decode(head, final=len(data) <= len(head))
    except UnicodeDecodeError:
        return "binary"
    return "binary" if b"\x00" in head else "text"


# --- text ---------------------------------------------------------------------------------

def _compare_text(expected: bytes, got: bytes, name: str, code: str) -> Comparison:
    if max(len(expected), len(got)) > TEXT_DIFF_LIMIT:
        return _first_line_difference(expected, got, code, "too large to diff line by line")
    a, b = _lines(_decode(expected)), _lines(_decode(got))
    head, tail, limit = 0, 0, min(len(a), len(b))
    while head < limit and a[head] == b[head]:
        head += 1
    while tail < limit - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    am, bm = a[head:len(a) - tail], b[head:len(b) - tail]
    if not am and not bm:
        return _compare_binary(expected, got, code, kind="text",
                               note="the text is equal once decoded (invalid UTF-8 differs)")
    # Diff the differing middle, with one line of the common head and tail as context.
    ctx = max(head - 1, 0)
    sa, sb = a[ctx:len(a) - max(tail - 1, 0)], b[ctx:len(b) - max(tail - 1, 0)]
    opcodes: Sequence[Opcode]
    if len(am) + len(bm) <= DIFFLIB_LINES:
        opcodes = difflib.SequenceMatcher(None, sa, sb).get_opcodes()
    elif len(am) == len(bm) and len(am) <= POSITIONAL_LINES:
        opcodes = _positional(sa, sb)  # difflib is quadratic when many lines changed in place
    else:
        return _first_line_difference(expected, got, code, "too many differing lines to diff "
                                      f"({len(a)} lines vs {len(b)})")
    differing = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in opcodes if tag != "equal")
    summary = f"{differing} of {max(len(a), len(b))} lines differ"
    if len(a) != len(b):
        summary += f" ({len(a)} lines vs {len(b)})"
    out, label = _Bounded(), f" {name}" if name else ""
    out.add(f"--- expected{label}")
    out.add(f"+++ got{label}")
    blocks: list[tuple[list[str], list[str]]] = []
    for group in _grouped(opcodes):
        i0, j0, i9, j9 = group[0][1], group[0][3], group[-1][2], group[-1][4]
        out.add(f"@@ -{_range(ctx + i0, i9 - i0)} +{_range(ctx + j0, j9 - j0)} @@")
        for tag, i1, i2, j1, j2 in group:
            old, new = sa[i1:i2], sb[j1:j2]
            if tag == "replace" and len(blocks) < 200:
                blocks.append((old[:50], new[:50]))
            if out.dropped:  # the diff is full: count what is left without drawing it
                out.dropped += len(old) + (len(new) if tag != "equal" else 0)
                continue
            if tag == "equal":
                for line in old:
                    out.add(" " + _show_line(line))
                continue
            cols = [_first_col(x, y) for x, y in zip(old, new)]
            for sign, lines in (("-", old), ("+", new)):
                for k, line in enumerate(lines):
                    out.add(sign + _show_line(line, cols[k] if k < len(cols) else 0))
    return Comparison("differs", "text", summary, out.text("lines"), _hint(blocks, code))


def _positional(a: list[str], b: list[str]) -> list[Opcode]:
    """Opcodes pairing line i with line i, for two sides of the same length."""
    ops: list[Opcode] = []
    i = 0
    while i < len(a):
        same, j = a[i] == b[i], i + 1
        while j < len(a) and (a[j] == b[j]) == same:
            j += 1
        ops.append(("equal" if same else "replace", i, j, i, j))
        i = j
    return ops


def _grouped(opcodes: Sequence[Opcode], n: int = 1) -> Iterable[list[Opcode]]:
    """Hunks with ``n`` lines of context, as ``difflib.SequenceMatcher.get_grouped_opcodes``."""
    codes = list(opcodes)
    if codes and codes[0][0] == "equal":
        _, i1, i2, j1, j2 = codes[0]
        codes[0] = ("equal", max(i1, i2 - n), i2, max(j1, j2 - n), j2)
    if codes and codes[-1][0] == "equal":
        _, i1, i2, j1, j2 = codes[-1]
        codes[-1] = ("equal", i1, min(i2, i1 + n), j1, min(j2, j1 + n))
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * n:
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


def _first_line_difference(expected: bytes, got: bytes, code: str, why: str) -> Comparison:
    """The first line that differs, found in linear time, for text too big to diff."""
    at = _first_difference(expected, got)
    line_no = expected.count(b"\n", 0, at) + 1
    start = expected.rfind(b"\n", 0, at) + 1
    (old, col), (new, _) = _line_at(expected, start, at), _line_at(got, start, at)
    summary = (f"text of {_size(len(expected))} vs {_size(len(got))}, {why}; "
               f"first difference at line {line_no} (byte {at:,})")
    out = _Bounded()
    out.add(f"line {line_no}, expected: {_show(old, col)}")
    out.add(f"line {line_no}, got:      {_show(new, col)}")
    return Comparison("differs", "text", summary, out.text("lines"), _hint([([old], [new])], code))


def _line_at(data: bytes, start: int, at: int) -> tuple[str, int]:
    """The line of ``data`` from ``start`` around byte ``at``, and the column of ``at`` in it."""
    end = data.find(b"\n", start)
    end = len(data) if end < 0 else end
    # A window around the difference, so that a 1 GiB line is not decoded whole.
    lo, hi = max(start, at - 4 * MAX_LINE), min(end, at + 4 * MAX_LINE)
    before = ("…" if lo > start else "") + _decode(data[lo:at])
    return before + _decode(data[at:hi]) + ("…" if hi < end else ""), len(before)


def _decode(data: bytes) -> str:
    return data.decode("utf-8-sig" if data[:3] == b"\xef\xbb\xbf" else "utf-8", "replace")


def _lines(text: str) -> list[str]:
    """Lines split on ``\\n`` only, each keeping it, so ``\\r\\n`` against ``\\n`` shows."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _range(start: int, length: int) -> str:
    """A unified diff hunk range, as difflib writes it."""
    return f"{start + 1}" if length == 1 else f"{start + (length > 0)},{length}"


def _first_col(a: str, b: str) -> int:
    """Where ``a`` and ``b`` first differ, by bisection on slices (long lines are common)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ufeff]")


def _show_line(line: str, col: int = 0) -> str:
    """A line of a text diff, its newline dropped (its absence said)."""
    if line.endswith("\n"):
        return _show(line.removesuffix("\n"), col)
    return _show(line, col) + " (no newline at end)"


def _show(text: str, col: int = 0) -> str:
    """Text for the diff: a window around ``col`` when long, control characters written out."""
    if len(text) > MAX_LINE:
        lo = max(0, min(col - MAX_LINE // 3, len(text) - MAX_LINE))
        text = ("…" if lo else "") + text[lo:lo + MAX_LINE] + (
            "…" if lo + MAX_LINE < len(text) else "")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                        else f"\\u{ord(m.group()):04x}", text)


class _Bounded:
    """Diff lines up to MAX_DIFF_LINES and MAX_DIFF_CHARS, then a count of the rest."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.chars = self.dropped = 0

    def add(self, line: str) -> None:
        if self.dropped or len(self.lines) >= MAX_DIFF_LINES \
                or self.chars + len(line) + 1 > MAX_DIFF_CHARS - 40:
            self.dropped += 1
            return
        self.lines.append(line)
        self.chars += len(line) + 1

    def text(self, what: str) -> str:
        more = [f"… {self.dropped} more {what}"] if self.dropped else []
        return "\n".join(self.lines + more)


# --- CSV ----------------------------------------------------------------------------------

def _compare_csv(expected: bytes, got: bytes, delimiter: str, tolerance: float | None,
                 code: str) -> Comparison | None:
    """A cell by cell comparison, or None when either side is not a readable CSV."""
    try:
        ra = list(csv.reader(io.StringIO(_decode(expected), newline=""), delimiter=delimiter))
        rb = list(csv.reader(io.StringIO(_decode(got), newline=""), delimiter=delimiter))
    except csv.Error:
        return None
    header = (ra[0] if ra else []) or (rb[0] if rb else [])

    def column(c: int) -> str:
        return header[c] if c < len(header) and header[c] else f"#{c + 1}"

    out = _Bounded()
    cells = _Cells(tolerance, out)
    for r, (row_a, row_b) in enumerate(zip(ra, rb)):
        if row_a != row_b:
            for c, (x, y) in enumerate(zip_longest(row_a, row_b)):
                if x != y:
                    cells.differ(f"row {r}" if r else "header", column(c), x, y)
    lo, hi = sorted((max(len(ra), 1), max(len(rb), 1)))
    if lo < hi:  # data rows lo..hi-1 are on one side only
        side = "got" if len(rb) > len(ra) else "expected"
        out.add(f"rows {lo} to {hi - 1} only in {side}" if hi - 1 > lo else f"row {lo} only in {side}")
    shape_a, shape_b = _shape(ra), _shape(rb)
    parts = [f"shape {shape_a} vs {shape_b}"] if shape_a != shape_b else []
    parts += [cells.said()] if cells.count else []
    if not parts and tolerance is not None:
        return _within(tolerance, "csv")
    if not parts:
        text = _compare_text(expected, got, "", code)
        return Comparison("differs", "csv", "every cell is equal; the bytes differ (quoting, "
                          "whitespace or line endings)", text.diff, None)
    return Comparison("differs", "csv", "; ".join(parts), out.text("differences"),
                      _hint(cells.blocks, code))


def _within(tolerance: float, kind: str) -> Comparison:
    return Comparison("reproduced", kind, f"equal within tolerance {tolerance:g} (bytes differ)",
                      "", None)


class _Cells:
    """Differing cells of a table: counted, the largest numeric difference kept, a few listed."""

    def __init__(self, tolerance: float | None, out: _Bounded) -> None:
        self.tolerance, self.out = tolerance, out
        self.count, self.max_abs = 0, 0.0
        self.blocks: list[tuple[list[str], list[str]]] = []  # for the hints

    def differ(self, row: str, column: str, x: object, y: object) -> None:
        """Cells ``x`` and ``y`` are not equal as values: count them unless numbers close enough."""
        fx, fy = _number(x), _number(y)
        if fx is not None and fy is not None:
            if (math.isnan(fx) and math.isnan(fy)) or (self.tolerance is not None and math.isclose(
                    fx, fy, rel_tol=self.tolerance, abs_tol=self.tolerance)):
                return
            if math.isfinite(fx - fy):
                self.max_abs = max(self.max_abs, abs(fx - fy))
        self.count += 1
        if len(self.blocks) < 200:
            self.blocks.append(([str(x)], [str(y)]))
        if self.out.dropped:  # the diff is full: do not build lines no one sees
            self.out.dropped += 1
        else:
            self.out.add(f"{row}, column {column}: {_cell(x)} → {_cell(y)}")

    def said(self) -> str:
        said = "1 cell differs" if self.count == 1 else f"{self.count} cells differ"
        return said + (f" (max abs {self.max_abs:.3g})" if self.max_abs else "")


def _shape(rows: list[list[str]]) -> str:
    width = max((len(r) for r in rows), default=0)
    return f"{max(len(rows) - 1, 0)} rows x {width} columns"


def _cell(value: object) -> str:
    shown = "(missing)" if value is None else repr(value)
    return _show(shown[:77] + "…" if len(shown) > 80 else shown)


def _number(value: object) -> float | None:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except (ValueError, OverflowError):
            return None
    return None


# --- Parquet ------------------------------------------------------------------------------

def _compare_parquet(expected: bytes, got: bytes, tolerance: float | None,
                     code: str) -> Comparison | str:
    """A schema, shape and cell comparison through pyarrow, or why there is none."""
    if max(len(expected), len(got)) > TABLE_LIMIT:
        return f"over {_size(TABLE_LIMIT)}, not read as a table"
    try:
        pa: Any = importlib.import_module("pyarrow")
        pq: Any = importlib.import_module("pyarrow.parquet")
    except ImportError:
        return "pyarrow is not installed"
    try:
        ta = pq.read_table(pa.BufferReader(expected))
        tb = pq.read_table(pa.BufferReader(got))
        return _compare_tables(ta, tb, tolerance, code)
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        return f"not readable as Parquet: {_show(str(e).splitlines()[0][:120] if str(e) else '')}"


def _compare_tables(ta: Any, tb: Any, tolerance: float | None, code: str) -> Comparison:
    out = _Bounded()
    parts: list[str] = []
    types_a = {f.name: str(f.type) for f in ta.schema}
    types_b = {f.name: str(f.type) for f in tb.schema}
    for col, type_a in types_a.items():
        if col not in types_b:
            out.add(f"column {col} only in expected")
        elif type_a != types_b[col]:
            out.add(f"column {col}: type {type_a} → {types_b[col]}")
    for col in types_b:
        if col not in types_a:
            out.add(f"column {col} only in got")
    if list(types_a.items()) != list(types_b.items()):
        parts.append("schema differs")
    if ta.num_rows != tb.num_rows or ta.num_columns != tb.num_columns:
        parts.append(f"shape {ta.num_rows} rows x {ta.num_columns} columns vs "
                     f"{tb.num_rows} rows x {tb.num_columns} columns")
    rows = min(ta.num_rows, tb.num_rows)
    cells, budget = _Cells(tolerance, out), CELL_BUDGET
    for col in [c for c in types_a if c in types_b]:
        xa, xb = ta.column(col).slice(0, rows), tb.column(col).slice(0, rows)
        if xa.equals(xb):
            continue
        if rows > budget:
            parts.append(f"column {col} differs (too many rows to compare cell by cell)")
            continue
        budget -= rows
        for r, (x, y) in enumerate(zip(xa.to_pylist(), xb.to_pylist()), 1):
            if x != y:
                cells.differ(f"row {r}", col, x, y)
    parts += [cells.said()] if cells.count else []
    if parts:
        return Comparison("differs", "parquet", "; ".join(parts), out.text("differences"),
                          _hint(cells.blocks, code))
    if tolerance is not None:
        return _within(tolerance, "parquet")
    blocks = []
    meta_a, meta_b = ta.schema.metadata or {}, tb.schema.metadata or {}
    for key in sorted(meta_a.keys() | meta_b.keys()):
        x, y = meta_a.get(key), meta_b.get(key)
        if x != y:
            out.add(f"metadata {_cell(key.decode('utf-8', 'replace'))} differs")
            blocks.append(([_decode(x or b"")[:4000]], [_decode(y or b"")[:4000]]))
    return Comparison("differs", "parquet",
                      f"the table is equal ({ta.num_rows} rows x {ta.num_columns} columns); "
                      "the files differ in metadata or encoding", out.text("differences"),
                      _timestamp_hint(blocks))


# --- images -------------------------------------------------------------------------------

def _compare_image(expected: bytes, got: bytes, code: str) -> Comparison | str:
    """Size, mode and pixels through Pillow, or why there is no such comparison."""
    try:
        image: Any = importlib.import_module("PIL.Image")
        chops: Any = importlib.import_module("PIL.ImageChops")
    except ImportError:
        return "Pillow is not installed"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", image.DecompressionBombWarning)
            ia, ib = image.open(io.BytesIO(expected)), image.open(io.BytesIO(got))
            sizes = f"{ia.width}x{ia.height} vs {ib.width}x{ib.height}"
            out = _Bounded()
            out.add(f"format {ia.format} vs {ib.format}, size {sizes}, mode {ia.mode} vs {ib.mode}")
            frames = (getattr(ia, "n_frames", 1), getattr(ib, "n_frames", 1))
            if frames[0] != frames[1]:
                out.add(f"frames {frames[0]} vs {frames[1]} (only the first is compared)")
            total = ia.width * ia.height
            if ia.size != ib.size or total > PIXEL_LIMIT:
                why = "size differs" if ia.size != ib.size else "too many pixels to compare"
                return Comparison("differs", "image", f"image {sizes} ({why})", out.text("lines"),
                                  None)
            ia.load()
            ib.load()
    except (OSError, ValueError, SyntaxError, EOFError, image.DecompressionBombError) as e:
        return f"not readable as an image: {_show(str(e).splitlines()[0][:120] if str(e) else '')}"
    common = ia.mode if ia.mode == ib.mode and ia.mode in ("L", "RGB", "RGBA") else "RGBA"
    pa, pb = ia.convert(common), ib.convert(common)
    bands = chops.difference(pa, pb).split()
    largest = bands[0]  # the largest channel difference of each pixel
    for band in bands[1:]:
        largest = chops.lighter(largest, band)
    histogram = largest.histogram()
    differing = total - histogram[0]
    if not differing:
        blocks: list[tuple[list[str], list[str]]] = []
        for key in sorted(set(ia.info) | set(ib.info), key=str):
            x, y = ia.info.get(key), ib.info.get(key)
            if x != y:
                out.add(f"metadata {key}: {_cell(x)} → {_cell(y)}")
                blocks.append(([str(x)], [str(y)]))
        return Comparison("differs", "image", f"image {sizes}, pixels identical; the files differ "
                          "in metadata or encoding", out.text("lines"), _timestamp_hint(blocks))
    peak = max(i for i, n in enumerate(histogram) if n)
    pct = 100 * differing / total
    shown = f"{pct:.1f}%" if pct >= 0.1 else f"{pct:.2g}%"
    x0, y0, x1, y1 = largest.getbbox()
    out.add(f"{differing:,} of {total:,} pixels differ, all within x {x0}..{x1 - 1}, "
            f"y {y0}..{y1 - 1}; largest channel difference {peak}")
    width = x1 - x0
    # The largest difference is one byte a pixel: the first few non-zero ones, found in C.
    for k, m in enumerate(re.finditer(rb"[^\x00]", largest.crop((x0, y0, x1, y1)).tobytes())):
        if k == 5:
            break
        x, y = x0 + m.start() % width, y0 + m.start() // width
        out.add(f"pixel ({x}, {y}): {pa.getpixel((x, y))} → {pb.getpixel((x, y))}")
    return Comparison("differs", "image",
                      f"image {sizes}, {shown} of pixels differ (max {peak})", out.text("lines"),
                      _random_hint(code))


# --- binary -------------------------------------------------------------------------------

def _compare_binary(expected: bytes, got: bytes, code: str, *, kind: str = "binary",
                    note: str | None = None) -> Comparison:
    at = _first_difference(expected, got)
    sizes = f"{_size(len(expected))} vs {_size(len(got))}"
    if at == min(len(expected), len(got)):
        longer, shorter = ("got", "expected") if len(got) > len(expected) else ("expected", "got")
        where = f"{shorter} is the first {_size(at)} of {longer}"
    else:
        where = f"first difference at byte {at:,} (0x{at:x})"
    summary = f"{kind if note is None else f'{kind} ({note})'}, {sizes}, {where}"
    out = _Bounded()
    start = max(0, at - at % 16 - 16)
    for label, data in (("expected", expected), ("got", got)):
        for row in range(start, min(start + 48, len(data)), 16):
            chunk = data[row:row + 16]
            hexes = " ".join(f"{b:02x}" for b in chunk)
            text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
            out.add(f"{label:<8} {row:08x}  {hexes:<47}  |{text}|")
    return Comparison("differs", kind, summary, out.text("lines"),
                      _random_hint(code) if len(expected) == len(got) else None)


def _first_difference(a: bytes, b: bytes) -> int:
    """The first offset where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    n = min(len(a), len(b))
    lo, step = 0, 1 << 20
    while lo < n and a[lo:lo + step] == b[lo:lo + step]:
        lo += step
    if lo >= n:
        return n
    hi = min(lo + step, n)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return next((i for i in range(lo, hi) if a[i] != b[i]), hi)


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


# --- hints --------------------------------------------------------------------------------

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
_TIME_TOKEN = re.compile(
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|\b\d{8}T\d{6}Z?\b|D:\d{14}"
    r"|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"
    rf"|\b{_MONTH}\s+\d{{1,2}},?\s+\d{{4}}\b|\b\d{{1,2}}\s+{_MONTH}\s+\d{{4}}\b"
    r"|\bDate:\s*[^\s<>\"',;]+"
    r"|\b1\d{9}(?:\.\d+)?\b|\b1\d{12}\b")
_EPOCH = re.compile(r"1\d{9}(?:\.\d+)?|1\d{12}")
_NUMBERISH = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|\b[0-9a-f]{8,}\b|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _time_tokens(text: str) -> list[str]:
    found = []
    now = time.time()
    for m in _TIME_TOKEN.finditer(text):
        token = m.group()
        if _EPOCH.fullmatch(token):
            seconds = float(token) / (1000 if len(token) == 13 else 1)
            if abs(seconds - now) > 10 * 365 * 86400:
                continue
        found.append(token)
    return found


def _timestamp_hint(blocks: Iterable[tuple[list[str], list[str]]]) -> str | None:
    """A hint when a differing line (or cell) has a date or time on both sides.

    A pair that differs in nothing but its times is preferred to one that differs elsewhere too.
    """
    fallback: tuple[str, str] | None = None
    for old, new in blocks:
        stamped = [(y, t) for y in new if (t := _time_tokens(y))]
        for x in old:
            if not stamped or not (tx := _time_tokens(x)):
                continue
            masked = _TIME_TOKEN.sub("\0", x)
            for y, ty in stamped:
                if tx != ty:
                    pair = next(((p, q) for p, q in zip(tx, ty) if p != q), (tx[0], ty[0]))
                    if _TIME_TOKEN.sub("\0", y) == masked:
                        return _say_timestamp(*pair)
                    fallback = fallback or pair
    return _say_timestamp(*fallback) if fallback else None


def _say_timestamp(a: str, b: str) -> str:
    return f"the difference looks like a timestamp ({_show(a[:60])} vs {_show(b[:60])})"


def _hint(blocks: list[tuple[list[str], list[str]]], code: str) -> str | None:
    """The timestamp hint, else the randomness hint when only numbers or ids differ."""
    stamp = _timestamp_hint(blocks)
    if stamp or not code:
        return stamp
    numeric = any(x != y and _NUMBERISH.sub("\0", x) == _NUMBERISH.sub("\0", y)
                  for old, new in blocks for x, y in zip(old, new))
    return _random_hint(code) if numeric else None


_UNSEEDABLE = re.compile(r"\buuid\.uuid[14]\b|\buuid[14]\(|\bsecrets\.\w+|\bos\.urandom\b"
                         r"|\bSystemRandom\b")
_ALWAYS_UNSEEDED = re.compile(r"\bdefault_rng\(\s*\)|\bRandomState\(\s*\)|\bRandom\(\s*\)")
_SEEDABLE = re.compile(
    r"\b(?:np|numpy)\.random\.\w+|\brandom\.(?:random|randint|choice|choices|shuffle|sample"
    r"|uniform|gauss|randrange|normalvariate|getrandbits|triangular|betavariate)\b"
    r"|\btorch\.(?:rand|randn|randint|randperm|rand_like|randn_like|normal|bernoulli"
    r"|multinomial)\b|\btf\.random\.\w+|\bfrom\s+random\s+import\b|\brandom\s*\(\s*\)")
_SEED = re.compile(r"seed\w*\s*\(|\bdefault_rng\(\s*[^\s)]|\brandom_state\s*=\s*(?!None\b)\w"
                   r"|\bRandomState\(\s*[^\s)]|\bRandom\(\s*[^\s)]|PYTHONHASHSEED")


def _random_hint(code: str) -> str | None:
    """A hint when ``code`` draws random numbers without a visible seed."""
    if not code:
        return None
    m = _UNSEEDABLE.search(code)
    if m:
        return (f"the difference looks like randomness: the code calls {m.group()}, "
                "which no seed fixes")
    m = _ALWAYS_UNSEEDED.search(code) or (None if _SEED.search(code) else _SEEDABLE.search(code))
    if m:
        return (f"the difference looks like unseeded randomness: the code calls "
                f"{m.group().strip()} without a seed")
    return None
