"""Checking ``output`` against a submitter's ``output_schema``, with bounds.

Owns one question for the verifier (host_kernel/verify/): does ``output``
match the JSON Schema the submitter gave, decided without letting that schema
hold the Host. The schema's size, nesting and shape are bounded first; then every
keyword application draws a step from one budget, patterns compile and match
with ``regex`` under a time limit they share, ``uniqueItems`` is linear, and a
``$ref`` is followed only inside the schema, never fetched. It knows nothing of
records or modes; failures come back as ``(code, message)``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["check_output_schema", "json_depth"]


def json_depth(value: Any, limit: int) -> int:
    """How deeply dicts and lists nest in ``value``, counted up to ``limit + 1`` only."""
    depth, frontier = 0, [value]
    while frontier:
        depth += 1
        if depth > limit:
            return depth
        nxt: list[Any] = []
        for v in frontier:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        frontier = nxt
    return depth - 1


def check_output_schema(out: Any, schema: Any) -> tuple[str, str] | None:
    """``output`` against ``output_schema`` (JSON Schema, any draft jsonschema knows), bounded.

    The schema is the submitter's, so checking it must not be able to hold the
    Host. :func:`_check_schema_shape` bounds its size, nesting and shape first; then
    the check of the schema against its metaschema and of ``output`` against it
    run under one :class:`_Budget`: every keyword application draws a step,
    patterns compile and match with ``regex`` under a time limit they all share,
    ``uniqueItems`` is linear, and a ``$ref`` is followed only inside the schema,
    never fetched. Past a bound: ``schema_too_costly``; a schema that cannot be
    applied: ``schema_invalid``; ``output`` not matching: ``output_schema``.
    """
    import jsonschema
    import referencing
    import referencing.exceptions
    from jsonschema.exceptions import best_match

    budget = _Budget()
    token = _BUDGET.set(budget)
    try:
        _check_schema_shape(schema)
        base = jsonschema.validators.validator_for(schema,
                                                   default=jsonschema.Draft202012Validator)
        _check_against_metaschema(schema, base, budget)
        if isinstance(schema, dict):  # its draft is chosen: _check_schema_shape says why
            schema = {k: v for k, v in schema.items() if k != "$schema"}
        validator = _budgeted_class(base)(schema, registry=referencing.Registry())
        error = best_match(validator.iter_errors(out))
    except jsonschema.SchemaError as exc:
        return ("schema_invalid", f"output_schema is not a valid JSON Schema: "
                                 f"{_clip(exc.message)}; fix the schema")
    except _SchemaInvalid as exc:
        return ("schema_invalid", f"output_schema cannot be applied: {exc}; fix the schema")
    except _SchemaTooCostly as exc:
        return ("schema_too_costly", f"output_schema is too costly to check: {exc}")
    except RecursionError:
        return ("schema_too_costly", "output_schema is too costly to check: its references "
                                    "lead into each other without end; give every $ref a "
                                    "schema that describes a part of output")
    except referencing.exceptions.Unresolvable as exc:
        return ("schema_invalid", f"output_schema has a $ref the Host cannot resolve "
                                 f"({_clip(str(exc))}); references are followed only "
                                 f"inside the schema (#/$defs/…), never fetched")
    except Exception as exc:  # noqa: BLE001 - a submitter's schema in a third-party library
        return ("schema_invalid", f"output_schema cannot be applied ({type(exc).__name__}: "
                                 f"{_clip(str(exc))}); fix the schema")
    finally:
        _BUDGET.reset(token)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    return ("output_schema", f"output does not match output_schema at {_clip(where)}: "
                            f"{_clip(error.message)}")


#: Bounds on checking ``output`` against a submitter's ``output_schema``: the schema's
#: size (as JSON) and nesting, the keyword applications one check may make, the time
#: all its pattern matching may take together, and the time of the whole check.
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_STEPS = 100_000
PATTERN_SECONDS = 0.5
SCHEMA_SECONDS = 1.0
#: unevaluatedProperties and unevaluatedItems judge objects and arrays of at most this
#: many members: jsonschema's work for them grows with the square of the count.
MAX_UNEVALUATED_MEMBERS = 1_000
MESSAGE_CHARS = 300
#: Limits on one pattern's shape, checked before it is compiled (see _pattern_problem).
MAX_PATTERN_NESTING = 100
MAX_PATTERN_REPEAT = 100_000
_SMALLER = ("; use fewer anyOf/oneOf branches and references, or keep output small (save "
            "large results as artifacts and name them in output)")


class _SchemaTooCostly(Exception):
    """Checking output against output_schema went past one of the bounds."""


class _SchemaInvalid(Exception):
    """output_schema cannot be applied (a pattern that ``regex`` cannot compile)."""


def _clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _short(value: Any) -> str:
    return _clip(repr(value), 60)


def _check_schema_shape(schema: Any) -> None:
    """Bounds and shape rules checked before the schema is applied; raises when one fails.

    _SchemaTooCostly when it is too big or deep, or a pattern is too costly to
    compile (:func:`_pattern_problem`); _SchemaInvalid when it is not a schema
    or breaks a shape rule. The shape rules keep every schema the check can
    reach the submitter's own and without a ``$schema`` of its own: jsonschema
    hands a (sub)schema that names a ``$schema`` to that draft's stock
    validator, which no budget bounds. So ``$schema`` may appear only at the
    top (it picks the draft, and is then set aside), every ``$ref``,
    ``$dynamicRef`` and ``$recursiveRef`` is a fragment of this schema
    (``#…``), and no ``$id``/``id`` names json-schema.org (where the drafts'
    metaschemas live). The rules read every key at any depth, so a property so
    named counts too.
    """
    if not isinstance(schema, (dict, bool)):
        raise _SchemaInvalid(f"it must be a JSON Schema (a dict, or true or false), not "
                             f"{type(schema).__name__}")
    try:
        size = len(json.dumps(schema).encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        raise _SchemaInvalid("it must be JSON-serialisable") from None
    if size > MAX_SCHEMA_BYTES or json_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise _SchemaTooCostly(f"it is over {MAX_SCHEMA_BYTES:,} bytes as JSON or nested more "
                               f"than {MAX_SCHEMA_DEPTH} levels deep; give a smaller schema, or "
                               f"leave it out")
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        raise _SchemaInvalid("its $schema must be a string (a draft's URI)")
    keys: set[str] = set()
    frontier: list[tuple[Any, bool]] = [(schema, True)]
    while frontier:
        value, top = frontier.pop()
        if isinstance(value, list):
            frontier.extend((v, False) for v in value)
            continue
        if not isinstance(value, dict):
            continue
        for key, v in value.items():
            keys.add(key)
            frontier.append((v, False))
            if key == "$schema" and not top:
                raise _SchemaInvalid("it may name $schema only at its top; remove the inner "
                                     "$schema")
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(v, str) \
                    and not v.startswith("#"):
                raise _SchemaInvalid(f"its {key} {_short(v)} points outside it; references may "
                                     f"only be fragments of the schema itself, such as "
                                     f"'#/$defs/item'")
            if key in ("$id", "id") and isinstance(v, str) and "json-schema.org" in v.lower():
                raise _SchemaInvalid(f"its {key} {_short(v)} names json-schema.org, where the "
                                     f"drafts' metaschemas live; give it an id of its own or "
                                     f"none")
            if key == "pattern" and isinstance(v, str):
                patterns = [v]
            elif key == "patternProperties" and isinstance(v, dict):
                patterns = [k for k in v if isinstance(k, str)]
            else:
                patterns = []
            for pattern in patterns:
                problem = _pattern_problem(pattern)
                if problem is not None:
                    raise _SchemaTooCostly(f"the pattern {_short(pattern)} {problem}")
    if "unevaluatedProperties" in keys and "patternProperties" in keys:
        raise _SchemaTooCostly("it uses unevaluatedProperties together with patternProperties, "
                               "whose patterns jsonschema matches there without any time "
                               "limit; use additionalProperties instead of "
                               "unevaluatedProperties")


_COUNT = re.compile(r"\{(\d{1,12})(?:,(\d{0,12}))?\}|\{,(\d{1,12})\}")


def _pattern_problem(pattern: str) -> str | None:
    """Why compiling ``pattern`` could itself hold the Host, or None.

    ``regex`` builds nested counted repetition of a literal out in full when it
    compiles (``((a{100}){100}){100}`` is a million characters), and both
    engines recurse once per nested group. So groups may nest at most
    MAX_PATTERN_NESTING deep, and the counts of nested ``{m,n}`` quantifiers
    may multiply to at most MAX_PATTERN_REPEAT along any path.
    """
    stack: list[int] = []  # the largest product inside each enclosing open group
    current = worst = 1
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        i += 1
        if ch == "\\":
            i += 1
            continue
        if ch == "(":
            stack.append(current)
            current = 1
            if len(stack) > MAX_PATTERN_NESTING:
                return f"nests groups more than {MAX_PATTERN_NESTING} deep"
            continue
        inner = 1
        if ch == ")" and stack:
            inner, current = current, stack.pop()
        elif ch == "[":  # a class is one atom: skip to its closing bracket
            i += 1 if pattern[i:i + 1] == "^" else 0
            i += 1 if pattern[i:i + 1] == "]" else 0
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        count = _COUNT.match(pattern, i)
        if count is not None:
            i = count.end()
            inner *= max(int(n) for n in count.groups() if n)
        current = max(current, inner)
        worst = max(worst, current)
        if worst > MAX_PATTERN_REPEAT:
            return (f"repeats a part over {MAX_PATTERN_REPEAT:,} times (counts of nested "
                    f"{{m,n}} multiply, as in (a{{1000}}){{1000}}); use + or * or smaller "
                    f"counts")
    return None


class _Budget:
    """What one schema check may still spend; every keyword application draws on it."""

    def __init__(self) -> None:
        import regex

        self.regex = regex
        self.steps = MAX_SCHEMA_STEPS
        self.deadline = time.monotonic() + SCHEMA_SECONDS
        self.pattern_seconds = PATTERN_SECONDS
        self.compiled: dict[str, Any] = {}

    def step(self, n: int = 1) -> None:
        self.steps -= n
        if self.steps < 0:
            raise _SchemaTooCostly(f"checking output against it takes more than "
                                   f"{MAX_SCHEMA_STEPS:,} steps{_SMALLER}")
        if time.monotonic() > self.deadline:
            raise _SchemaTooCostly(f"checking output against it takes more than "
                                   f"{SCHEMA_SECONDS:g} s{_SMALLER}")

    def search(self, pattern: str, text: str) -> bool:
        """Whether ``pattern`` matches somewhere in ``text``, within the patterns' time left."""
        self.step()
        compiled = self.compiled.get(pattern)
        if compiled is None:
            compiled = self.compiled[pattern] = self.compile(pattern)
        left = min(self.pattern_seconds, self.deadline - time.monotonic())
        if left <= 0:
            raise self._spent()
        started = time.perf_counter()
        try:
            return compiled.search(text, timeout=left, concurrent=True) is not None
        except TimeoutError:
            raise _SchemaTooCostly(f"matching the pattern {_short(pattern)} against "
                                   f"{_short(text)} ran past the {PATTERN_SECONDS:g} s that "
                                   f"all of its patterns may take together (it backtracks "
                                   f"on such text); use patterns without nested or "
                                   f"overlapping repetition such as (a+)+ or (a|aa)+"
                                   ) from None
        finally:
            self.pattern_seconds -= time.perf_counter() - started

    def compile(self, pattern: str) -> Any:
        """``regex.compile(pattern)``, its time counted; _SchemaInvalid when it is not one."""
        if self.pattern_seconds <= 0:
            raise self._spent()
        problem = _pattern_problem(pattern)
        if problem is not None:
            raise _SchemaTooCostly(f"the pattern {_short(pattern)} {problem}")
        started = time.perf_counter()
        try:
            return self.regex.compile(pattern)
        except (self.regex.error, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise _SchemaInvalid(f"the pattern {_short(pattern)} is not a valid regular "
                                 f"expression ({exc})") from None
        finally:
            self.pattern_seconds -= time.perf_counter() - started

    @staticmethod
    def _spent() -> _SchemaTooCostly:
        return _SchemaTooCostly(f"compiling and matching its patterns took more than the "
                                f"{PATTERN_SECONDS:g} s they may take together; use fewer and "
                                f"simpler patterns")


_BUDGET: ContextVar[_Budget] = ContextVar("output_schema_budget")

#: jsonschema keyword function: (validator, keyword value, instance, schema) -> errors.
_Keyword = Callable[[Any, Any, Any, Any], Any]


def _error(message: str) -> Any:
    from jsonschema.exceptions import ValidationError

    return ValidationError(message)


def _kw_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _BUDGET.get().search(pattern, instance):
        yield _error(f"{_short(instance)} does not match {_short(pattern)}")


def _kw_pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                           schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    budget = _BUDGET.get()
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if budget.search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _kw_additional_properties(validator: Any, extra: Any, instance: Any,
                              schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    budget = _BUDGET.get()
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance
              if k not in named and not any(budget.search(p, k) for p in patterns)]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        names = ", ".join(_short(k) for k in sorted(extras)[:10])
        yield _error(f"additional properties are not allowed ({names}"
                     f"{', …' if len(extras) > 10 else ''} unexpected)")


def _canonical(value: Any) -> Any:
    """A hashable stand-in equal for JSON-equal values (1 == 1.0, true != 1)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("other", repr(value))


def _kw_unique_items(validator: Any, unique: Any, instance: Any,
                     schema: Any) -> Iterator[Any]:
    if not unique or not validator.is_type(instance, "array"):
        return
    _BUDGET.get().step(len(instance))
    seen: set[Any] = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield _error(f"the array has non-unique elements ({_short(item)} repeats)")
            return
        seen.add(key)


def _members_bounded(name: str, keyword: _Keyword) -> _Keyword:
    def apply(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if isinstance(instance, (dict, list)) and len(instance) > MAX_UNEVALUATED_MEMBERS:
            raise _SchemaTooCostly(f"{name} applies to {len(instance):,} members of one "
                                   f"object or array, over the {MAX_UNEVALUATED_MEMBERS:,} "
                                   f"it may judge; use additionalProperties or items "
                                   f"instead, or save large results as artifacts")
        yield from keyword(validator, value, instance, schema) or ()
    return apply


def _budgeted(keyword: _Keyword) -> _Keyword:
    def apply(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        _BUDGET.get().step()
        yield from keyword(validator, value, instance, schema) or ()
    return apply


_OVERRIDES: dict[str, _Keyword] = {
    "pattern": _kw_pattern,
    "patternProperties": _kw_pattern_properties,
    "additionalProperties": _kw_additional_properties,
    "uniqueItems": _kw_unique_items,
}
_BUDGETED_CLASSES: dict[Any, Any] = {}


def _check_against_metaschema(schema: Any, base: Any, budget: _Budget) -> None:
    """What ``base.check_schema`` does, drawing on the budget: SchemaError when invalid.

    jsonschema's own check compiles each pattern with ``re`` (its ``regex``
    format) and judges ``uniqueItems`` by comparing every pair, neither of them
    bounded. Here the metaschema is applied by the budgeted class, and a
    pattern is valid when ``regex`` compiles it (compiled once, then reused for
    output). The vocabularies of the 2019-09 and 2020-12 metaschemas name their
    own ``$schema``, so jsonschema applies them with its stock class: their
    patterns are the drafts' own, and their ``uniqueItems`` judge lists of
    strings, which sort.
    """
    import jsonschema
    import referencing

    def compiles(pattern: object) -> bool:
        if isinstance(pattern, str) and pattern not in budget.compiled:
            budget.compiled[pattern] = budget.compile(pattern)
        return True

    meta = jsonschema.validators.validator_for(base.META_SCHEMA, default=base)
    formats = jsonschema.FormatChecker(formats=())
    formats.checkers = dict(meta.FORMAT_CHECKER.checkers)
    formats.checks("regex", raises=_SchemaInvalid)(compiles)
    checker = _budgeted_class(meta)(base.META_SCHEMA, format_checker=formats,
                                    registry=referencing.Registry())
    for error in checker.iter_errors(schema):
        raise jsonschema.SchemaError.create_from(error)


def _budgeted_class(base: Any) -> Any:
    """``base`` (a jsonschema validator class) with every keyword drawing on the budget."""
    cls = _BUDGETED_CLASSES.get(base)
    if cls is None:
        from jsonschema import validators

        keywords: dict[str, _Keyword] = {}
        for name, keyword in base.VALIDATORS.items():
            keyword = _OVERRIDES.get(name, keyword)
            if name in ("unevaluatedProperties", "unevaluatedItems"):
                keyword = _members_bounded(name, keyword)
            keywords[name] = _budgeted(keyword)
        cls = _BUDGETED_CLASSES[base] = validators.extend(base, keywords)
    return cls
