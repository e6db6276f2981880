"""``oneOf`` decided per schema: proven-disjoint branches compile as ``anyOf``, exactly.

``oneOf`` asks for exactly one matching branch.  A grammar can only say "at least one" (``anyOf``),
so the two agree exactly when no value can match two branches.  ``disjoint(a, b)`` proves that
for a pair of subschemas where it can (it is sound, not complete: False means "not proven"):

* their JSON types cannot meet (``integer`` is a ``number``), from ``type``, ``const`` or ``enum``;
* one is a finite set of values (``const``/``enum``) none of which the other accepts (checked
  with ``jsonschema`` against the other, ``$ref`` resolved in the root document);
* both are objects and a property one requires is either banned by the other (a closed object
  that does not list it, or ``properties: {p: false}``) or constrained by both to disjoint
  subschemas (recursively: the discriminator of a tagged union);
* their numeric ranges, string lengths or array lengths cannot meet;
* one is an ``allOf`` with a member disjoint from the other, or an ``anyOf``/``oneOf`` all of
  whose members are.

The caller (``llg_spec.close_objects``) compares each branch as it will be generated (tightened:
objects closed) against every other branch as written, so an output of one branch never matches
another as the schema means it.  ``$ref`` is followed within the document (``#/...``), to a depth
of 8.
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
_DEPTH = 8


def _resolve(node: Any, root: Any, depth: int = 0) -> Any:
    """``node`` with a local ``$ref`` (alone or with annotations) followed; unresolvable: None."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and depth < _DEPTH:
        ref = node["$ref"]
        if not ref.startswith("#"):
            return None
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        others = {k: v for k, v in node.items() if k != "$ref"}
        node = target if not others else {"allOf": [target, others]}
        depth += 1
    return node


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _values(node: dict) -> Optional[list]:
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    return None


def types(node: Any) -> Optional[frozenset]:
    """The JSON types ``node`` may accept, or None for any; ``integer`` stands alone only when
    ``number`` is absent."""
    if node is False:
        return frozenset()
    if not isinstance(node, dict):
        return None
    vals = _values(node)
    out: Optional[frozenset] = None
    if vals is not None:
        out = frozenset(_type_of(v) for v in vals)
    t = node.get("type")
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and all(x in _TYPES for x in t):
        declared = frozenset(t)
        out = declared if out is None else frozenset(x for x in out if x in declared or
                                                       (x == "integer" and "number" in declared))
    return out


def _meet(a: frozenset, b: frozenset) -> bool:
    num = {"number", "integer"}
    return bool(a & b) or bool(a & num and "number" in b) or bool(b & num and "number" in a)


_PLAIN = frozenset({"enum", "const", "type", "title", "description", "default", "examples", "$comment",
                    "deprecated", "readOnly", "writeOnly"})
_TYPE_NAMES = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})


def _plain_accepts(schema: dict, value: str) -> Optional[bool]:
    """``schema`` (only type / enum / const and annotations) on a string, as jsonschema decides
    it (a string equals only that string); None when a keyword's value is malformed."""
    t = schema.get("type", "string")
    names = [t] if isinstance(t, str) else t
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPE_NAMES for n in names):
        return None
    if "string" not in names:
        return False
    enum = schema.get("enum")
    if enum is not None:
        if not isinstance(enum, list):
            return None
        if value not in enum:
            return False
    return "const" not in schema or schema["const"] == value


def _accepts_any(schema: Any, values: list, root: Any) -> bool:
    """Whether ``schema`` (a subschema of ``root``) accepts one of ``values``; True when unsure."""
    if isinstance(schema, dict) and _PLAIN.issuperset(schema) and all(isinstance(v, str) for v in values):
        got = [_plain_accepts(schema, v) for v in values]  # a discriminator's strings: no validator needed
        if None not in got:
            return any(got)
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(root if isinstance(root, dict) else {})
        defs = {k: v for k, v in root.items() if k in ("$defs", "definitions")} if isinstance(root, dict) else {}
        check = cls({**defs, "allOf": [schema]})
        return any(check.is_valid(v) for v in values)
    except Exception:  # noqa: BLE001 - an unresolvable or invalid schema: not proven
        return True


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _bounds(node: dict, lo_key: str, hi_key: str, xlo: str, xhi: str) -> tuple[tuple, tuple]:
    """((low, exclusive), (high, exclusive)) of ``node``; draft-4 boolean exclusives included."""
    lo = (node[lo_key], node.get(xlo) is True) if _num(node.get(lo_key)) else (-math.inf, False)
    hi = (node[hi_key], node.get(xhi) is True) if _num(node.get(hi_key)) else (math.inf, False)
    if xlo and _num(node.get(xlo)) and node[xlo] >= lo[0]:
        lo = (node[xlo], True)
    if xhi and _num(node.get(xhi)) and node[xhi] <= hi[0]:
        hi = (node[xhi], True)
    return lo, hi


def _apart(a: dict, b: dict, lo_key: str, hi_key: str, xlo: str = "", xhi: str = "") -> bool:
    """The two ranges cannot meet."""
    (alo, ahi), (blo, bhi) = _bounds(a, lo_key, hi_key, xlo, xhi), _bounds(b, lo_key, hi_key, xlo, xhi)
    for hi, lo in ((ahi, blo), (bhi, alo)):
        if hi[0] < lo[0] or (hi[0] == lo[0] and (hi[1] or lo[1])):
            return True
    return False


def _bans(node: dict, prop: str) -> bool:
    """``node`` (an object schema) rejects any object holding ``prop``."""
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    if prop in props:
        return props[prop] is False
    if node.get("patternProperties"):
        return False
    return node.get("additionalProperties") is False


def _objects_apart(a: dict, b: dict, ra: Any, rb: Any, depth: int) -> bool:
    for x, y, rx, ry in ((a, b, ra, rb), (b, a, rb, ra)):
        required = x.get("required") if isinstance(x.get("required"), list) else []
        xp = x.get("properties") if isinstance(x.get("properties"), dict) else {}
        yp = y.get("properties") if isinstance(y.get("properties"), dict) else {}
        for p in required:
            if not isinstance(p, str):
                continue
            if _bans(y, p):
                return True
            if p in xp and p in yp and disjoint(xp[p], yp[p], rx, ry, depth + 1):
                return True
    return False


def disjoint(a: Any, b: Any, ra: Any, rb: Any = None, depth: int = 0) -> bool:
    """True when no JSON value is accepted by both ``a`` (a subschema of ``ra``) and ``b`` (of
    ``rb``, default ``ra``)."""
    rb = ra if rb is None else rb
    if depth > _DEPTH:
        return False
    a, b = _resolve(a, ra), _resolve(b, rb)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = types(a), types(b)
    if ta is not None and tb is not None and not _meet(ta, tb):
        return True
    for x, y, rx, ry in ((a, b, ra, rb), (b, a, rb, ra)):
        vals = _values(x)
        if vals is not None and len(vals) <= 64 and not _accepts_any(y, vals, ry):
            return True
        if isinstance(x.get("allOf"), list) and any(disjoint(m, y, rx, ry, depth + 1) for m in x["allOf"]):
            return True
        for k in ("anyOf", "oneOf"):
            if isinstance(x.get(k), list) and x[k] and all(disjoint(m, y, rx, ry, depth + 1) for m in x[k]):
                return True
    only = lambda t: (ta is not None and ta <= t) or (tb is not None and tb <= t)  # noqa: E731
    if only({"object"}) and _objects_apart(a, b, ra, rb, depth):
        return True
    if only({"number", "integer"}) and _apart(a, b, "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return True
    if only({"string"}) and _apart(a, b, "minLength", "maxLength"):
        return True
    if only({"array"}) and _apart(a, b, "minItems", "maxItems"):
        return True
    return False


def within(branch: Any, context: dict, root: Any) -> Any:
    """A schema accepting at least what ``allOf: [context, branch]`` accepts (``context``: the
    oneOf's node without it): the branch (a local ``$ref`` followed) with the node's ``type``,
    ``required`` names and the ``properties`` it does not constrain itself, so that a
    discriminator the node requires counts."""
    branch = _resolve(branch, root)
    if not isinstance(branch, dict) or not context:
        return branch
    if "$ref" in branch:
        return {"allOf": [branch, _shallow(context)]}
    out = dict(branch)
    if "type" not in out and "type" in context:
        out["type"] = context["type"]
    req = [r for r in context.get("required", []) if isinstance(r, str)] if isinstance(context.get("required"), list) else []
    if req:
        out["required"] = list(dict.fromkeys([*(out.get("required") or []), *req]))
    props = context.get("properties")
    if isinstance(props, dict):
        mine = out.get("properties") if isinstance(out.get("properties"), dict) else {}
        out["properties"] = {**{k: v for k, v in props.items() if k not in mine}, **mine}
    return out


def _shallow(context: dict) -> dict:
    return {k: context[k] for k in ("type", "required", "properties") if k in context}


def first_overlap(tightened: list, given: list, t_root: Any, g_root: Any = None,
                  context: Optional[dict] = None) -> Optional[tuple[int, int]]:
    """The first pair (i, j), i != j, where branch i as generated (of ``t_root``) may also match
    branch j as given (of ``g_root``), both under the oneOf's node ``context``; None when every
    pair is proven disjoint."""
    g_root = t_root if g_root is None else g_root
    context = context or {}
    for i, t in enumerate(tightened):
        for j, g in enumerate(given):
            if i != j and not disjoint(within(t, context, t_root), within(g, context, g_root), t_root, g_root):
                return i, j
    return None


def describe(node: Any) -> str:
    """A short rendering of a branch for an error message."""
    text = json.dumps(node, separators=(",", ":"))
    return text if len(text) <= 80 else text[:77] + "..."
