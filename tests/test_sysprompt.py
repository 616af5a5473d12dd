"""The system prompt as a log: the walk, reconciliation on resume, sourcing, serialisation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from host_kernel.agent import sysprompt
from host_kernel.agent.sysprompt import (
    EVENT_KIND,
    Block,
    Entry,
    Layers,
    SystemPromptError,
    config_window,
    effective,
    entries_from_records,
    initial_entries,
    join_single,
    prompt_at,
    reconcile,
    resolve_blocks,
    to_openai,
)

SESSION = "s-1"


def _record(seq: int, op: str, text: str, *, session: str = SESSION,
            source: str = "") -> dict[str, Any]:
    return {"v": 1, "seq": seq, "ts": 1700000000.0 + seq, "session": session,
            "kind": EVENT_KIND, "data": {"op": op, "text": text, "source": source}}


def _other(seq: int, kind: str = "cell_completed") -> dict[str, Any]:
    return {"v": 1, "seq": seq, "ts": 0.0, "session": SESSION, "kind": kind, "data": {}}


@pytest.fixture
def layers(tmp_path: Path) -> Layers:
    made = Layers(base=tmp_path / "base", user=tmp_path / "user",
                  project=tmp_path / "work" / ".host_kernel")
    for folder in (made.base, made.user, made.project):
        folder.mkdir(parents=True)
    return made


# ----------------------------------------------------------------------------- entries and the walk


def test_entry_refuses_an_unknown_op() -> None:
    with pytest.raises(ValueError, match="prepend"):
        Entry("prepend", "x")


def test_effective_appends_in_order() -> None:
    assert effective([Entry("append", "a"), Entry("append", "b")]) == ("a", "b")
    assert effective([]) == ()


def test_effective_replace_in_the_middle_drops_what_came_before() -> None:
    entries = [Entry("append", "a"), Entry("append", "b"), Entry("replace", "c"),
               Entry("append", "d")]
    assert effective(entries) == ("c", "d")
    assert effective(entries[:2]) == ("a", "b")


def _stream() -> list[dict[str, Any] | None]:
    return [
        _other(1, "session_started"),
        _record(2, "append", "seed", source="builtin"),
        None,
        _record(3, "append", "extra", source="project:APPEND_SYSTEM.md"),
        _record(4, "replace", "intruder", session="s-2"),
        _other(5),
        _record(6, "replace", "new seed", source="project:SYSTEM.md"),
        {"v": 1, "seq": 7, "session": SESSION, "kind": EVENT_KIND,
         "data": {"op": "delete", "text": "bad"}},
        {"v": 1, "seq": 8, "session": SESSION, "kind": EVENT_KIND, "data": "not a mapping"},
        {"v": 1, "seq": 9, "session": SESSION, "kind": EVENT_KIND,
         "data": {"op": "append", "text": 42}},
        _record(10, "append", "host block", source="host"),
    ]


def test_prompt_at_before_and_after_a_replace() -> None:
    records = _stream()
    assert prompt_at(records, 1, SESSION) == ()
    assert prompt_at(records, 3, SESSION) == ("seed", "extra")
    assert prompt_at(records, 5, SESSION) == ("seed", "extra")
    assert prompt_at(records, 6, SESSION) == ("new seed",)
    assert prompt_at(records, 100, SESSION) == ("new seed", "host block")


def test_prompt_at_without_a_session_counts_every_session() -> None:
    assert prompt_at(_stream(), 4) == ("intruder",)


def test_entries_from_records_keeps_seq_and_source_and_skips_malformed_data() -> None:
    entries = entries_from_records(_stream(), SESSION)
    assert [(e.seq, e.op, e.source) for e in entries] == [
        (2, "append", "builtin"),
        (3, "append", "project:APPEND_SYSTEM.md"),
        (6, "replace", "project:SYSTEM.md"),
        (10, "append", "host"),
    ]


def test_entries_from_records_defaults_a_missing_source_and_needs_seq_for_upto() -> None:
    records: list[dict[str, Any] | None] = [
        {"kind": EVENT_KIND, "session": SESSION, "data": {"op": "append", "text": "t"}},
    ]
    assert entries_from_records(records) == [Entry("append", "t", "", None)]
    assert entries_from_records(records, upto=10) == []


# ----------------------------------------------------------------------------- reconciliation


def test_config_window_without_replace_is_every_entry() -> None:
    entries = [Entry("append", "a"), Entry("append", "b")]
    assert config_window(entries) == entries
    assert config_window([]) == []


def test_config_window_starts_at_the_last_replace() -> None:
    entries = [Entry("append", "a"), Entry("replace", "b"), Entry("append", "c"),
               Entry("replace", "d"), Entry("append", "e")]
    assert config_window(entries) == entries[3:]


BLOCKS = [Block("seed", "builtin"), Block("proj", "project:APPEND_SYSTEM.md"),
          Block("user", "user:APPEND_SYSTEM.md")]


def test_reconcile_unchanged_blocks_is_a_no_op() -> None:
    assert reconcile(initial_entries(BLOCKS), BLOCKS) == []


def test_reconcile_is_a_no_op_after_an_earlier_reconciliation() -> None:
    old = [Block("old seed", "builtin")]
    log = initial_entries(old)
    log += reconcile(log, BLOCKS)
    assert effective(log) == ("seed", "proj", "user")
    assert reconcile(log, BLOCKS) == []


def test_reconcile_of_a_changed_seed_is_one_replace_and_the_appends() -> None:
    changed = [Block("seed v2", "project:SYSTEM.md"), *BLOCKS[1:]]
    added = reconcile(initial_entries(BLOCKS), changed)
    assert added == [
        Entry("replace", "seed v2", "project:SYSTEM.md"),
        Entry("append", "proj", "project:APPEND_SYSTEM.md"),
        Entry("append", "user", "user:APPEND_SYSTEM.md"),
    ]


def test_reconcile_detects_an_append_file_added_or_removed() -> None:
    log = initial_entries(BLOCKS)
    removed = BLOCKS[:2]
    assert reconcile(log, removed) == [Entry("replace", "seed", "builtin"),
                                       Entry("append", "proj", "project:APPEND_SYSTEM.md")]
    more = [*BLOCKS, Block("base", "base:APPEND_SYSTEM.md")]
    added = reconcile(log, more)
    assert [e.op for e in added] == ["replace", "append", "append", "append"]
    assert effective(log + added) == ("seed", "proj", "user", "base")


def test_reconcile_detects_reordering() -> None:
    swapped = [BLOCKS[0], BLOCKS[2], BLOCKS[1]]
    added = reconcile(initial_entries(BLOCKS), swapped)
    assert effective(initial_entries(BLOCKS) + added) == ("seed", "user", "proj")


def test_reconcile_ignores_sources_and_compares_exact_text() -> None:
    moved = [Block("seed", "base:SYSTEM.md"), *BLOCKS[1:]]
    assert reconcile(initial_entries(BLOCKS), moved) == []
    spaced = [Block("seed ", "builtin"), *BLOCKS[1:]]
    assert reconcile(initial_entries(BLOCKS), spaced) != []


def test_reconcile_and_initial_entries_refuse_no_blocks() -> None:
    with pytest.raises(ValueError):
        reconcile([Entry("append", "a")], [])
    with pytest.raises(ValueError):
        initial_entries([])


# ----------------------------------------------------------------------------- sourcing


def test_builtin_default_when_no_layer_has_a_seed(layers: Layers) -> None:
    assert resolve_blocks(layers, "default") == [Block("default", "builtin")]


def test_seed_comes_from_the_highest_layer_present(layers: Layers) -> None:
    (layers.base / "SYSTEM.md").write_text("base seed\n")
    (layers.user / "SYSTEM.md").write_text("user seed\n")
    assert resolve_blocks(layers, "default") == [Block("user seed", "user:SYSTEM.md")]
    (layers.project / "SYSTEM.md").write_text("project seed\n")
    assert resolve_blocks(layers, "default") == [Block("project seed", "project:SYSTEM.md")]


def test_appends_come_project_first_and_the_host_block_last(layers: Layers) -> None:
    (layers.base / "SYSTEM.md").write_text("base seed")
    for name in ("base", "user", "project"):
        (getattr(layers, name) / "APPEND_SYSTEM.md").write_text(f"{name} append\n")
    assert resolve_blocks(layers, "default", host_block="host text") == [
        Block("base seed", "base:SYSTEM.md"),
        Block("project append", "project:APPEND_SYSTEM.md"),
        Block("user append", "user:APPEND_SYSTEM.md"),
        Block("base append", "base:APPEND_SYSTEM.md"),
        Block("host text", "host"),
    ]


def test_empty_or_whitespace_file_counts_as_absent(layers: Layers) -> None:
    (layers.base / "SYSTEM.md").write_text("base seed")
    (layers.project / "SYSTEM.md").write_text("")
    (layers.user / "SYSTEM.md").write_text(" \n\t\r\n")
    (layers.user / "APPEND_SYSTEM.md").write_text("\n")
    assert resolve_blocks(layers, "default") == [Block("base seed", "base:SYSTEM.md")]


def test_directory_or_dangling_symlink_counts_as_absent(layers: Layers) -> None:
    (layers.project / "SYSTEM.md").mkdir()
    (layers.user / "SYSTEM.md").symlink_to(layers.user / "nowhere.md")
    assert resolve_blocks(layers, "default") == [Block("default", "builtin")]


def test_missing_layer_folders_count_as_absent(tmp_path: Path) -> None:
    nowhere = Layers(tmp_path / "a", tmp_path / "b", tmp_path / "c")
    assert resolve_blocks(nowhere, "d", host_block="h") == [Block("d", "builtin"),
                                                             Block("h", "host")]


def test_non_utf8_file_raises_naming_its_path(layers: Layers) -> None:
    bad = layers.user / "APPEND_SYSTEM.md"
    bad.write_bytes(b"caf\xe9\n")
    with pytest.raises(SystemPromptError, match="not valid UTF-8") as caught:
        resolve_blocks(layers, "default")
    assert caught.value.path == bad
    assert str(bad) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_oversized_file_raises(layers: Layers) -> None:
    (layers.project / "SYSTEM.md").write_text("x" * (sysprompt.MAX_FILE_BYTES + 1))
    with pytest.raises(SystemPromptError, match="larger than"):
        resolve_blocks(layers, "default")


def test_trailing_newlines_do_not_change_the_block(layers: Layers) -> None:
    seed = layers.project / "SYSTEM.md"
    texts = []
    for raw in (b"line one\nline two", b"line one\nline two\n", b"line one\nline two\r\n",
                b"line one\nline two\n\n", b"\xef\xbb\xbfline one\nline two\n"):
        seed.write_bytes(raw)
        texts.append(resolve_blocks(layers, "default")[0].text)
    assert set(texts) == {"line one\nline two"}


def test_unchanged_files_reconcile_to_nothing_and_an_edit_to_a_replace(layers: Layers) -> None:
    (layers.project / "APPEND_SYSTEM.md").write_text("house rules\n")
    log = initial_entries(resolve_blocks(layers, "default", host_block="host"))
    assert reconcile(log, resolve_blocks(layers, "default", host_block="host")) == []
    (layers.project / "APPEND_SYSTEM.md").write_text("house rules, revised\n")
    added = reconcile(log, resolve_blocks(layers, "default", host_block="host"))
    assert effective(log + added) == ("default", "house rules, revised", "host")


def test_default_layers_follow_the_conventions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    made = Layers.default(tmp_path / "work")
    assert made.base == Path(sysprompt.__file__).parent / "system"
    assert made.user == tmp_path / "xdg" / "host_kernel"
    assert made.project == tmp_path / "work" / ".host_kernel"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Layers.default(tmp_path).user == tmp_path / "home" / ".config" / "host_kernel"


def test_the_package_ships_no_base_seed() -> None:
    base = Layers.default(os.getcwd()).base
    assert base.is_dir()
    assert not (base / "SYSTEM.md").exists()


# ----------------------------------------------------------------------------- serialisation


def test_to_openai_gives_one_system_message_per_block() -> None:
    assert to_openai(("a\n", "b")) == [{"role": "system", "content": "a\n"},
                                       {"role": "system", "content": "b"}]
    assert to_openai(()) == []


def test_join_single_strips_trailing_newlines_and_separates_with_a_rule() -> None:
    assert join_single(("a\n\n", "b\r\n", "c")) == "a\n\n---\n\nb\n\n---\n\nc"
    assert join_single(("only\n",)) == "only"
    assert join_single(()) == ""


def test_a_symlink_in_the_project_layer_is_refused_not_followed(tmp_path: Path) -> None:
    """The project layer is in the workspace, which the kernel can write: a link there
    must not make the Host read (and send to the model) a file the kernel cannot."""
    secret = tmp_path / "hidden" / "key.txt"
    secret.parent.mkdir()
    secret.write_text("sk-SECRET\n")
    workdir = tmp_path / "ws"
    (workdir / ".host_kernel").mkdir(parents=True)
    (workdir / ".host_kernel" / "APPEND_SYSTEM.md").symlink_to(secret)
    lay = Layers(base=tmp_path / "base", user=tmp_path / "user",
                 project=workdir / ".host_kernel")
    with pytest.raises(SystemPromptError, match="symlink"):
        resolve_blocks(lay, "seed")
    (workdir / ".host_kernel" / "APPEND_SYSTEM.md").unlink()
    (workdir / ".host_kernel").rmdir()
    (workdir / ".host_kernel").symlink_to(secret.parent)  # the folder itself a link
    (secret.parent / "SYSTEM.md").write_text("from outside\n")
    with pytest.raises(SystemPromptError, match="symlink"):
        resolve_blocks(lay, "seed")
