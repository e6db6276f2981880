"""Turn ``regex`` / ``json_schema`` / ``choices`` / ``ebnf`` sampling parameters into what a
grammar backend compiles.

Contract:
- ``constraint_of(params, whitespace, backend)`` returns None for an unconstrained request,
  else a ``Constraint(kind, key, source)``; ``key`` (kind + canonical spec) identifies the
  compiled grammar in the backend's cache; ``source`` is a regex for "outlines" and a
  llguidance grammar (validated here, see llg_spec.py) for "llguidance".  Results are
  memoized, so repeated validation is cheap.  Called synchronously by the request front
  door (``request_builder``), so every problem below is a 400 before anything is queued;
  the scheduler calls it again with ``validate=False`` (llguidance's grammar check, as long
  as the compile itself, is not repeated; the compile reports what it would find).
- ``ebnf`` (a Lark or GBNF grammar) needs llguidance; with outlines it is refused, naming
  the field and the backend it needs.
- Every problem raises ``ValueError("sampling_params.<field>: ...")`` carrying the parser's
  message: a regex that Python's ``re`` parser rejects (outlines-core's own error text is
  only "error building NFA"), lookaround / backreferences / anchors, which neither
  automaton-based backend supports (a leading ``^`` / trailing ``$`` is dropped: the whole
  output always matches), or a schema the backend rejects: outlines-core's
  ``build_regex_from_schema`` (keywords it would silently ignore are enforced or rejected,
  json_schema.py), llguidance's JSON compiler with its lenient mode off (it names the
  unimplemented keywords).  With outlines, Rust-only escapes that Python does not know
  (``\\p{L}``...) are left to the compiler, whose failure then fails the request
  asynchronously; llguidance validates them here.
- ``choices`` compile to an alternation of the literal choices (regex metacharacters
  escaped: ``a.b`` matches only that text).
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

try:  # Python >= 3.11
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

from radixserve.config import DEFAULT_GRAMMAR_BACKEND
from radixserve.constrained.protocols import GrammarSampling

OUTLINES_WHITESPACE = r"[ ]?"  # outlines-core's default; the server's default is "" (compact)
_META = set("\\.+*?()|[]{}^$#&-~")
_UNSUPPORTED = {"ASSERT": "lookaround assertions", "ASSERT_NOT": "lookaround assertions",
                "GROUPREF": "backreferences", "GROUPREF_EXISTS": "conditional backreferences",
                "AT": "anchors other than a leading ^ and a trailing $ (\\b, \\A, \\Z, inner ^ or $)",
                "ATOMIC_GROUP": "atomic groups", "POSSESSIVE_REPEAT": "possessive repeats"}


@dataclass(frozen=True)
class Constraint:
    kind: str  # "regex" | "json" | "choices" | "ebnf"
    key: tuple  # (kind, canonical spec, whitespace) -> compiled-grammar cache key
    source: str  # what the backend compiles: a regex (outlines) or a llguidance grammar


def escape(text: str) -> str:
    """Escape regex metacharacters for the Rust regex syntax outlines-core uses."""
    return "".join("\\" + c if c in _META else c for c in text)


def _walk(tree: Any) -> Optional[str]:
    for op, av in tree:
        name = str(op)
        if name in _UNSUPPORTED:
            return _UNSUPPORTED[name]
        items = av if isinstance(av, (list, tuple)) else [av]
        for x in items:
            if isinstance(x, sre_parse.SubPattern):
                bad = _walk(x)
                if bad:
                    return bad
            elif isinstance(x, (list, tuple)):
                for y in x:
                    if isinstance(y, sre_parse.SubPattern):
                        bad = _walk(y)
                        if bad:
                            return bad
    return None


def strip_anchors(pattern: str) -> str:
    """Drop a leading ``^`` and a trailing unescaped ``$``: the whole output always matches."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$"):
        k = len(pattern) - 1
        while k > 0 and pattern[k - 1] == "\\":
            k -= 1
        if (len(pattern) - 1 - k) % 2 == 0:
            pattern = pattern[:-1]
    return pattern


@lru_cache(maxsize=1024)
def check_regex(pattern: str, field: str = "regex") -> None:
    """Raise ValueError when the pattern is invalid or uses an unsupported feature."""
    try:
        tree = sre_parse.parse(pattern)
    except re.error as e:
        if "bad escape" in str(e):  # a Rust-only class such as \p{L}: the compiler decides
            return
        raise ValueError(f"sampling_params.{field}: invalid regular expression: {e}") from None
    except RecursionError:
        raise ValueError(f"sampling_params.{field}: the regular expression is nested too deeply") from None
    bad = _walk(tree)
    if bad:
        raise ValueError(f"sampling_params.{field}: {bad} are not supported in constrained generation")


@lru_cache(maxsize=1024)
def _schema_regex(schema: str, whitespace: str) -> str:
    from radixserve.constrained.schema.json_schema import schema_to_regex

    try:
        return schema_to_regex(schema, whitespace)
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise ValueError(f"sampling_params.json_schema: unsupported or invalid schema: {e}") from None
    except BaseException as e:  # a Rust panic surfaces as pyo3's PanicException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise ValueError(f"sampling_params.json_schema: unsupported or invalid schema: {e}") from None


def canonical_schema(schema: Any) -> str:
    """The schema as compact JSON (key order kept: it is the order of the output's
    properties); a string must hold a JSON object or boolean."""
    if isinstance(schema, (dict, bool)):
        try:
            return json.dumps(schema)
        except (TypeError, ValueError) as e:
            raise ValueError(f"sampling_params.json_schema: not serializable as JSON: {e}") from None
    if isinstance(schema, str):
        try:
            obj = json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"sampling_params.json_schema: invalid JSON: {e}") from None
        if not isinstance(obj, (dict, bool)):
            raise ValueError("sampling_params.json_schema: a schema must be a JSON object")
        return json.dumps(obj)
    raise ValueError("sampling_params.json_schema: must be a JSON string or an object")


def _outlines_source(kind: str, value: str, ws: str, validate: bool = True) -> str:
    # ``validate`` changes nothing here: the regex built is the compile's own input
    if kind == "json":
        return _schema_regex(value, ws)
    if kind == "choices":
        return "(" + "|".join(escape(c) for c in json.loads(value)) + ")"
    if kind == "ebnf":
        raise ValueError("sampling_params.ebnf: grammars need the llguidance grammar backend "
                         "(start the server with --grammar-backend llguidance); outlines-core takes "
                         "regex, json_schema and choices")
    return value


def _llguidance_source(kind: str, value: str, ws: str, validate: bool = True) -> str:
    from radixserve.constrained.schema.llg_spec import llguidance_source

    return llguidance_source(kind, value, ws, validate)


SOURCES = {"outlines": _outlines_source, "llguidance": _llguidance_source}
FIELDS = ("regex", "json_schema", "choices", "ebnf")


def constraint_of(params: GrammarSampling, whitespace: Optional[str] = None,
                  backend: str = DEFAULT_GRAMMAR_BACKEND, validate: bool = True) -> Optional[Constraint]:
    """The constraint a SamplingParams asks for (None when unconstrained), compiled by
    ``backend`` ("outlines" or "llguidance") from ``Constraint.source``.  ``validate=False``
    (the scheduler, behind the front door): llguidance's grammar check is left to the compile."""
    values = {name: getattr(params, name, None) for name in FIELDS}
    given = [n for n in FIELDS if values[n] is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"sampling_params.{given[1]}: give only one of regex, json_schema, choices and ebnf")
    ws = OUTLINES_WHITESPACE if whitespace is None else whitespace
    to_source = functools.partial(SOURCES[backend], validate=validate)
    regex, schema, choices, ebnf = (values[n] for n in FIELDS)
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise ValueError("sampling_params.regex: must be a non-empty string")
        regex = strip_anchors(regex)
        check_regex(regex)
        return Constraint("regex", ("regex", regex), to_source("regex", regex, ws))
    if schema is not None:
        canon = canonical_schema(schema)
        return Constraint("json", ("json", canon, ws), to_source("json", canon, ws))
    if ebnf is not None:
        if not isinstance(ebnf, str) or not ebnf.strip():
            raise ValueError("sampling_params.ebnf: must be a non-empty string (a Lark or GBNF grammar)")
        return Constraint("ebnf", ("ebnf", ebnf), to_source("ebnf", ebnf, ws))
    if (not isinstance(choices, (list, tuple)) or not choices
            or not all(isinstance(c, str) and c for c in choices)):
        raise ValueError("sampling_params.choices: must be a non-empty list of non-empty strings")
    canon = json.dumps(list(choices))
    return Constraint("choices", ("choices", canon), to_source("choices", canon, ws))
