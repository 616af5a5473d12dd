"""compare_bytes: recorded bytes against re-derived bytes, by kind, with hints at the cause.

Pure tests: no Host, no kernel. Images are made with Pillow, Parquet files with
pyarrow and SVGs with matplotlib, each skipped loudly when the library is missing.
"""

from __future__ import annotations

import io
import time

import pytest

from host_kernel.lineage.compare import MAX_DIFF_CHARS, MAX_DIFF_LINES, Comparison, compare_bytes


def _bounded(c: Comparison) -> None:
    """Every diff stays short and printable, whatever was compared."""
    assert len(c.diff) <= MAX_DIFF_CHARS
    assert len(c.diff.splitlines()) <= MAX_DIFF_LINES + 1
    assert not any(ch < " " and ch not in "\n\t" for ch in c.diff), repr(c.diff[:200])
    assert "\n" not in c.summary


def test_identical_bytes_are_reproduced() -> None:
    c = compare_bytes(b"same\n", b"same\n", name="a.txt", tolerance=0.1)
    assert (c.outcome, c.kind, c.diff, c.hint) == ("reproduced", "identical", "", None)
    assert c.to_dict() == {"outcome": "reproduced", "kind": "identical",
                           "summary": c.summary, "diff": "", "hint": None}


def test_a_text_diff_shows_the_changed_lines_with_one_line_of_context() -> None:
    old = "".join(f"line {i}\n" for i in range(40)).encode()
    new = old.replace(b"line 7\n", b"line seven\n").replace(b"line 30\n", b"line 30!\n")
    c = compare_bytes(old, new, name="notes.txt")
    assert (c.outcome, c.kind) == ("differs", "text")
    assert c.summary == "2 of 40 lines differ"
    lines = c.diff.splitlines()
    assert lines[:2] == ["--- expected notes.txt", "+++ got notes.txt"]
    assert "@@ -7,3 +7,3 @@" in lines
    assert lines[lines.index("-line 7") - 1: lines.index("-line 7") + 3] == [
        " line 6", "-line 7", "+line seven", " line 8"]
    assert "+line 30!" in lines and " line 5" not in lines
    assert c.hint is None
    _bounded(c)


def test_a_long_text_diff_is_cut_with_a_count_of_the_rest() -> None:
    old = "".join(f"{i}\n" for i in range(1000)).encode()
    new = "".join(f"{i}x\n" for i in range(1000)).encode()
    c = compare_bytes(old, new)  # no name: sniffed as text
    assert c.kind == "text" and c.summary == "1000 of 1000 lines differ"
    assert c.diff.splitlines()[-1].startswith("… ") and c.diff.endswith(" more lines")
    _bounded(c)


def test_control_characters_never_reach_the_diff() -> None:
    c = compare_bytes(b"a\x1b[31mred\x00\n", b"a\x1b[32mgreen\n", name="out.log")
    assert "-a\\x1b[31mred\\x00" in c.diff.splitlines()
    _bounded(c)


def test_a_csv_diff_names_the_row_and_column_of_each_cell() -> None:
    old = b"id,name,score\n1,ada,3.5\n2,bob,4.0\n3,cy,1.0\n"
    new = b"id,name,score\n1,ada,3.5\n2,rob,4.25\n3,cy,1.0\n4,di,2.0\n"
    c = compare_bytes(old, new, name="scores.csv")
    assert (c.outcome, c.kind) == ("differs", "csv")
    assert c.summary == ("shape 3 rows x 3 columns vs 4 rows x 3 columns; "
                         "2 cells differ (max abs 0.25)")
    assert c.diff.splitlines() == ["row 2, column name: 'bob' → 'rob'",
                                   "row 2, column score: '4.0' → '4.25'",
                                   "row 4 only in got"]
    _bounded(c)


def test_a_tsv_is_split_on_tabs() -> None:
    c = compare_bytes(b"a\tb\n1\t2\n", b"a\tb\n1\t3\n", name="t.tsv")
    assert c.kind == "csv" and c.diff == "row 1, column b: '2' → '3'"


def test_a_tolerance_makes_a_float_csv_reproduced() -> None:
    old = b"x,y\n0.1,1.0000001\n0.2,2e-9\n"
    new = b"x,y\n0.10000000001,1.0\n0.2,0\n"
    plain = compare_bytes(old, new, name="f.csv")
    assert plain.outcome == "differs" and plain.summary.startswith("3 cells differ")
    c = compare_bytes(old, new, name="f.csv", tolerance=1e-6)
    assert (c.outcome, c.kind) == ("reproduced", "csv")
    assert c.summary == "equal within tolerance 1e-06 (bytes differ)"
    # Beyond the tolerance it still differs, and text cells are never "close".
    far = compare_bytes(old, new.replace(b"0.2,0", b"0.3,0"), name="f.csv", tolerance=1e-6)
    assert far.outcome == "differs" and far.diff == "row 2, column x: '0.2' → '0.3'"
    words = compare_bytes(b"a\nx\n", b"a\ny\n", name="w.csv", tolerance=1.0)
    assert words.outcome == "differs"


def test_a_csv_equal_cell_by_cell_but_not_byte_by_byte_differs_without_a_tolerance() -> None:
    c = compare_bytes(b"a,b\n1,2\n", b'"a","b"\r\n1,2\r\n', name="q.csv")
    assert (c.outcome, c.kind) == ("differs", "csv")
    assert c.summary.startswith("every cell is equal")


def test_invalid_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        compare_bytes(b"a", b"b", tolerance=-1.0)


def _parquet(**columns: list[object]) -> bytes:
    pa = pytest.importorskip("pyarrow", reason="LOUD SKIP: pyarrow is not installed, so "
                             "Parquet files are compared as binary and this cannot be tested")
    pq = pytest.importorskip("pyarrow.parquet")
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def test_a_parquet_diff_lists_cells_and_honours_a_tolerance() -> None:
    old = _parquet(id=[1, 2, 3], v=[0.5, 1.0, 1.5], s=["a", "b", "c"])
    new = _parquet(id=[1, 2, 3], v=[0.5, 1.0000001, 1.75], s=["a", "b", "z"])
    c = compare_bytes(old, new, name="t.parquet")
    assert (c.outcome, c.kind) == ("differs", "parquet")
    assert c.summary == "3 cells differ (max abs 0.25)"
    assert "row 3, column s: 'c' → 'z'" in c.diff.splitlines()
    assert "row 3, column v: 1.5 → 1.75" in c.diff.splitlines()
    close = _parquet(id=[1, 2, 3], v=[0.5, 1.0000001, 1.5], s=["a", "b", "c"])
    r = compare_bytes(old, close, name="t.parquet", tolerance=1e-6)
    assert (r.outcome, r.kind) == ("reproduced", "parquet")
    assert r.summary == "equal within tolerance 1e-06 (bytes differ)"
    # Sniffed without a name, and a changed schema is said.
    other = _parquet(id=[1, 2], w=[0.5, 1.0])
    s = compare_bytes(old, other)
    assert s.kind == "parquet" and "schema differs" in s.summary
    assert "column w only in got" in s.diff.splitlines()
    _bounded(c)
    _bounded(s)


def _png(size: tuple[int, int], dots: list[tuple[int, int]], mode: str = "RGB") -> bytes:
    image_mod = pytest.importorskip("PIL.Image", reason="LOUD SKIP: Pillow is not installed")
    image = image_mod.new(mode, size, "white")
    for xy in dots:
        image.putpixel(xy, (255, 0, 0) if mode == "RGB" else 0)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_an_image_diff_counts_the_pixels_that_differ() -> None:
    old = _png((100, 50), [])
    new = _png((100, 50), [(3, 4), (10, 20), (99, 49)])
    c = compare_bytes(old, new, name="plot.png")
    assert (c.outcome, c.kind) == ("differs", "image")
    assert c.summary == "image 100x50 vs 100x50, 0.06% of pixels differ (max 255)"
    assert "3 of 5,000 pixels differ, all within x 3..99, y 4..49" in c.diff
    assert "pixel (3, 4): (255, 255, 255) → (255, 0, 0)" in c.diff.splitlines()
    assert c.hint is None
    seeded = compare_bytes(old, new, name="plot.png", code="rng = np.random.default_rng()\n")
    assert seeded.hint is not None and "default_rng()" in seeded.hint
    _bounded(c)


def test_an_image_of_another_size_says_so() -> None:
    c = compare_bytes(_png((100, 50), []), _png((64, 48), []))  # sniffed as PNG
    assert (c.outcome, c.kind) == ("differs", "image")
    assert c.summary == "image 100x50 vs 64x48 (size differs)"


def test_an_image_that_is_not_one_is_compared_as_binary() -> None:
    pytest.importorskip("PIL.Image", reason="LOUD SKIP: Pillow is not installed")
    c = compare_bytes(b"\x89PNG not really", b"\x89PNG not at all", name="x.png")
    assert c.kind == "binary" and "not readable as an image" in c.summary


def _svg(date: str) -> bytes:
    matplotlib = pytest.importorskip("matplotlib", reason="LOUD SKIP: matplotlib is missing")
    matplotlib.use("Agg")
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1, 2], [2, 1, 3])
    out = io.BytesIO()
    fig.savefig(out, format="svg", metadata={"Date": date})
    plt.close(fig)
    return out.getvalue()


def test_matplotlib_svgs_with_different_dates_get_the_timestamp_hint() -> None:
    old, new = _svg("2026-12-02T03:11:23"), _svg("2026-12-02T03:14:05")
    assert b"<dc:date>2026-12-02T03:11:23</dc:date>" in old
    c = compare_bytes(old, new, name="fig.svg")
    assert (c.outcome, c.kind) == ("differs", "text")
    assert c.hint == ("the difference looks like a timestamp "
                      "(2026-12-02T03:11:23 vs 2026-12-02T03:14:05)")
    assert "-    <dc:date>2026-12-02T03:11:23</dc:date>" in c.diff.splitlines()
    _bounded(c)


@pytest.mark.parametrize(("old", "new"), [
    ("Date: Tue, 02 Dec 2026 03:11:23 GMT\nok\n", "Date: Tue, 02 Dec 2026 03:12:01 GMT\nok\n"),
    ("run at 03:11:23\n", "run at 04:00:00\n"),
    # A fixed Unix time (2026-12-06; the hint takes those within ten years of now): a
    # parameter read from the clock names the test differently in each xdist worker that
    # collects it a second apart, and the run stops at collection.
    ("t=1796535463\n", "t=1796535470\n"),
])
def test_the_timestamp_hint_knows_common_clock_formats(old: str, new: str) -> None:
    c = compare_bytes(old.encode(), new.encode(), name="run.log", code="np.random.rand()")
    assert c.hint is not None and c.hint.startswith("the difference looks like a timestamp")


def test_a_number_that_is_no_time_gets_no_timestamp_hint() -> None:
    c = compare_bytes(b"n=1000000000000000\n", b"n=1000000000000001\n", name="n.txt")
    assert c.hint is None


def test_unseeded_randomness_in_the_code_is_named_when_numbers_differ() -> None:
    old, new = b"mean 0.4812\n", b"mean 0.5127\n"
    unseeded = "import numpy as np\nx = np.random.normal(size=10)\nprint(x.mean())\n"
    c = compare_bytes(old, new, name="m.txt", code=unseeded)
    assert c.hint == ("the difference looks like unseeded randomness: the code calls "
                      "np.random.normal without a seed")
    seeded = "import numpy as np\nnp.random.seed(0)\n" + unseeded
    assert compare_bytes(old, new, name="m.txt", code=seeded).hint is None
    assert compare_bytes(old, new, name="m.txt",
                         code="rng = np.random.default_rng(42)\nrng.normal()").hint is None
    assert compare_bytes(old, new, name="m.txt", code="x = 1\n").hint is None
    # A difference that is not in numbers is no sign of randomness.
    assert compare_bytes(b"ok\n", b"failed\n", name="m.txt", code=unseeded).hint is None
    ids = compare_bytes(b"run 1b4e28ba-2fa1-11d2-883f-0016d3cca427\n",
                        b"run 6fa459ea-ee8a-3ca4-894e-db77e160355e\n", name="m.txt",
                        code="import uuid\nrandom.seed(1)\nname = uuid.uuid4()\n")
    assert ids.hint == ("the difference looks like randomness: the code calls uuid.uuid4, "
                        "which no seed fixes")


def test_binary_bytes_give_sizes_and_the_first_differing_offset() -> None:
    old = bytes(range(256)) * 4
    new = old[:700] + b"\xff" + old[701:]
    c = compare_bytes(old, new, name="blob.bin")
    assert (c.outcome, c.kind) == ("differs", "binary")
    assert c.summary == "binary, 1,024 bytes vs 1,024 bytes, first difference at byte 700 (0x2bc)"
    assert "got      000002b0  b0 b1 b2 b3 b4 b5 b6 b7 b8 b9 ba bb ff bd be bf" in c.diff
    short = compare_bytes(old, old[:1000] + b"\x00", name="blob.bin")
    assert "first difference at byte 1,000" in short.summary
    prefix = compare_bytes(old, old + b"\x00\x01", name="blob.bin")
    assert prefix.summary.endswith("expected is the first 1,024 bytes of got")
    _bounded(c)


@pytest.mark.parametrize("name", ["big.txt", "big.bin", ""])
def test_a_50_mib_pair_is_compared_in_bounded_time_and_space(name: str) -> None:
    line = b"0123456789 abcdefghij 0123456789 abcdefghij 0123456789 abcdefghij\n"
    old = line * ((50 << 20) // len(line))
    at = len(old) - 1000
    new = old[:at] + b"X" + old[at + 1:]
    started = time.perf_counter()
    c = compare_bytes(old, new, name=name)
    took = time.perf_counter() - started
    print(f"{name or '(no name)'}: {took:.3f}s {c.summary}")
    assert c.outcome == "differs"
    assert f"byte {at:,}" in c.summary
    assert took < 30  # measured well under 2 s; only a runaway fails this
    _bounded(c)


def test_many_lines_changed_in_place_are_paired_without_quadratic_work() -> None:
    old = "".join(f"row {i} value {i * 3}\n" for i in range(50_000)).encode()
    new = "".join(f"row {i} value {i * 3 + (i % 10 == 1)}\n" for i in range(50_000)).encode()
    started = time.perf_counter()
    c = compare_bytes(old, new, name="rows.txt")
    assert time.perf_counter() - started < 30  # difflib alone takes minutes on this pair
    assert c.summary == "5000 of 50000 lines differ"
    assert c.diff.splitlines()[2:6] == ["@@ -1,3 +1,3 @@", " row 0 value 0", "-row 1 value 3",
                                        "+row 1 value 4"]
    _bounded(c)


def test_a_large_middle_of_another_length_reports_its_first_differing_line() -> None:
    old = "".join(f"{i}\n" for i in range(10_000)).encode()
    new = b"first\n" + "".join(f"{i}!\n" for i in range(10_000)).encode()
    c = compare_bytes(old, new, name="n.txt")
    assert c.summary.startswith("text of ")
    assert "too many differing lines to diff (10000 lines vs 10001)" in c.summary
    assert c.summary.endswith("first difference at line 1 (byte 0)")
    assert c.diff.splitlines() == ["line 1, expected: 0", "line 1, got:      first"]


def test_a_long_line_is_shown_around_its_difference() -> None:
    old = b'{"values": [' + b"1, " * 300_000 + b'2]}\n'
    new = old.replace(b"1, 1, 2]", b"1, 9, 2]")
    for name in ("data.json", "data.jsonl"):
        c = compare_bytes(old, new, name=name)
        assert c.summary == "1 of 1 lines differ"
        removed = c.diff.splitlines()[3]
        assert removed.startswith("-…") and removed.endswith("1, 1, 2]}")
        assert len(removed) < 300
    huge = old + b"x" * (5 << 20)
    big = compare_bytes(huge, new + b"x" * (5 << 20), name="data.json")
    assert "too large to diff" in big.summary and "1, 9, 2]}" in big.diff
    _bounded(big)


def test_a_headerless_float_csv_is_reproduced_within_tolerance_too() -> None:
    c = compare_bytes(b"0.1,0.2\n0.3,0.4\n", b"0.1000000001,0.2\n0.3,0.4000000001\n",
                      name="m.csv", tolerance=1e-6)
    assert c.outcome == "reproduced"
    d = compare_bytes(b"0.1,0.2\n", b"0.5,0.2\n", name="m.csv")
    assert d.diff == "header, column 0.1: '0.1' → '0.5'"


def test_an_image_whose_pixels_match_says_the_metadata_differs() -> None:
    image_mod = pytest.importorskip("PIL.Image", reason="LOUD SKIP: Pillow is not installed")
    png_mod = pytest.importorskip("PIL.PngImagePlugin")

    def made_at(when: str) -> bytes:
        info = png_mod.PngInfo()
        info.add_text("Creation Time", when)
        out = io.BytesIO()
        image_mod.new("RGB", (8, 8), "white").save(out, format="PNG", pnginfo=info)
        return out.getvalue()

    c = compare_bytes(made_at("2026-12-02 03:11:23"), made_at("2026-12-02 03:15:00"),
                      name="p.png")
    assert c.summary == "image 8x8 vs 8x8, pixels identical; the files differ in metadata or encoding"
    assert "metadata Creation Time: '2026-12-02 03:11:23' → '2026-12-02 03:15:00'" in c.diff
    assert c.hint == "the difference looks like a timestamp (2026-12-02 03:11:23 vs 2026-12-02 03:15:00)"


def test_a_parquet_table_equal_but_for_its_metadata_says_so() -> None:
    pa = pytest.importorskip("pyarrow", reason="LOUD SKIP: pyarrow is not installed")
    pq = pytest.importorskip("pyarrow.parquet")

    def written(meta: dict[str, str]) -> bytes:
        sink = io.BytesIO()
        pq.write_table(pa.table({"x": [1, 2]}).replace_schema_metadata(meta), sink)
        return sink.getvalue()

    c = compare_bytes(written({"made": "2026-12-02T03:11:23"}),
                      written({"made": "2026-12-02T04:00:00"}), name="t.parquet")
    assert c.summary.startswith("the table is equal (2 rows x 1 columns)")
    assert "metadata 'made' differs" in c.diff
    assert c.hint is not None and "2026-12-02T03:11:23 vs 2026-12-02T04:00:00" in c.hint
