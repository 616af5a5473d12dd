"""The runner's reporting path as it was before declared code ran, and the checks against it.

Runs inside the reproduction, never in the Host. ``boot.py`` calls :func:`take`
once, after it has imported the runner, its plugins and the Host's reporter
and before any folder of the tree is on the import path; from then on the
reporter asks the :class:`Baseline` it got whether anything changed:

- :meth:`Baseline.narrow` (after every test phase, and between tests): the
  entries of the reporting path — the module globals and class attributes of
  the modules that make, count, log and summarise reports
  (``_pytest.reports``, ``_pytest.runner``, ``_pytest.terminal``,
  ``_pytest.main``, pluggy's hook calling, unittest's case, result and runner,
  the Host's own reporter) — by object identity, and each function's code
  object by identity; ``os.write``, ``os.fstat``, ``os._exit`` and
  ``json.dumps``, which a test may patch for itself, between tests only;
- :meth:`Baseline.wide` (after collection and at the end): that, plus every
  class and function of every other module of pytest, pluggy and unittest (one
  of the installation's own functions may stand in for another: pytest's
  ``legacypath`` does so at configure time; data attributes are pytest's own
  state), and a hash of each reporting-path function's ``co_code`` and
  ``co_consts`` (code changed in place);
- :meth:`Baseline.trusted`: whether a hook implementation is the runner's.
  It is only when its function object was reachable, at boot, from a module
  object loaded from the installation (``sys.modules`` before any tree folder
  was on the path) and still has the code it had then — never by what its
  ``co_filename`` or ``__module__`` say, which any code can forge.

Every reference used here is bound when this module is imported (module
globals captured at boot), so a test that replaces ``isinstance`` or ``id``
later does not change what is compared. It is a check inside the judged
process: code that reaches the baseline object itself can still defeat it
(docs/trust.md says what that takes).
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Baseline", "baseline", "take"]

#: The reporting path, checked around every test phase: module → every global and
#: every attribute of every class it defines (None), or only the names listed.
NARROW: dict[str, tuple[str, ...] | None] = {
    "_pytest.reports": None, "_pytest.runner": None, "_pytest.terminal": None,
    "_pytest.main": None, "_pytest.skipping": None, "_pytest.outcomes": None,
    "_pytest.subtests": None, "_pytest.unittest": None, "_pytest.python": None,
    "pluggy._hooks": None, "pluggy._callers": None, "pluggy._manager": None,
    "pluggy._result": None, "pytest": ("TestReport", "CollectReport", "CallInfo", "Session",
                                       "Function", "hookimpl"),
    "unittest.case": None, "unittest.result": None, "unittest.runner": None,
    "unittest.suite": None, "unittest.main": None, "unittest.signals": None,
    "host_kernel.reproduce.plugin": None, "host_kernel.reproduce.integrity": None,
    "os": ("write", "fstat", "_exit"), "json": ("dumps",),
}
#: Entries a test may patch for itself (``monkeypatch.setattr(os, "fstat", …)``): checked
#: between tests and at the end, not while a test runs.
BETWEEN = frozenset({"os", "json"})
#: Checked after collection and at the end: every module under these names.
WIDE = ("_pytest", "pytest", "pluggy", "unittest", "host_kernel.reproduce")

_isinstance = isinstance
_type = type
_vars = vars
_id = id
_FunctionType = types.FunctionType
_MethodType = types.MethodType
_ModuleType = types.ModuleType
_blake2b = hashlib.blake2b
_is = operator.is_
_repeat = itertools.repeat
_getcode = operator.attrgetter("__code__")

#: One watched entry: (its mapping, key, the object there at boot, the function whose code is
#: watched or None, that code, the dotted name of the mapping's owner).
Entry = tuple[Mapping[str, Any], str, Any, Any, Any, str]
_MISSING = object()


Entries = tuple[Entry, ...]
_COLUMNS: dict[int, tuple[Entries, tuple[Any, ...]]] = {}


def _columns(entries: Entries) -> tuple[Any, ...]:
    """``entries`` grouped for a check in C: ((table, keys, values) per table, functions,
    codes), made once per list."""
    made = _COLUMNS.get(_id(entries))
    if made is None or made[0] is not entries:
        groups: dict[int, tuple[Mapping[str, Any], list[str], list[Any]]] = {}
        for e in entries:
            group = groups.setdefault(_id(e[0]), (e[0], [], []))
            group[1].append(e[1])
            group[2].append(e[2])
        watched = [e for e in entries if e[3] is not None]
        made = (entries, (tuple((t, tuple(k), tuple(v)) for t, k, v in groups.values()),
                          tuple(e[3] for e in watched), tuple(e[4] for e in watched)))
        _COLUMNS[_id(entries)] = made
    return made[1]


def _function_of(value: Any) -> Any:
    """The function behind a function, classmethod, staticmethod or property, or None."""
    kind = _type(value)
    if kind is classmethod or kind is staticmethod:
        value = value.__func__
    elif kind is property:
        value = value.fget
    return value if _type(value) is _FunctionType else None


def _code_of(value: Any) -> Any:
    function = _function_of(value)
    return None if function is None else function.__code__


def _code_hash(code: Any, h: Any) -> None:
    h.update(code.co_code)
    for const in code.co_consts:
        if _isinstance(const, types.CodeType):
            _code_hash(const, h)
        else:
            h.update(repr(const).encode())


def _entries(name: str, module: Any, only: tuple[str, ...] | None) -> list[Entry]:
    found: list[Entry] = []
    table = _vars(module)
    for key in (only if only is not None else list(table)):
        if key not in table:
            continue
        value = table[key]
        function = _function_of(value)
        found.append((table, key, value, function, getattr(function, "__code__", None), name))
        if only is None and _isinstance(value, _type) and \
                getattr(value, "__module__", None) == name:
            # A class defined here (where it says: this chooses what is watched, never
            # what is trusted): each of its own attributes.
            attrs = value.__dict__
            owner = f"{name}.{key}"
            for attr, item in list(attrs.items()):
                function = _function_of(item)
                found.append((attrs, attr, item, function,
                              getattr(function, "__code__", None), owner))
    return found


class Baseline:
    """What the reporting path and the installation's hook functions were at boot."""

    __slots__ = (
        "_between",
        "_codes",
        "_conftests",
        "_functions",
        "_hashes",
        "_narrow",
        "_wide",
    )

    def __init__(self, modules: Mapping[str, Any]) -> None:
        narrow: list[Entry] = []
        between: list[Entry] = []
        for name, only in NARROW.items():
            module = modules.get(name)
            if module is not None:
                (between if name in BETWEEN else narrow).extend(_entries(name, module, only))
        wide: list[Entry] = []
        for name in list(modules):
            runner = name.split(".")[0] in WIDE or name.startswith(WIDE[-1])
            if runner and name not in NARROW and _isinstance(modules[name], _ModuleType):
                wide += _entries(name, modules[name], None)
        # Tuples: what is watched cannot be emptied in place.
        self._narrow: Entries = tuple(narrow)
        self._between: Entries = tuple(between)
        self._wide: Entries = tuple(wide)
        self._hashes = self._hash_codes()
        #: Every function reachable from a module (or its classes) at boot → its code.
        self._functions: dict[int, tuple[Any, Any]] = {}
        for module in list(modules.values()):
            if _isinstance(module, _ModuleType):
                self._collect(_vars(module).values())
        self._codes = {_id(code) for _, code in self._functions.values()}
        #: Conftest modules of the tree's baseline → their hook functions at registration.
        self._conftests: dict[int, tuple[Any, Any]] = {}

    def _collect(self, values: Iterable[Any]) -> None:
        functions = self._functions
        for value in list(values):
            kind = _type(value)
            if kind is _FunctionType:
                functions[_id(value)] = (value, value.__code__)
            elif _isinstance(value, _type):
                for item in list(value.__dict__.values()):
                    item = _function_of(item)
                    if item is not None:
                        functions[_id(item)] = (item, item.__code__)

    def _hash_codes(self) -> str:
        h = _blake2b(digest_size=16)
        for entry in self._narrow:
            if entry[4] is not None:
                _code_hash(entry[4], h)
        return h.hexdigest()

    def _changed(self, entries: Entries, lenient: bool = False) -> list[str]:
        """Entries whose object or code differs from boot. ``lenient`` (the runner's other
        modules): only code and classes count, and pytest may put one of the
        installation's own functions in place of another (``_pytest.legacypath`` does)."""
        groups, functions, codes = _columns(entries)
        # The common case in C: every entry still the object, and the code, it was at boot.
        if all(all(map(_is, map(table.get, keys, _repeat(_MISSING)), values))
               for table, keys, values in groups) and \
                all(map(_is, map(_getcode, functions), codes)):
            return []
        found = []
        for table, key, value, function, code, owner in entries:
            now = table.get(key, _MISSING)
            if now is value and (function is None or function.__code__ is code):
                continue
            if lenient:
                if code is None and not _isinstance(value, _type):
                    continue  # data: pytest keeps its state in some class attributes
                replaced = _code_of(now)
                if replaced is not None and _id(replaced) in self._codes:
                    continue
            where = f"{owner}.{key}"
            if now is _MISSING:
                found.append(f"{where} was removed")
            elif now is not value:
                found.append(f"{where} was replaced")
            else:
                found.append(f"the code of {where} was replaced")
        return found

    def narrow(self, during: bool = False) -> list[str]:
        """What of the reporting path differs from boot (empty: nothing); ``during`` a
        test, what the test may patch for itself is left for the check after it."""
        found = self._changed(self._narrow)
        return found if during else found + self._changed(self._between)

    def wide(self) -> list[str]:
        """``narrow`` plus every module of the runner, and the reporting path's bytecode."""
        found = self.narrow() + self._changed(self._wide, lenient=True)
        if not found and self._hash_codes() != self._hashes:
            found.append("the bytecode of the runner's reporting path was changed in place")
        return found

    def trust_conftest(self, module: Any) -> None:
        """Trust ``module``'s hooks as they are now (a baseline conftest, just registered)."""
        for name, value in list(_vars(module).items()):
            if name.startswith("pytest_") and _isinstance(value, _FunctionType):
                self._conftests[_id(value)] = (value, value.__code__)

    def trusted(self, function: Any) -> bool:
        """Whether a hook implementation's function is the installation's (or a baseline
        conftest's), by identity, with the code it had."""
        if _isinstance(function, _MethodType):
            function = function.__func__
        for table in (self._functions, self._conftests):
            known = table.get(_id(function))
            if known is not None and known[0] is function:
                return getattr(function, "__code__", None) is known[1]
        return False


_BASELINE: list[Baseline] = []


def take() -> Baseline:
    """The baseline, taken now if it was not yet (boot calls this before any tree folder
    is on the import path)."""
    if not _BASELINE:
        _BASELINE.append(Baseline(dict(sys.modules)))
    return _BASELINE[0]


def baseline() -> Baseline | None:
    """The baseline boot took, or None (a run not started by boot.py)."""
    return _BASELINE[0] if _BASELINE else None
