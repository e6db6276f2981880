"""Repeated format leaves of a schema compiled once, as one ``$defs`` entry each.

llguidance compiles a ``pattern`` wherever it appears: a schema with twenty ``{"type": "string",
"format": "date-time"}`` properties, which ``formats.py`` writes as its exact (and long) date-time
pattern, parses and compiles that regex twenty times.  A ``$ref`` with nothing but annotations
beside it is compiled once (one nonterminal), whereas a ``$ref`` with other keywords beside it is
inlined.  So ``share`` rewrites every leaf holding one of ``formats.PATTERNS`` and nothing else but
its ``type``, length bounds and annotations, when the same leaf appears at least twice, into a
``$ref`` (annotations kept) to one new ``$defs`` entry at the root holding the leaf's keywords.  The
language is unchanged.  Only those patterns: measured on JSONSchemaBench, sharing a short pattern of
the schema's own, llguidance's own formats or ``tighten``'s number step costs more than it saves.

Nothing is shared when a subschema below the root sets ``$id`` (or a draft-4 string ``id``): a
``#/$defs/...`` reference under it would resolve against its base, not the root.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterator, Optional

from radixserve.constrained.schema import formats
from radixserve.constrained.schema.rewrites import ANNOTATIONS

_MAPS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
# where a subschema is generated as a value (not "not", "propertyNames", "contains"...: a $ref is
# left out of places where it buys nothing)
_ONE = ("items", "additionalProperties", "then", "else", "additionalItems")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_PREFIX = "__rs_leaf"
_FORMAT = re.compile(r'"format"\s*:\s*"([^"]*)"')
_PATTERNS = frozenset(formats.PATTERNS.values())
_LEAF = frozenset(("type", "pattern", "minLength", "maxLength"))
# every keyword of JSON Schema (drafts 4 to 2020-12) that is not an annotation: any other key of a
# leaf is one (OpenAPI's "example", "instanceOf"...), ignored by validators; only ANNOTATIONS stay
# beside the $ref
_KEYWORDS = frozenset((
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties",
    "minProperties", "required", "dependentRequired", "dependencies", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "items", "prefixItems", "additionalItems", "contains", "unevaluatedItems",
    "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "$ref",
    "$dynamicRef", "$recursiveRef", "$defs", "definitions", "$id", "id", "$anchor", "$dynamicAnchor",
    "$recursiveAnchor", "$schema", "$vocabulary", "format", "contentEncoding", "contentMediaType", "contentSchema",
    "x-guidance", "nullable"))


def _leaf_key(node: dict) -> Optional[str]:
    """The canonical text of a string leaf worth sharing (its keywords less annotations), else None."""
    if node.get("pattern") not in _PATTERNS or any(k in _KEYWORDS and k not in _LEAF for k in node):
        return None
    return json.dumps({k: v for k, v in node.items() if k in _LEAF}, sort_keys=True)


def _children(node: dict) -> Iterator[tuple[Any, Any, Any]]:
    """(container, key, subschema) for each subschema directly below ``node``."""
    for k in _MAPS:
        m = node.get(k)
        if isinstance(m, dict):
            for name, v in m.items():
                yield m, name, v
    for k in _ONE:
        if isinstance(node.get(k), dict):
            yield node, k, node[k]
    for k in _LISTS:
        seq = node.get(k)
        if isinstance(seq, list):
            for i, v in enumerate(seq):
                yield seq, i, v


def _leaves(root: dict) -> Optional[dict[str, int]]:
    """How often each shareable leaf appears below the root; None when a subschema
    below the root changes the base URI."""
    counts: dict[str, int] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for _, _, child in _children(node):
            if not isinstance(child, dict):
                continue
            if "$id" in child or isinstance(child.get("id"), str):
                return None
            leaf = _leaf_key(child)
            if leaf is not None:
                counts[leaf] = counts.get(leaf, 0) + 1
            else:
                stack.append(child)
    return counts


def repeats(text: str) -> bool:
    """Whether the schema's JSON text names a format that ``formats.py`` writes as a pattern twice (a
    regular-expression scan, cheaper than walking the tree): without that, ``share`` has nothing to do."""
    values = [f for f in _FORMAT.findall(text) if f in formats.PATTERNS]
    return len(set(values)) < len(values)


def share(schema: Any, text: Optional[str] = None) -> Any:
    """``schema`` with each string leaf that appears at least twice replaced by a ``$ref`` to one
    ``$defs`` entry (module docstring): a new tree where anything changed, ``schema`` itself where
    nothing did.  ``schema`` is never changed.  ``text``: the JSON text of the schema as given (before
    rewrites), to skip the walk when ``repeats`` says no value repeats (a format rewritten into a
    pattern still repeats as a format)."""
    if text is not None and not repeats(text):
        return schema
    if not isinstance(schema, dict) or not isinstance(schema.get("$defs", {}), dict):
        return schema
    counts = _leaves(schema)
    if not counts or max(counts.values()) < 2:
        return schema
    defs = dict(schema.get("$defs", {}))
    names: dict[str, str] = {}
    for leaf, n in counts.items():
        if n >= 2:
            name = f"{_PREFIX}{len(names)}"
            while name in defs:
                name += "_"
            names[leaf] = name

    def rebuild(node: dict) -> dict:
        out = dict(node)
        for k in _MAPS:
            if isinstance(node.get(k), dict):
                out[k] = {name: swap(v) for name, v in node[k].items()}
        for k in _ONE:
            if isinstance(node.get(k), dict):
                out[k] = swap(node[k])
        for k in _LISTS:
            if isinstance(node.get(k), list):
                out[k] = [swap(v) for v in node[k]]
        return out

    def swap(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        leaf = _leaf_key(node)
        if leaf is None:
            return rebuild(node)
        name = names.get(leaf)
        if name is None:
            return node
        return {"$ref": f"#/$defs/{name}", **{k: v for k, v in node.items() if k in ANNOTATIONS}}

    out = rebuild(schema)
    out["$defs"] = {**out.get("$defs", {}), **{name: json.loads(leaf) for leaf, name in names.items()}}
    return out
