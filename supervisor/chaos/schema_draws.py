"""Hypothesis strategies from a tool's JSON schema: the arguments a model could send it.

Why not hypothesis-jsonschema: its latest release (0.23.1) draws every object schema through a
private Hypothesis helper (``cu.many(...).more()``) that the Hypothesis this project depends on
no longer has, so it fails on the first tool. Why not the pydantic model: a ``@tool``
function's model is private to its handler (hermes.tools.function_tool), a tool registered by
hand has a schema and no model, and pydantic v2 has no Hypothesis plugin. The schema is also
what the model is offered and all a real model goes by.

So this module reads the schema itself, for the keywords pydantic writes and the ones a schema
written by hand commonly has. Every keyword is either drawn exactly or refused with its name
(`Undrawable`): a keyword it does not know is never guessed at, and the tool is then left out
of the campaign with that reason. Annotations (title, description, default, examples, ...)
constrain nothing and are skipped. Sizes the schema leaves open are kept small: a value drawn
smaller than it might be is still one the schema accepts.
"""
from __future__ import annotations

import json
import math
import re
from datetime import timezone
from typing import Any

from hypothesis import strategies as st

OPEN_ITEMS = 4        # at most this many items beyond an array's minItems when it names no maxItems
OPEN_TEXT = 40        # at most this many characters when a string names no maxLength
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                         "$schema", "$id", "$comment", "discriminator", "$defs", "definitions"})
FORMATS = {
    "date-time": st.datetimes(timezones=st.just(timezone.utc)).map(lambda d: d.isoformat()),
    "date": st.dates().map(lambda d: d.isoformat()),
    "time": st.times().map(lambda t: t.isoformat()),
    "uuid": st.uuids().map(str),
    "email": st.emails(),
}
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=OPEN_TEXT),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=6)


class Undrawable(ValueError):
    """The schema asks for something this module does not draw (the reason, one line)."""


def strategy(schema: Any) -> st.SearchStrategy[Any]:
    """Values `schema` accepts; Undrawable when some keyword of it cannot be drawn exactly."""
    return _Reader(schema).read(schema, ())


class _Reader:
    def __init__(self, root: Any) -> None:
        self.root = root if isinstance(root, dict) else {}

    def read(self, schema: Any, refs: tuple[str, ...]) -> st.SearchStrategy[Any]:
        if schema is True or schema == {}:
            return _JSON
        if schema is False:
            raise Undrawable("a schema that accepts nothing (false)")
        if not isinstance(schema, dict):
            raise Undrawable(f"a schema that is not an object ({schema!r})")
        schema = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
        if "$ref" in schema:
            return self._ref(schema, refs)
        if "allOf" in schema:
            return self._all_of(schema, refs)
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise Undrawable("an enum that lists no value")
            return st.sampled_from(values)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._branches(schema, key, refs)
        kinds = schema.get("type")
        if isinstance(kinds, list):
            rest = {k: v for k, v in schema.items() if k != "type"}
            if not kinds:
                raise Undrawable("a type list that names no type")
            return st.one_of([self.read({**rest, "type": k}, refs) for k in kinds])
        if kinds is None:
            kinds = "object" if "properties" in schema else "array" if "items" in schema else None
        if kinds is None:
            unknown = sorted(schema)
            if unknown:
                raise Undrawable(f"keyword(s) {', '.join(unknown)} without a type")
            return _JSON
        return self._typed(str(kinds), schema, refs)

    # ------------------------------------------------------------ combinators
    def _ref(self, schema: dict[str, Any], refs: tuple[str, ...]) -> st.SearchStrategy[Any]:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Undrawable(f"a $ref outside the schema ({ref!r})")
        if ref in refs:
            raise Undrawable(f"a recursive schema ({ref} refers to itself)")
        target: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise Undrawable(f"a $ref to nothing ({ref})")
            target = target[part]
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        merged = {**target, **rest} if isinstance(target, dict) else target
        return self.read(merged, (*refs, ref))

    def _all_of(self, schema: dict[str, Any], refs: tuple[str, ...]) -> st.SearchStrategy[Any]:
        parts = schema["allOf"]
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict):
            only = parts[0]
            if set(only) == {"$ref"} or not set(only) & set(rest):
                return self.read({**only, **rest}, refs)
        raise Undrawable("an allOf of several schemas (their intersection is not drawn)")

    def _branches(self, schema: dict[str, Any], key: str, refs: tuple[str, ...]) -> st.SearchStrategy[Any]:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise Undrawable(f"an empty {key}")
        if key == "oneOf" and "discriminator" not in schema and len(branches) > 1:
            # A value of one branch may match another too, which oneOf forbids; a discriminated
            # union (pydantic's) keeps the branches apart by their tag.
            raise Undrawable("a oneOf without a discriminator (its branches may overlap)")
        rest = {k: v for k, v in schema.items() if k not in (key, "discriminator")}
        return st.one_of([self.read({**b, **rest} if isinstance(b, dict) and rest else b, refs) for b in branches])

    # ------------------------------------------------------------ typed values
    def _typed(self, kind: str, schema: dict[str, Any], refs: tuple[str, ...]) -> st.SearchStrategy[Any]:
        known = {"string": ("type", "minLength", "maxLength", "pattern", "format"),
                 "integer": ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
                 "number": ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
                 "boolean": ("type",), "null": ("type",),
                 "array": ("type", "items", "prefixItems", "minItems", "maxItems", "uniqueItems"),
                 "object": ("type", "properties", "required", "additionalProperties")}
        if kind not in known:
            raise Undrawable(f"a value of type {kind!r}")
        unknown = sorted(set(schema) - set(known[kind]))
        if unknown:
            raise Undrawable(f"keyword(s) {', '.join(unknown)} on a {kind}")
        if kind == "string":
            return _string(schema)
        if kind in ("integer", "number"):
            return _number(schema, kind == "integer")
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        if kind == "array":
            return self._array(schema, refs)
        return self._object(schema, refs)

    def _array(self, schema: dict[str, Any], refs: tuple[str, ...]) -> st.SearchStrategy[Any]:
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        high = low + OPEN_ITEMS if high is None else min(int(high), low + OPEN_ITEMS)
        if high < low:
            raise Undrawable("an array with maxItems below minItems")
        prefix = [self.read(p, refs) for p in schema.get("prefixItems") or []]
        items = schema.get("items", True)
        rest = self.read(items, refs) if items is not False else None
        unique = bool(schema.get("uniqueItems"))
        if prefix:
            if unique:
                raise Undrawable("uniqueItems with prefixItems")
            tail_low, tail_high = max(0, low - len(prefix)), max(0, high - len(prefix))
            if rest is None:
                if low > len(prefix):
                    raise Undrawable("an array with more minItems than its prefixItems allow")
                return st.tuples(*prefix).map(list)
            return st.tuples(st.tuples(*prefix), st.lists(rest, min_size=tail_low, max_size=tail_high)).map(
                lambda parts: [*parts[0], *parts[1]])
        if rest is None:
            if low:
                raise Undrawable("an array that allows no items and needs some")
            return st.just([])
        key = (lambda v: json.dumps(v, sort_keys=True)) if unique else None
        return st.lists(rest, min_size=low, max_size=high, unique_by=key)

    def _object(self, schema: dict[str, Any], refs: tuple[str, ...]) -> st.SearchStrategy[Any]:
        properties = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        extra = schema.get("additionalProperties", True)
        needed = {}
        for name in required:
            if name in properties:
                needed[name] = self.read(properties[name], refs)
            elif isinstance(extra, dict):
                needed[name] = self.read(extra, refs)
            elif extra is False:
                raise Undrawable(f"a required property {name!r} that no property allows")
            else:
                needed[name] = _JSON
        optional = {n: self.read(s, refs) for n, s in properties.items() if n not in needed}
        base = st.fixed_dictionaries(needed, optional=optional)
        if isinstance(extra, dict) and not properties:  # a mapping (pydantic's dict[str, X])
            more = st.dictionaries(st.text(max_size=12).filter(lambda k: k not in needed), self.read(extra, refs),
                                   max_size=OPEN_ITEMS)
            return st.tuples(base, more).map(lambda parts: {**parts[1], **parts[0]})
        return base  # no property beyond the declared ones: every schema accepts that


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    low = int(schema.get("minLength", 0))
    given_high = schema.get("maxLength")
    high = int(given_high) if given_high is not None else max(low, 0) + OPEN_TEXT
    if high < low:
        raise Undrawable("a string with maxLength below minLength")
    fmt, pattern = schema.get("format"), schema.get("pattern")
    if fmt is not None and pattern is not None:
        raise Undrawable("a string with both a format and a pattern")
    if fmt is not None:
        if fmt not in FORMATS:
            raise Undrawable(f"a string of format {fmt!r}")
        return FORMATS[fmt].filter(lambda s: low <= len(s) <= (high if given_high is not None else math.inf))
    if pattern is not None:
        try:
            re.compile(str(pattern))
        except re.error as exc:
            raise Undrawable(f"a pattern Python cannot read ({exc})") from None
        return st.from_regex(str(pattern), fullmatch=True).filter(
            lambda s: low <= len(s) <= (high if given_high is not None else math.inf))
    return st.text(min_size=low, max_size=high)


def _number(schema: dict[str, Any], integer: bool) -> st.SearchStrategy[int | float]:
    low, high = schema.get("minimum"), schema.get("maximum")
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    for name, value in (("minimum", low), ("maximum", high), ("exclusiveMinimum", ex_low),
                        ("exclusiveMaximum", ex_high)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise Undrawable(f"a {name} that is not a number ({value!r})")
    multiple = schema.get("multipleOf")
    if integer or multiple is not None:
        if multiple is not None and (not isinstance(multiple, int) or isinstance(multiple, bool) or multiple <= 0):
            raise Undrawable(f"a multipleOf that is not a positive integer ({multiple!r})")
        step = multiple or 1
        lows = [math.ceil(v) for v in (low,) if v is not None]
        lows += [math.floor(v) + 1 for v in (ex_low,) if v is not None]
        highs = [math.floor(v) for v in (high,) if v is not None]
        highs += [math.ceil(v) - 1 for v in (ex_high,) if v is not None]
        k_low = math.ceil(max(lows) / step) if lows else None
        k_high = math.floor(min(highs) / step) if highs else None
        if k_low is not None and k_high is not None and k_high < k_low:
            raise Undrawable("a number range with no value in it")
        drawn = st.integers(k_low, k_high).map(lambda k: k * step)
        return drawn if integer else drawn.map(float)
    # The tighter of each pair of bounds; an exclusive one excludes its own value.
    lower = max([(v, False) for v in (low,) if v is not None] + [(v, True) for v in (ex_low,) if v is not None],
                default=None)
    upper = min([(v, False) for v in (high,) if v is not None] + [(v, True) for v in (ex_high,) if v is not None],
                key=lambda b: (b[0], not b[1]), default=None)
    return st.floats(min_value=None if lower is None else lower[0], max_value=None if upper is None else upper[0],
                     exclude_min=bool(lower and lower[1]), exclude_max=bool(upper and upper[1]),
                     allow_nan=False, allow_infinity=False)
