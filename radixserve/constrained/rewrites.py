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
from typing import Any

from radixserve.constrained.one_of import types

UNIQUE_LIMIT = 64
_ALL = ("null", "boolean", "object", "array", "number", "string")
_ANNOTATIONS = {"title", "description", "$comment", "examples", "default"}


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


def rewrite_not(node: dict, out: dict, path: str) -> None:
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
        if "integer" in drop and "number" in have:
            refuse("not", path, "a number that is not an integer")
        left = sorted(have - drop)
        if not left:
            refuse("not", path, "no type is left")
        out.pop("not")
        out["type"] = left if len(left) > 1 else left[0]
        return
    if _only(neg, "const", "enum") and ("const" in neg or "enum" in neg) and _finite(node) is not None:
        banned = [neg["const"]] if "const" in neg else list(neg.get("enum", []))
        keep = [v for v in _finite(node) if not any(_same(v, b) for b in banned)]
        if not keep:
            refuse("not", path, "every value is excluded")
        out.pop("not")
        out.pop("const", None)
        out["enum"] = keep
        return
    if _only(neg, "required") and isinstance(neg["required"], list) and len(neg["required"]) == 1:
        name = neg["required"][0]
        if name in (node.get("required") or []):
            refuse("not", path, f"'{name}' is both required and forbidden")
        out.pop("not")
        out["type"] = "object"
        out["properties"] = {**out.get("properties", {}), name: False}
        return
    refuse("not", path, "only 'not' of a type, of values of a finite node, or of one required property is rewritten")


def rewrite_if(node: dict, out: dict, path: str) -> None:
    """(``out``'s ``then``/``else`` are the tightened branches.)"""
    cond = node.get("if")
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    ok = isinstance(cond, dict) and _only(cond, "properties", "required", "type") and \
        isinstance(cond.get("properties"), dict) and len(cond["properties"]) == 1
    if ok:
        (key, test), = cond["properties"].items()
        values = _finite(props.get(key, {})) if isinstance(props.get(key), dict) else None
        ok = (_only(test, "const") and key in (node.get("required") or []) and values is not None
              and cond.get("required", [key]) == [key] and cond.get("type", "object") == "object")
    if not ok:
        refuse("if", path, "only an 'if' on one required property with finite values (a discriminator) is rewritten")
    v = test["const"]
    rest = [x for x in values if not _same(x, v)]
    branches = []
    if any(_same(x, v) for x in values):
        branches.append({"properties": {key: {"const": v}}, "allOf": [out.get("then", {})]})
    if rest:
        branches.append({"properties": {key: {"enum": rest}}, "allOf": [out.get("else", {})]})
    for k in ("if", "then", "else"):
        out.pop(k, None)
    if "anyOf" in out:
        out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
    else:
        out["anyOf"] = branches


def rewrite_property_names(node: dict, out: dict, path: str, closed: bool) -> None:
    import jsonschema

    names = node["propertyNames"]
    if not closed:
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


def rewrite_unique(node: dict, out: dict, path: str) -> None:
    if node.get("uniqueItems") is not True:
        out.pop("uniqueItems", None)
        return
    items = node.get("items", {})
    hi = node.get("maxItems")
    if isinstance(hi, int) and hi <= 1:
        out.pop("uniqueItems")
        return
    values = _finite(items) if isinstance(items, dict) and "prefixItems" not in node else None
    if values is None:
        refuse("uniqueItems", path, "only arrays of enum/const/boolean items (or of at most one item) are rewritten")
    lo = node.get("minItems", 0) if isinstance(node.get("minItems"), int) else 0
    top = len(values) if hi is None else min(hi, len(values))
    seqs = [p for n in range(lo, top + 1) for p in itertools.permutations(values, n)]
    if not seqs or len(seqs) > UNIQUE_LIMIT:
        refuse("uniqueItems", path, f"{len(seqs)} arrays of distinct items (the rewrite lists at most {UNIQUE_LIMIT})")
    out.pop("uniqueItems")
    out["anyOf"] = [{"prefixItems": [{"const": x} for x in s], "items": False, "minItems": len(s)} for s in seqs]
    if "anyOf" in node:
        refuse("uniqueItems", path, "beside an 'anyOf'")
