"""Exact rewrites of keywords llguidance does not implement (``not``, ``if``/``then``/``else``,
``propertyNames``, ``uniqueItems``), or a refusal naming the keyword and its path.

Each rewrite keeps the schema's meaning for what the grammar generates (``llg_spec.close_objects``
applies them to the tightened copy):

* ``not`` of a ``type``: the node's types minus those (``not: {type: integer}`` under ``number``
  cannot be said and is refused); ``not`` of a ``const``/``enum`` beside the node's own finite
  ``enum``/``const``/``boolean``: those values removed; ``not: {required: [p]}``: an object
  without ``p``.
* ``if``/``then``/``else`` on a discriminator: ``if`` is ``{properties: {k: {const: v}}}`` (with or
  without ``required: [k]``), ``k`` is required by the node and its values a finite ``enum``;
  then the node is ``anyOf: [k == v and then, k in the other values and else]``.
* ``propertyNames`` on a closed object (no ``patternProperties``, extra properties banned): each
  listed property whose name the schema rejects becomes ``false`` (refused if required), and the
  keyword is dropped; on an open one it is refused.
* ``uniqueItems`` vacuous (``maxItems`` <= 1) is dropped; over a ``const`` item it becomes
  ``maxItems: 1``; over an ``enum`` item (or ``boolean``) with at most ``UNIQUE_LIMIT``
  distinct-value sequences, the array is the ``anyOf`` of those sequences (``prefixItems`` of
  ``const``s); otherwise refused.
"""
from __future__ import annotations

import itertools
import json
import math
from typing import Any

from radixserve.constrained.schema.one_of import types

UNIQUE_LIMIT = 64
_ALL = ("null", "boolean", "object", "array", "number", "string")
ANNOTATIONS = _ANNOTATIONS = {"title", "description", "$comment", "examples", "default"}


def refuse(keyword: str, path: str, why: str) -> None:
    raise ValueError(f"'{keyword}' at {path}: {why}; it cannot be enforced by constrained generation")


def _only(node: Any, *keys: str) -> bool:
    return isinstance(node, dict) and set(node) - _ANNOTATIONS <= set(keys)


def _finite(node: dict) -> Any:
    """The node's own finite value list (enum, const, boolean), or None."""
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    if node.get("type") == "boolean":
        return [False, True]
    return None


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and type(a) is type(b)


def not_string(v: str) -> str:
    """A pattern matching every string except ``v`` (the complement of one word is regular)."""
    def lit(c: str) -> str:
        return "\\" + c if c in "\\^$.|?*+()[]{}/-" else c

    any_ = "[\\s\\S]"
    parts = [f"{''.join(lit(c) for c in v[:i])}[^{lit(v[i])}]{any_}*" for i in range(len(v))]
    parts += ["".join(lit(c) for c in v[:i]) for i in range(len(v))]  # a proper prefix
    parts.append(f"{''.join(lit(c) for c in v)}{any_}+")
    return "^(?:" + "|".join(parts) + ")$"


def _other_than(value: Any, node: Any) -> Any:
    """A schema for "not ``value``" under a property schema ``node``: its other finite values, or
    any string but ``value``; None when neither applies."""
    values = _finite(node) if isinstance(node, dict) else None
    if values is not None:
        rest = [x for x in values if not _same(x, value)]
        return {"enum": rest} if rest else False
    if isinstance(value, str) and isinstance(node, dict) and node.get("type") == "string" and "pattern" not in node:
        return {**{k: x for k, x in node.items() if k != "not"}, "pattern": not_string(value)}
    return None


def rewrite_not(node: dict, out: dict, path: str, narrow: bool = False) -> None:
    neg = node["not"]
    if neg is False:  # excludes nothing
        out.pop("not")
        return
    if neg is True or neg == {}:
        refuse("not", path, "it allows no value")
    if _only(neg, "type") and "type" in neg:
        drop = {neg["type"]} if isinstance(neg["type"], str) else set(neg["type"])
        have = set(types(node) or _ALL)
        if "number" in drop:
            drop.add("integer")
        if "integer" in drop and "number" not in drop and "number" in have:
            if not narrow:
                refuse("not", path, "a number that is not an integer")
            drop.add("number")  # served: no number at all (narrower)
        left = sorted(have - drop)
        if not left:
            refuse("not", path, "no type is left")
        out.pop("not")
        out["type"] = left if len(left) > 1 else left[0]
        return
    if _only(neg, "const", "enum") and ("const" in neg or "enum" in neg):
        banned = [neg["const"]] if "const" in neg else list(neg.get("enum", []))
        if _finite(node) is not None:
            keep = [v for v in _finite(node) if not any(_same(v, b) for b in banned)]
            if not keep:
                refuse("not", path, "every value is excluded")
            out.pop("not")
            out.pop("const", None)
            out["enum"] = keep
            return
        other = _other_than(banned[0], node) if len(banned) == 1 else None
        if other:
            out.pop("not")
            out.update(other)
            return
    names = neg.get("required") if isinstance(neg, dict) else None
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names) and \
            (_only(neg, "required") or (narrow and _only(neg, "required", "properties", "type"))):
        # not all of them present: one is absent (exact for `required` alone; with other keywords,
        # served only: a narrower meaning, since their violation would also satisfy the `not`)
        if set(names) <= set(node.get("required") or []):
            refuse("not", path, f"{names} are both required and forbidden")
        out.pop("not")
        out["type"] = "object"
        absent = [{"properties": {n: False}} for n in names if n not in (node.get("required") or [])]
        _add_any_of(out, absent)
        return
    refuse("not", path, "only 'not' of a type, of values, of a string constant or of required properties is rewritten")


def _add_any_of(out: dict, branches: list) -> None:
    if len(branches) == 1 and not set(branches[0]) & set(out):
        out.update(branches[0])
    elif "anyOf" in out:
        out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
    else:
        out["anyOf"] = branches


def rewrite_if(node: dict, out: dict, path: str, narrow: bool = False) -> None:
    """(``out``'s ``then``/``else`` are the tightened branches.)  On an object node: ``if`` tests
    one property ``k`` against a constant ``v``: then-branch ``k == v``; else-branches ``k`` absent
    (unless required) and ``k`` anything else (its other finite values, or any other string)."""
    cond = node.get("if")
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    ok = isinstance(cond, dict) and _only(cond, "properties", "required", "type") and \
        isinstance(cond.get("properties"), dict) and len(cond["properties"]) == 1
    other = None
    if ok:
        (key, test), = cond["properties"].items()
        ok = _only(test, "const") and "const" in test and cond.get("required", [key]) == [key] and \
            cond.get("type", "object") == "object"
    if ok:
        # a property the node leaves open: as served, "any other string" stands for "anything else"
        loose = {"type": "string"} if narrow and isinstance(test["const"], str) else {}
        other = _other_than(test["const"], props.get(key, loose))
        ok = other is not None
    if not ok:
        refuse("if", path, "only an 'if' testing one property of an object against a constant is rewritten")
    v, required = test["const"], key in (node.get("required") or [])
    then, else_ = out.get("then", {}), out.get("else", {})
    branches = [{"required": [key], "properties": {key: {"const": v}}, "allOf": [then]}]
    if other is not False:
        branches.append({"required": [key], "properties": {key: other}, "allOf": [else_]})
    if not required:
        # an object without k: the `if` holds when it does not require k, else it fails
        branches.append({"properties": {key: False}, "allOf": [else_ if "required" in cond else then]})
    others = sorted(set(types(node) or _ALL) - {"object"})
    if others:  # a value that is not an object: the `if` holds unless it names a type (then it fails)
        branches.append({"type": others if len(others) > 1 else others[0],
                         "allOf": [else_ if "type" in cond else then]})
        for b in branches[:-1]:
            b["type"] = "object"
    for k in ("if", "then", "else"):
        out.pop(k, None)
    _add_any_of(out, branches)


def rewrite_property_names(node: dict, out: dict, path: str, closed: bool, narrow: bool = False) -> None:
    import jsonschema

    names = node["propertyNames"]
    if not closed and narrow and not node.get("patternProperties"):
        out["additionalProperties"] = False  # served: the listed properties only (narrower)
    elif not closed:
        refuse("propertyNames", path, "on an object that allows properties it does not list")
    check = jsonschema.Draft202012Validator({"allOf": [names]} if isinstance(names, dict) else names)
    props = dict(out.get("properties") or {})
    for name in list(props):
        if not check.is_valid(name):
            if name in (node.get("required") or []):
                refuse("propertyNames", path, f"the required property '{name}' has a name it rejects")
            props[name] = False
    out["properties"] = props
    out.pop("propertyNames")


def rewrite_unique(node: dict, out: dict, path: str, narrow: bool = False) -> None:
    if node.get("uniqueItems") is not True:
        out.pop("uniqueItems", None)
        return
    items = node.get("items", {})
    hi = node.get("maxItems")
    if isinstance(hi, int) and hi <= 1:
        out.pop("uniqueItems")
        return
    values = _finite(items) if isinstance(items, dict) and "prefixItems" not in node else None
    lo = node.get("minItems", 0) if isinstance(node.get("minItems"), int) else 0
    top = 0 if values is None else (len(values) if hi is None else min(hi, len(values)))
    count = sum(math.perm(len(values), n) for n in range(lo, top + 1)) if values is not None else 0
    if (values is None or count > UNIQUE_LIMIT) and narrow and lo <= 1:
        out.pop("uniqueItems")  # served: at most one item, trivially unique (narrower)
        out["maxItems"] = 1
        return
    if values is None:
        refuse("uniqueItems", path, "only arrays of enum/const/boolean items (or of at most one item) are rewritten")
    seqs = [p for n in range(lo, top + 1) for p in itertools.permutations(values, n)] if count <= UNIQUE_LIMIT else []
    if not seqs:
        refuse("uniqueItems", path, f"{count} arrays of distinct items (the rewrite lists at most {UNIQUE_LIMIT})")
    if "anyOf" in node:
        refuse("uniqueItems", path, "beside an 'anyOf'")
    out.pop("uniqueItems")
    out["anyOf"] = [{"prefixItems": [{"const": x} for x in s], "items": False, "minItems": len(s)} for s in seqs]
