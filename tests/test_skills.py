"""The skill catalog: loading three collections, paging, literal search, get, catalog lines,
the problems a bad file gives, and the bundled collection's own recipes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from host_kernel.skills import COLLECTIONS, Catalog, Skill, SkillError, bundled_dir, words
from host_kernel.skills.catalog import MAX_FILE_BYTES

TOPICS = ["plotting", "regression", "clustering", "parquet", "survival", "imaging"]


def write_skill(folder: Path, name: str, summary: str, *, tags: Sequence[str] = (),
                body: str = "# Steps\n\nDo the work.\n", filename: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    front = [f"name: {name}", f"summary: {summary}"]
    if tags:
        front.append(f"tags: [{', '.join(tags)}]")
    path = folder / (filename or f"{name}.md")
    path.write_text("---\n" + "\n".join(front) + "\n---\n" + body, encoding="utf-8")
    return path


@pytest.fixture
def folders(tmp_path: Path) -> list[tuple[str, Path]]:
    """30 generated skills: 12 bundled, 10 user, 8 project, each on one topic."""
    sizes = {"bundled": 12, "user": 10, "project": 8}
    made = []
    for collection, count in sizes.items():
        folder = tmp_path / collection
        for i in range(count):
            topic = TOPICS[i % len(TOPICS)]
            write_skill(folder, f"{collection}-{topic}-{i:02d}",
                        f"Recipe {i} of the {collection} collection about {topic}.",
                        tags=[topic, "generated"],
                        body=f"# {topic}\n\nStep one for {topic}. Number {i}.\n")
        made.append((collection, folder))
    return made


@pytest.fixture
def catalog(folders: list[tuple[str, Path]]) -> Catalog:
    loaded = Catalog.load(folders)
    assert loaded.problems == ()
    return loaded


def pages(catalog: Catalog, collection: str | None = None, limit: int = 7) -> list[list[str]]:
    out: list[list[str]] = []
    offset: int | None = 0
    while offset is not None:
        page = catalog.list(collection, offset=offset, limit=limit)
        out.append([skill.name for skill in page.items])
        offset = page.next_offset
    return out


# ----------------------------------------------------------------------------- listing


def test_paging_with_limit_7_returns_every_skill_exactly_once(catalog: Catalog) -> None:
    seen = pages(catalog, limit=7)
    flat = [name for page in seen for name in page]
    assert [len(p) for p in seen] == [7, 7, 7, 7, 2]
    assert sorted(flat) == sorted(s.name for s in catalog.skills)
    assert len(flat) == len(set(flat)) == 30
    last = catalog.list(offset=28, limit=7)
    assert (last.total, last.offset, last.next_offset) == (30, 28, None)
    assert catalog.list(offset=0, limit=7).next_offset == 7


def test_every_page_states_the_exact_total(catalog: Catalog) -> None:
    for offset in range(0, 35, 7):
        assert catalog.list(offset=offset, limit=7).total == 30


def test_listing_one_collection_pages_only_that_collection(catalog: Catalog) -> None:
    seen = pages(catalog, "user", limit=4)
    flat = [name for page in seen for name in page]
    assert [len(p) for p in seen] == [4, 4, 2]
    assert all(name.startswith("user-") for name in flat) and len(flat) == 10
    page = catalog.list("project", limit=100)
    assert (page.total, page.next_offset, page.collection) == (8, None, "project")


def test_a_page_that_ends_exactly_at_the_end_has_no_next_offset(catalog: Catalog) -> None:
    page = catalog.list("user", offset=5, limit=5)
    assert len(page.items) == 5 and page.next_offset is None


def test_an_offset_past_the_end_gives_an_empty_last_page(catalog: Catalog) -> None:
    page = catalog.list(offset=500)
    assert page.items == () and page.total == 30 and page.next_offset is None


def test_catalog_order_is_collection_order_then_name(catalog: Catalog) -> None:
    rank = {c: i for i, c in enumerate(COLLECTIONS)}
    keys = [(rank[s.collection], s.name) for s in catalog.skills]
    assert keys == sorted(keys)
    assert catalog.collections() == {"bundled": 12, "user": 10, "project": 8}
    assert len(catalog) == 30


def test_bad_collection_and_bad_bounds_are_refused(catalog: Catalog) -> None:
    with pytest.raises(SkillError, match="bundled, user, project"):
        catalog.list("team")
    with pytest.raises(SkillError, match="offset"):
        catalog.list(offset=-1)
    with pytest.raises(SkillError, match="limit"):
        catalog.list(limit=0)
    with pytest.raises(SkillError, match="whole number"):
        catalog.list(limit=True)


def test_page_to_dict_carries_no_body(catalog: Catalog) -> None:
    data = catalog.list("project", limit=2).to_dict()
    assert data["total"] == 8 and data["next_offset"] == 2 and data["offset"] == 0
    assert set(data["items"][0]) == {"name", "summary", "collection", "tags"}


# ----------------------------------------------------------------------------- search


def test_words_are_lowercase_alphanumeric_runs_without_stopwords() -> None:
    assert words("Data-Loading of the CSV_v2 file") == ("data", "loading", "csv", "v2", "file")


def test_search_finds_a_skill_by_a_literal_word(catalog: Catalog) -> None:
    hits = catalog.search("clustering", limit=50)
    assert hits and all("clustering" in h.skill.name for h in hits)
    assert all(h.matched == ("clustering",) for h in hits)


def test_search_knows_no_synonyms_and_no_stems(tmp_path: Path) -> None:
    write_skill(tmp_path / "s", "draw-figures", "Plotting with matplotlib.",
                body="Make a plotting function and call it.\n")
    catalog = Catalog.load([("project", tmp_path / "s")])
    assert [h.skill.name for h in catalog.search("plotting")] == ["draw-figures"]
    assert catalog.search("chart") == []
    assert catalog.search("plot") == []       # no stemming: plot is not plotting
    assert catalog.search("graph visualisation") == []


def test_search_weights_name_tags_and_summary_above_the_body(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    write_skill(folder, "aaa-body-only", "Something else.", body="All about regression.\n")
    write_skill(folder, "zzz-in-summary", "Fit a regression.", body="Steps.\n")
    catalog = Catalog.load([("project", folder)])
    hits = catalog.search("regression")
    assert [h.skill.name for h in hits] == ["zzz-in-summary", "aaa-body-only"]
    assert hits[0].score > hits[1].score > 0


def test_search_counts_each_distinct_query_word_once(tmp_path: Path) -> None:
    write_skill(tmp_path / "s", "fit-lines", "Fit lines to points.", tags=["fit", "lines"])
    catalog = Catalog.load([("project", tmp_path / "s")])
    once = catalog.search("fit")[0].score
    assert catalog.search("fit fit fit")[0].score == once
    both = catalog.search("fit points")[0]
    assert both.score == 2 * once and both.matched == ("fit", "points")


def test_search_with_several_queries_keeps_each_skills_best_score(catalog: Catalog) -> None:
    hits = catalog.search(["survival", "parquet imaging", "nothing-here"], limit=100)
    topics = {h.skill.name.split("-")[1] for h in hits}
    assert topics == {"survival", "parquet", "imaging"}
    assert len({h.skill.name for h in hits}) == len(hits)


def test_search_ties_keep_catalog_order_and_respect_limit(catalog: Catalog) -> None:
    hits = catalog.search("generated", limit=30)
    assert [h.skill.name for h in hits] == [s.name for s in catalog.skills]
    assert len(catalog.search("generated", limit=3)) == 3


@pytest.mark.parametrize("query", ["", "   ", "the of and", [], ["", "a"]])
def test_a_query_without_a_searchable_word_is_refused(catalog: Catalog,
                                                      query: str | list[str]) -> None:
    with pytest.raises(SkillError, match="no searchable word"):
        catalog.search(query)


# ----------------------------------------------------------------------------- get


def test_get_returns_the_skill_with_its_body(catalog: Catalog) -> None:
    skill = catalog.get("user-regression-01")
    assert isinstance(skill, Skill) and skill.collection == "user"
    assert "Step one for regression" in skill.body
    assert catalog.get("USER-Regression-01") is skill
    assert skill.line() == "- user-regression-01: " + skill.summary


def test_get_an_unknown_name_suggests_close_matches(catalog: Catalog) -> None:
    with pytest.raises(SkillError, match="did you mean user-regression-01"):
        catalog.get("user-regresion-01")
    with pytest.raises(SkillError, match="list_skills"):
        catalog.get("qqqqqqqq")


# ----------------------------------------------------------------------------- collections


def test_a_later_collection_shadows_an_earlier_one_visibly(tmp_path: Path) -> None:
    write_skill(tmp_path / "b", "clean-data", "Bundled cleaning.")
    write_skill(tmp_path / "u", "clean-data", "User cleaning.")
    write_skill(tmp_path / "p", "clean-data", "Project cleaning.")
    catalog = Catalog.load([("bundled", tmp_path / "b"), ("user", tmp_path / "u"),
                            ("project", tmp_path / "p")])
    assert catalog.get("clean-data").summary == "Project cleaning."
    assert catalog.collections() == {"bundled": 0, "user": 0, "project": 1}
    assert [(s.hidden_collection, s.winner_collection) for s in catalog.shadowed] == [
        ("bundled", "user"), ("user", "project")]
    assert "shadows" in str(catalog.shadowed[0]) and catalog.problems == ()


def test_missing_folders_are_empty_collections(tmp_path: Path) -> None:
    catalog = Catalog.load([("bundled", tmp_path / "nope"), ("user", tmp_path / "nada")])
    assert len(catalog) == 0 and catalog.problems == ()
    assert catalog.collections() == {"bundled": 0, "user": 0}
    assert catalog.list("user").total == 0


def test_a_file_where_a_folder_should_be_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "user").write_text("not a folder", encoding="utf-8")
    catalog = Catalog.load([("user", tmp_path / "user")])
    assert [p.reason for p in catalog.problems] == ["not a folder"]


def test_duplicate_collection_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SkillError, match="unique"):
        Catalog.load([("user", tmp_path), ("user", tmp_path)])


def test_default_reads_the_three_standard_folders(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = tmp_path / "xdg"
    write_skill(xdg / "host_kernel" / "skills", "from-xdg", "In the XDG config folder.")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    workdir = tmp_path / "ws"
    write_skill(workdir / ".host_kernel" / "skills", "from-project", "In the project.")
    catalog = Catalog.default(workdir)
    assert list(catalog.collections()) == list(COLLECTIONS)
    assert catalog.get("from-xdg").collection == "user"
    assert catalog.get("from-project").collection == "project"
    given = tmp_path / "given"
    write_skill(given, "from-given", "In the folder passed in.")
    other = Catalog.default(workdir, user_dir=given)
    assert {s.name for s in other.skills if s.collection == "user"} == {"from-given"}


# ----------------------------------------------------------------------------- the file format


def test_tags_as_a_dash_list_quotes_crlf_and_a_bom_are_read(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    text = ("\ufeff---\r\n# a comment\r\nname: 'quoted-name'\r\n"
            'summary: "Colons: fine in a summary."\r\ntags:\r\n  - alpha\r\n  - "beta gamma"\r\n'
            "extra: ignored\r\n---\r\n\r\n# Body\r\nText.\r\n")
    (folder / "x.md").write_bytes(text.encode("utf-8"))
    catalog = Catalog.load([("project", folder)])
    assert catalog.problems == ()
    skill = catalog.get("quoted-name")
    assert skill.summary == "Colons: fine in a summary."
    assert skill.tags == ("alpha", "beta gamma")
    assert skill.body == "# Body\nText.\n"


BAD_FILES: dict[str, tuple[bytes, str]] = {
    "no-front-matter.md": (b"# Just a heading\n", "no front matter"),
    "unclosed.md": (b"---\nname: unclosed\nsummary: Never closed.\n", "not closed"),
    "no-summary.md": (b"---\nname: no-summary\n---\nBody.\n", "no 'summary'"),
    "empty-summary.md": (b"---\nname: empty-summary\nsummary:\n---\nBody.\n", "no 'summary'"),
    "no-name.md": (b"---\nsummary: Nameless.\n---\nBody.\n", "no 'name'"),
    "upper-name.md": (b"---\nname: Bad_Name\nsummary: Upper case.\n---\nBody.\n", "bad name"),
    "long-name.md": (b"---\nname: " + b"a" * 65 + b"\nsummary: Too long.\n---\nBody.\n",
                     "bad name"),
    "space-name.md": (b"---\nname: two words\nsummary: Space.\n---\nBody.\n", "bad name"),
    "long-summary.md": (b"---\nname: long-summary\nsummary: " + b"x" * 201 + b"\n---\nBody.\n",
                        "over 200"),
    "stray-dash.md": (b"---\n- item\nname: stray\nsummary: S.\n---\nBody.\n", "outside a list"),
    "not-key-value.md": (b"---\nname stray\nsummary: S.\n---\nBody.\n", "key: value"),
    "twice.md": (b"---\nname: twice\nname: twice\nsummary: S.\n---\nBody.\n", "given twice"),
    "empty-body.md": (b"---\nname: empty-body\nsummary: S.\n---\n\n\n", "body is empty"),
    "latin1.md": ("---\nname: latin\nsummary: Caf\xe9.\n---\nBody.\n".encode("latin-1"),
                  "not UTF-8"),
    "comma-tags.md": (b"---\nname: comma-tags\nsummary: S.\ntags: a, b\n---\nBody.\n",
                      "bad tag"),
}


def test_bad_files_are_reported_as_problems_and_never_raise(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    write_skill(folder, "good-one", "The one good skill.")
    for filename, (data, _) in BAD_FILES.items():
        (folder / filename).write_bytes(data)
    (folder / "huge.md").write_bytes(b"---\nname: huge\nsummary: S.\n---\n"
                                     + b"x" * MAX_FILE_BYTES)
    catalog = Catalog.load([("project", folder)])
    assert [s.name for s in catalog.skills] == ["good-one"]
    reasons = {p.path.name: p.reason for p in catalog.problems}
    assert set(reasons) == set(BAD_FILES) | {"huge.md"}
    for filename, (_, why) in BAD_FILES.items():
        assert why in reasons[filename], (filename, reasons[filename])
    assert "limit" in reasons["huge.md"]
    assert all(p.collection == "project" for p in catalog.problems)
    assert str(catalog.problems[0]).startswith(str(folder))


def test_a_second_file_with_the_same_name_in_one_collection_is_a_problem(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    write_skill(folder, "same", "First, by file name.", filename="a.md")
    write_skill(folder, "same", "Second.", filename="b.md")
    catalog = Catalog.load([("user", folder)])
    assert catalog.get("same").summary == "First, by file name."
    assert [p.path.name for p in catalog.problems] == ["b.md"]
    assert "already used" in catalog.problems[0].reason


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_named_like_a_skill_is_refused_without_blocking(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    os.mkfifo(folder / "pipe.md")
    catalog = Catalog.load([("user", folder)])
    assert [p.reason for p in catalog.problems] == ["not a regular file"]


# ----------------------------------------------------------------------------- catalog lines


def test_catalog_lines_are_deterministic_and_truncated(folders: list[tuple[str, Path]]) -> None:
    text = Catalog.load(folders).catalog_lines(limit=5)
    assert text == Catalog.load(list(folders)).catalog_lines(limit=5)
    lines = text.splitlines()
    assert lines[0] == "Skills: 30 in the catalog (bundled 12, user 10, project 8)."
    assert len(lines) == 1 + 5 + 1
    assert lines[1].startswith("- bundled-") and lines[1].count(": ") >= 1
    assert lines[-1] == "… and 25 more: page with list_skills"


def test_catalog_lines_without_truncation_list_every_skill(catalog: Catalog) -> None:
    lines = catalog.catalog_lines(limit=30).splitlines()
    assert lines[1:] == [s.line() for s in catalog.skills]
    assert catalog.catalog_lines(limit=0).splitlines()[1] == "… and 30 more: page with list_skills"


# ----------------------------------------------------------------------------- the bundled recipes


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block."""
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    lines: list[str] = []
    for line in markdown.splitlines():
        if language is None and line.startswith("```"):
            language, lines = line[3:].strip().lower(), []
        elif language is not None and line.strip() == "```":
            blocks.append((language, "\n".join(lines) + "\n"))
            language = None
        elif language is not None:
            lines.append(line)
    assert language is None, "an unclosed code fence"
    return blocks


@pytest.fixture(scope="module")
def bundled() -> Catalog:
    return Catalog.load([("bundled", bundled_dir())])


def test_the_bundled_collection_loads_cleanly(bundled: Catalog) -> None:
    assert bundled.problems == ()
    assert len(bundled) >= 6
    for skill in bundled.skills:
        assert skill.path.stem == skill.name
        assert 40 <= len(skill.path.read_text(encoding="utf-8").splitlines()) <= 120, skill.name


def test_every_bundled_python_block_compiles(bundled: Catalog) -> None:
    compiled = 0
    for skill in bundled.skills:
        blocks = code_blocks(skill.body)
        assert blocks, f"{skill.name} has no code"
        for i, (language, code) in enumerate(blocks):
            if language in {"python", "py", "python3"}:
                compile(code, f"{skill.name}[{i}]", "exec")
                compiled += 1
            else:
                assert language in {"bash", "sh", "shell", "console", "text"}, language
    assert compiled >= 20


def test_the_bundled_recipes_cover_the_core_topics(bundled: Catalog) -> None:
    for query in ["csv encoding dtypes", "pytest submit_output", "matplotlib lineage",
                  "receipt exit_status", "restart generation", "audit record"]:
        assert bundled.search(query), query


def test_the_project_collection_follows_no_symlink(tmp_path: Path) -> None:
    """A link in the workspace's .host_kernel/skills is not followed: the Host would
    otherwise read a file the kernel may not."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "leak.md").write_text("---\nname: leak\nsummary: s\n---\nTOP-SECRET\n")
    workdir = tmp_path / "ws"
    skills = workdir / ".host_kernel" / "skills"
    skills.mkdir(parents=True)
    (skills / "leak.md").symlink_to(hidden / "leak.md")
    catalog = Catalog.default(workdir, user_dir=tmp_path / "user")
    assert "leak" not in [s.name for s in catalog.skills]
    assert any("symlink" in p.reason for p in catalog.problems)
    (skills / "leak.md").unlink()
    skills.rmdir()
    skills.symlink_to(hidden)  # the folder itself a link
    catalog = Catalog.default(workdir, user_dir=tmp_path / "user")
    assert "leak" not in [s.name for s in catalog.skills]
    assert any("symlink" in p.reason for p in catalog.problems)
