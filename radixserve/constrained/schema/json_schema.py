"""JSON schema -> regex: outlines-core's ``build_regex_from_schema`` plus what it lacks.

outlines-core 0.2 silently ignores some keywords, so its regex would accept documents that
do not validate.  Contract of ``schema_to_regex(schema_json, whitespace)``:
- numeric bounds (``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``,
  draft-4 boolean exclusives included) on ``integer`` and ``number`` are enforced: the
  node is swapped for a placeholder ``const`` and the placeholder in the regex replaced
  by an exact range regex.  A non-integer bound on a ``number`` is tightened to the
  enclosing integer (every output is still valid); bounded numbers have at most
  ``FRACTION_DIGITS`` decimals and no exponent.
- keywords whose constraint a regex cannot (or outlines does not) express raise
  ValueError naming the keyword and its location: ``uniqueItems: true``, ``multipleOf``,
  ``contains``, ``minProperties``/``maxProperties``, ``patternProperties``,
  ``propertyNames``, ``dependentRequired``/``dependentSchemas``/``dependencies``,
  ``unevaluated*``, ``allOf`` with several entries, ``pattern`` together with a length
  bound, bounds on a multi-type node, ``oneOf`` whose branches are not proven disjoint
  (``one_of.py``; proven ones compile as ``anyOf``, which then means the same);
  outlines' own errors (``not``, ``if``, unknown ``format``...) are passed on.
- an empty subschema (``{}``, or annotations only: "any value") below the root is refused:
  outlines-core's regex for it leaves its alternation ungrouped, so inside an object it
  accepted text that is not JSON (JSONSchemaBench, Snowplow sp_141), and spelling out
  every type instead compiles the huge "any object" automaton (memory blow-up).
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

from radixserve.constrained.schema import one_of

FRACTION_DIGITS = 10
_PH = "RXSPH{}Q7Z"  # placeholder const: no regex metacharacters, never a real value
_REJECT = {"multipleOf", "contains", "minContains", "maxContains", "patternProperties", "propertyNames",
           "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems"}
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}


def _same_len(a: str, b: str) -> str:
    """Digit strings of len(a) == len(b) in [a, b] (leading zeros allowed inside)."""
    if a == b:
        return a
    if len(a) == 1:
        return f"[{a}-{b}]"
    if a[0] == b[0]:
        return a[0] + _same_len(a[1:], b[1:])
    n = len(a) - 1
    parts = [a[0] + _same_len(a[1:], "9" * n)]
    if int(b[0]) - int(a[0]) > 1:
        parts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}][0-9]{{{n}}}")
    parts.append(b[0] + _same_len("0" * n, b[1:]))
    return "(" + "|".join(parts) + ")"


def nonneg_int(a: int, b: Optional[int]) -> str:
    """Canonical decimal integers in [a, b] (b None: unbounded), 0 <= a."""
    parts = []
    top = len(str(a)) if b is None else len(str(b))
    for n in range(len(str(a)), top + 1):
        lo = max(a, 10 ** (n - 1) if n > 1 else 0)
        hi = 10 ** n - 1 if b is None else min(b, 10 ** n - 1)
        if lo <= hi:
            parts.append(_same_len(str(lo).zfill(n), str(hi)))
    if b is None:
        parts.append(f"[1-9][0-9]{{{top},}}")
    return "(" + "|".join(parts) + ")"


def int_regex(lo: Optional[int], hi: Optional[int]) -> str:
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"the integer range [{lo}, {hi}] is empty")
    if lo is not None and lo >= 0:
        return nonneg_int(lo, hi)
    if hi is not None and hi < 0:
        return "-" + nonneg_int(-hi, None if lo is None else -lo)
    neg = "-" + nonneg_int(1, None if lo is None else -lo)
    return f"({neg}|{nonneg_int(0, hi)})"


def _nonneg_num(a: int, b: Optional[int], ea: bool, eb: bool) -> list[str]:
    f = FRACTION_DIGITS
    parts, lo_int = [], a
    if ea:
        if b is None or a < b:
            parts.append(f"{a}\\.[0-9]{{0,{f - 1}}}[1-9]")
        lo_int = a + 1
    hi_int = None if b is None else b - 1
    if hi_int is None or lo_int <= hi_int:
        parts.append(f"{nonneg_int(lo_int, hi_int)}(\\.[0-9]{{1,{f}}})?")
    if b is not None and not eb and not (ea and a == b):
        parts.append(f"{b}(\\.0{{1,{f}}})?")
    return parts


def number_regex(lo: Optional[float], hi: Optional[float], elo: bool, ehi: bool) -> str:
    if lo is not None and lo != math.ceil(lo):
        lo, elo = math.ceil(lo), False
    if hi is not None and hi != math.floor(hi):
        hi, ehi = math.floor(hi), False
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (elo or ehi))):
        raise ValueError("the number range is empty (non-integer bounds are tightened to integers)")
    if lo is not None and lo >= 0:
        parts = _nonneg_num(lo, hi, elo, ehi)
    elif hi is not None and hi <= 0:
        parts = ["-(" + p + ")" for p in _nonneg_num(-hi, None if lo is None else -lo, ehi, elo)]
    else:
        parts = ["-(" + p + ")" for p in _nonneg_num(0, None if lo is None else -lo, True, elo)]
        parts += _nonneg_num(0, hi, False, ehi)
    return "(" + "|".join(parts) + ")"


class _Rewriter:
    def __init__(self, root: Any = None) -> None:
        self.subs: dict[str, str] = {}
        self.root = root

    def bad(self, path: str, what: str) -> None:
        raise ValueError(f"{what} (at {path or '#'}) cannot be enforced by constrained generation")

    def walk(self, node: Any, path: str) -> Any:
        if not isinstance(node, dict):
            return node
        if path and not set(node) - _ANNOTATIONS:  # "any value": outlines-core's regex for {} is ungrouped
            self.bad(path, "an empty subschema (any JSON value; use --grammar-backend llguidance)")
        one = node.get("oneOf")
        if isinstance(one, list) and len(one) > 1:
            pair = one_of.first_overlap(one, one, self.root)
            if pair is not None or "anyOf" in node:
                self.bad(path, f"'oneOf' whose branches {pair or ''} may overlap (outlines-core compiles it as anyOf)")
        for k in _REJECT & node.keys():
            self.bad(path, f"'{k}'")
        if node.get("uniqueItems") is True:
            self.bad(path, "'uniqueItems: true'")
        if node.get("minProperties", 0) or "maxProperties" in node:
            self.bad(path, "'minProperties'/'maxProperties'")
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            self.bad(path, "'allOf' with several subschemas")
        if "pattern" in node and ("minLength" in node or "maxLength" in node):
            self.bad(path, "'pattern' together with 'minLength'/'maxLength'")
        out = dict(node)
        for k in ("properties", "$defs", "definitions"):
            if isinstance(node.get(k), dict):
                out[k] = {name: self.walk(v, f"{path}/{k}/{name}") for name, v in node[k].items()}
        for k in ("items", "additionalProperties", "not", "if", "then", "else"):
            if isinstance(node.get(k), dict):
                out[k] = self.walk(node[k], f"{path}/{k}")
        for k in ("anyOf", "oneOf", "allOf", "prefixItems", "items"):
            if isinstance(node.get(k), list):
                out[k] = [self.walk(v, f"{path}/{k}/{i}") for i, v in enumerate(node[k])]
        if any(b in node for b in _BOUNDS) and "enum" not in node and "const" not in node:
            return self.bounded(node, path)
        if isinstance(one, list) and len(one) > 1:  # proven disjoint above: anyOf means the same
            out["anyOf"] = out.pop("oneOf")
        return out

    def bounded(self, node: dict, path: str) -> dict:
        kind = node.get("type")
        if kind not in ("integer", "number"):
            self.bad(path, "numeric bounds on a node whose type is not exactly 'integer' or 'number'")
        lo, hi = node.get("minimum"), node.get("maximum")
        elo = ehi = False
        for key, val in (("exclusiveMinimum", node.get("exclusiveMinimum")), ("exclusiveMaximum", node.get("exclusiveMaximum"))):
            if val is None or val is False:
                continue
            if val is True:  # draft 4: a flag on minimum / maximum
                elo, ehi = (True, ehi) if key == "exclusiveMinimum" else (elo, True)
            elif isinstance(val, (int, float)):
                if key == "exclusiveMinimum" and (lo is None or val >= lo):
                    lo, elo = val, True
                elif key == "exclusiveMaximum" and (hi is None or val <= hi):
                    hi, ehi = val, True
        for v in (lo, hi):
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
                self.bad(path, "a non-numeric bound")
        try:
            if kind == "integer":
                ilo = None if lo is None else (math.floor(lo) + 1 if elo else math.ceil(lo))
                ihi = None if hi is None else (math.ceil(hi) - 1 if ehi else math.floor(hi))
                rx = int_regex(ilo, ihi)
            else:
                rx = number_regex(lo, hi, elo, ehi)
        except ValueError as e:
            raise ValueError(f"{e} (at {path or '#'})") from None
        ph = _PH.format(len(self.subs))
        self.subs[ph] = rx
        return {"const": ph}


def schema_to_regex(schema_json: str, whitespace: str) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    root = json.loads(schema_json)
    rw = _Rewriter(root)
    schema = rw.walk(root, "")
    regex = build_regex_from_schema(json.dumps(schema), whitespace)
    for ph, rx in rw.subs.items():
        regex = regex.replace(f'"{ph}"', rx)
    return regex
