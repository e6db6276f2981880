"""Constraints as llguidance grammars, validated synchronously (no tokenizer needed).

Contract of ``llguidance_source(kind, value, whitespace)`` (``kind``: "regex", "json" (a
canonical schema), "choices" (a JSON list) or "ebnf"): the llguidance grammar string the
backend compiles, or ``ValueError("sampling_params.<field>: ...")`` with llguidance's own
message.  ``LLMatcher.validate_grammar`` runs the JSON-schema compiler and the Lark parser
(well under a millisecond for the project's schemas), so a bad request is a 400 and never an
asynchronous abort.

JSON schema options are passed as ``overrides``, applied after the schema's own
``x-guidance`` block, so a schema cannot switch them: ``lenient`` is off (an unimplemented
keyword is an error naming it, never ignored), ``coerce_one_of`` is off (a ``oneOf`` whose
branches may overlap is refused rather than weakened to ``anyOf``), and whitespace follows
``json_whitespace_pattern``: "" is compact JSON (``,`` and ``:`` with nothing around them),
any other pattern is allowed between JSON tokens, as outlines-core does.

Tightenings make llguidance write what outlines-core writes (every output still
validates against the schema as given; without them a small model tends to invent
properties or pad a string until ``max_new_tokens``).  A ``pattern`` with no anchor at all
is anchored (JSON Schema's patterns are unanchored: ``[0-9]{5}`` accepts any string holding
five digits, and outlines-core anchors them); OpenAPI's ``format: byte`` (which llguidance
does not know) becomes the exact base64 pattern; a ``number`` gets at most 10 decimals and no
exponent (``multipleOf: 1e-10`` in the grammar only, as outlines-core's bounded numbers;
a small model otherwise writes digits until ``max_new_tokens``).  Objects are closed as outlines-core closes them: a node with ``properties`` and no word on
extra properties (no ``additionalProperties``, ``patternProperties``,
``unevaluatedProperties``, no ``allOf``/``anyOf``/``oneOf``/``$ref`` beside them, every
``required`` name listed, not under an ``allOf``) gets ``additionalProperties: false``, so
the model writes the listed properties only (as xgrammar's strict mode does); an
``anyOf``/``oneOf`` branch merges with its node, so it is closed only when it lists every
name the node requires.  Below
``patternProperties`` (a map open by design) none of these three apply.  Repeated string leaves
are compiled once (``shared_leaves.py``).

``ebnf`` takes Lark (llguidance's syntax, a ``start:`` rule) or GBNF (llama.cpp / SGLang's
xgrammar ``root ::= ...``), converted with llguidance's ``gbnf_to_lark``.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Optional

from radixserve.constrained.schema import formats, one_of, rewrites, shared_leaves

FIELD = {"regex": "regex", "json": "json_schema", "choices": "choices", "ebnf": "ebnf"}


def json_options(whitespace: str) -> dict:
    opts: dict = {"lenient": False, "coerce_one_of": False, "item_separator": ",", "key_separator": ":",
                  "whitespace_flexible": False}
    if whitespace:
        opts["whitespace_pattern"] = whitespace
    return opts


FRACTION_STEP = 1e-10
MAX_DEPENDENCIES = 16
BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_OPEN = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "$ref", "if")
_SUB_DICTS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
_SUB_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
            "unevaluatedItems", "unevaluatedProperties", "additionalItems")


def _refs(node: Any, out: set) -> set:
    """Every ``$ref`` string anywhere under ``node``."""
    if isinstance(node, list):
        for x in node:
            _refs(x, out)
    elif isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            out.add(node["$ref"])
        for v in node.values():
            if isinstance(v, (dict, list)):
                _refs(v, out)
    return out


def _all_of_refs(schema: Any) -> set:
    """Local ``$ref`` targets reachable from an ``allOf`` branch (directly or through other refs)."""
    found: set = set()
    stack = [schema]
    while stack:
        n = stack.pop()
        if isinstance(n, list):
            stack.extend(n)
        elif isinstance(n, dict):
            if isinstance(n.get("allOf"), list):
                found |= _refs(n["allOf"], set())
            stack.extend(v for v in n.values() if isinstance(v, (dict, list)))
    todo = list(found)
    while todo:
        parts = todo.pop().split("/")
        if len(parts) != 3 or parts[0] != "#" or not isinstance(schema, dict):
            continue
        target = schema.get(parts[1], {}).get(parts[2]) if isinstance(schema.get(parts[1]), dict) else None
        for r in _refs(target, set()) - found:
            found.add(r)
            todo.append(r)
    return found


def tighten(schema: Any) -> Any:
    """A copy of the schema, tightened as the module docstring says (definitions that an
    ``allOf`` refers to are left open, like ``allOf`` branches), with every ``oneOf`` proven
    disjoint compiled as ``anyOf`` (``one_of.py``; ValueError naming the branches otherwise)."""
    return one_of_pass(schema, close_objects(schema, False, frozenset(_all_of_refs(schema)), "#", schema), True)


def exact(schema: Any) -> Any:
    """The schema with the exact rewrites only (``oneOf``, ``not``, ``if``, ``propertyNames``,
    ``uniqueItems``, formats, dependencies): none of ``tighten``'s narrowings (anchored patterns,
    the decimals cap, closed objects).  What the JSON-Schema-Test-Suite check compiles."""
    return one_of_pass(schema, close_objects(schema, False, frozenset(), "#", schema, narrow=False))


_MAPS, _ONES, _OPENING = frozenset(_SUB_DICTS), frozenset(_SUB_ONE), frozenset(_OPEN)
_MERGING = frozenset(("if", "then", "else"))
_DEPENDENCIES = frozenset(("dependencies", "dependentRequired", "dependentSchemas"))


def close_objects(node: Any, in_all_of: bool = False, open_refs: frozenset = frozenset(), path: str = "#",
                  root: Any = None, narrow: bool = True, shape: bool = True) -> Any:
    """``node`` rewritten as the module docstring says.  ``narrow``: the served narrowings of the
    rewrites (else exact ones only); ``shape``: with ``narrow``, also anchor patterns, cap decimals
    and close objects (not below ``patternProperties``, a map open by design, whose values keep
    the form they had before the rewrites existed)."""
    if isinstance(node, list):
        return [close_objects(x, in_all_of, open_refs, path, root, narrow, shape) for x in node]
    if not isinstance(node, dict):
        return node
    if "not" in node and path != "#" and node["not"] in ({}, True) and set(node) - rewrites.ANNOTATIONS == {"not"}:
        return False  # `not: {}` below the root: no value (a property that must not appear)
    out = dict(node)
    merged = None
    for k, v in node.items():  # the subschemas, by the keywords the node has
        if k in _MAPS:
            if isinstance(v, dict):
                deep = shape and k != "patternProperties"
                out[k] = {name: close_objects(x, (p := f"{path}/{k}/{name}") in open_refs, open_refs, p, root, narrow,
                                              deep) for name, x in v.items()}
        elif k in _ONES:
            if isinstance(v, (dict, list)):  # if/then/else merge with the node, as allOf members do
                out[k] = close_objects(v, k in _MERGING, open_refs, f"{path}/{k}", root, narrow, shape)
        elif k == "anyOf" or k == "oneOf" or k == "prefixItems":
            if isinstance(v, list):
                # an anyOf/oneOf branch merges with its node's other keywords (an allOf's siblings
                # too): it is closed only if that bans none of the names the node requires
                if merged is None:
                    merged = in_all_of or "allOf" in node
                    need = node.get("required") if isinstance(node.get("required"), list) else ()
                out[k] = [close_objects(x, k != "prefixItems" and (merged or not _lists(x, need)), open_refs,
                                        f"{path}/{k}/{i}", root, narrow, shape) for i, x in enumerate(v)]
        elif k == "allOf":
            if isinstance(v, list):
                out[k] = [close_objects(x, True, open_refs, f"{path}/allOf/{i}", root, narrow, shape)
                          for i, x in enumerate(v)]
    pat = node.get("pattern")
    if narrow and shape and isinstance(pat, str) and "^" not in pat and "$" not in pat:
        out["pattern"] = f"^(?:{pat})$"
    if narrow and shape and node.get("type") == "number" and not any(k in node for k in ("multipleOf", "enum", "const")):
        out["multipleOf"] = FRACTION_STEP  # at most 10 decimals, no exponent (outlines-core's cap)
    if "format" in node:
        if node["format"] == "byte" and "pattern" not in node:  # OpenAPI's base64 strings, enforced exactly
            del out["format"]
            out["pattern"] = BASE64
        formats.rewrite(node, out)  # the 2020-12 formats llguidance lacks (formats.py)
    if "not" in node:
        rewrites.rewrite_not(node, out, path, narrow)
    if "if" in node:
        rewrites.rewrite_if(node, out, path, narrow)
    if "uniqueItems" in node:
        rewrites.rewrite_unique(node, out, path, narrow)
    if not _DEPENDENCIES.isdisjoint(node):
        _property_dependencies(out)
    props = node.get("properties")
    if narrow and shape and isinstance(props, dict) and not in_all_of and _OPENING.isdisjoint(node):
        required = node.get("required", [])
        if isinstance(required, list) and all(r in props for r in required):
            out["additionalProperties"] = False
    if "propertyNames" in node:
        rewrites.rewrite_property_names(node, out, path, out.get("additionalProperties") is False
                                        and not node.get("patternProperties"), narrow)
    return out


def _lists(branch: Any, names: Any) -> bool:
    """Whether ``branch``'s own ``properties`` name every one of ``names``."""
    props = branch.get("properties") if isinstance(branch, dict) else None
    return not names or (isinstance(props, dict) and all(n in props for n in names))


def one_of_pass(given: Any, tight: Any, narrow: bool = False, report: Optional[list] = None) -> Any:
    """``tight`` (``close_objects``' copy of ``given``) with each ``oneOf`` of more than one branch
    turned into an ``anyOf`` (in place), after the whole tree is tightened so that a branch's
    ``$ref`` is followed into the tightened definitions.  ``narrow`` (served): a branch that is a
    closed object of one optional property gets it required (``{"ps": ...}`` or ``{"sh": ...}``, not
    an empty object that both would accept)."""
    def walk(g: Any, t: Any, path: str) -> None:
        if isinstance(g, list) and isinstance(t, list):
            for i, (x, y) in enumerate(zip(g, t)):
                walk(x, y, f"{path}/{i}")
        if not isinstance(g, dict) or not isinstance(t, dict):
            return
        for k, v in g.items():
            if k in t and isinstance(v, (dict, list)):
                walk(v, t[k], f"{path}/{k}")
        if isinstance(g.get("oneOf"), list) and len(g["oneOf"]) > 1 and isinstance(t.get("oneOf"), list):
            if narrow:
                t["oneOf"] = [_keyed(b) for b in t["oneOf"]]
            why = _one_of_as_any_of(g, t, path, given, tight)
            if why and report is not None:
                report.append(why)

    walk(given, tight, "#")
    return tight


def overlap_report(schema: Any, narrow: bool = True) -> Optional[str]:
    """Why the first ``oneOf`` not proven disjoint stays a ``oneOf`` (None: every one was proven)."""
    found: list = []
    open_refs = frozenset(_all_of_refs(schema)) if narrow else frozenset()
    one_of_pass(schema, close_objects(schema, False, open_refs, "#", schema, narrow), narrow, found)
    return found[0] if found else None


def _keyed(branch: Any) -> Any:
    if (isinstance(branch, dict) and branch.get("additionalProperties") is False and not branch.get("required")
            and isinstance(branch.get("properties"), dict) and len(branch["properties"]) == 1
            and not branch.get("patternProperties")):
        return {**branch, "required": list(branch["properties"])}
    return branch


def _one_of_as_any_of(node: dict, out: dict, path: str, root: Any, tight_root: Any) -> Optional[str]:
    """``out``'s oneOf becomes an anyOf when each branch, as generated, is proven disjoint from
    every other branch as written.  Otherwise it stays a oneOf, for llguidance's own proof (it
    refuses what it cannot prove, ``coerce_one_of`` being off), and the message naming the first
    pair that may overlap is returned for that refusal."""
    context = {k: v for k, v in node.items() if k != "oneOf"}
    pair = one_of.first_overlap(out["oneOf"], node["oneOf"], tight_root, root, context)
    if pair is not None:
        i, j = pair
        return (f"'oneOf' at {path}: branches {i} and {j} may overlap ({one_of.describe(node['oneOf'][i])} and "
                f"{one_of.describe(node['oneOf'][j])}), and a value matching both would not validate; a oneOf is "
                "compiled only when its branches are proven disjoint (different types, distinct const/enum values "
                "of a required property, a required property the other branch's closed object lacks, ranges "
                "that cannot meet); use anyOf if matching several branches is fine")
    branches = out.pop("oneOf")
    if "anyOf" in out:
        out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
    else:
        out["anyOf"] = branches
    return None


def _property_dependencies(node: dict) -> None:
    """Rewrite dependencies (draft-4 ``dependencies``, ``dependentRequired``, ``dependentSchemas``)
    exactly, which llguidance lacks: ``{a: [b]}`` becomes ``anyOf: [{properties: {a: false}},
    {required: [a, b]}]`` (a absent, or a and b present), ``{a: S}`` becomes ``anyOf:
    [{properties: {a: false}}, {required: [a], allOf: [S]}]``; several are joined by ``allOf``.
    At most ``MAX_DEPENDENCIES``; more are left for llguidance to refuse, naming the keyword."""
    keys = [k for k in ("dependencies", "dependentRequired", "dependentSchemas") if k in node]
    if not keys:
        return
    deps: dict = {}
    for key in keys:
        d = node[key]
        if not isinstance(d, dict):
            return
        for a, v in d.items():
            if isinstance(v, list) and all(isinstance(x, str) for x in v):
                if v:
                    deps.setdefault(a, []).append({"required": [a, *v]})
            elif isinstance(v, (dict, bool)) and key != "dependentRequired":
                deps.setdefault(a, []).append({"required": [a], "allOf": [v]})
            else:
                return
    if len(deps) > MAX_DEPENDENCIES:
        return
    for key in keys:
        del node[key]
    branches = [{"anyOf": [{"properties": {a: False}}, cond[0] if len(cond) == 1 else {"allOf": cond}]}
                for a, cond in deps.items()]
    if len(branches) == 1 and not any(k in node for k in ("anyOf", "allOf")):
        node["anyOf"] = branches[0]["anyOf"]
    elif branches:
        node["allOf"] = [*node.get("allOf", []), *branches]


def to_lark(text: str) -> str:
    """A Lark grammar as given, or a GBNF grammar converted to Lark."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(text)
    except Exception as e:  # noqa: BLE001 - the converter raises plain Exception on a missing rule
        raise ValueError(f"sampling_params.ebnf: not a valid Lark or GBNF grammar: {e}") from None


def choices_lark(choices: list[str]) -> str:
    return "start: " + " | ".join(json.dumps(c) for c in choices)


@lru_cache(maxsize=1024)
def llguidance_source(kind: str, value: str, whitespace: str, validate: bool = True) -> str:
    """The grammar (module docstring).  ``validate=False`` is for the scheduler, whose requests
    passed the front door's check of the same grammar: llguidance's check is skipped (the
    compile repeats it and reports anything it finds)."""
    from llguidance import LLMatcher

    field = FIELD[kind]
    lark = to_lark(value) if kind == "ebnf" else ""
    overlap: list = []
    try:
        if kind == "regex":
            grammar = LLMatcher.grammar_from_regex(value)
        elif kind == "json":
            given = json.loads(value)
            open_refs = frozenset(_all_of_refs(given)) if '"allOf"' in value else frozenset()
            schema = close_objects(given, False, open_refs, "#", given)
            if '"oneOf"' in value:  # what one_of.py proves becomes an anyOf; llguidance must prove the rest
                schema = one_of_pass(given, schema, True, overlap)
            grammar = LLMatcher.grammar_from_json_schema(json.dumps(shared_leaves.share(schema, value)),
                                                         overrides=json_options(whitespace))
        elif kind == "choices":
            grammar = LLMatcher.grammar_from_lark(choices_lark(json.loads(value)))
        else:
            grammar = LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError) as e:
        raise ValueError(f"sampling_params.{field}: {e}") from None
    if not validate:
        return grammar
    err = LLMatcher.validate_grammar(grammar)
    if err and overlap and "coerce_one_of" in err:  # a oneOf neither proof covers: name the pair
        raise ValueError(f"sampling_params.{field}: {overlap[0]}")
    if err:
        what = "unsupported or invalid schema" if kind == "json" else f"invalid {kind}"
        where = locate(json.loads(value), err) if kind == "json" else ""
        raise ValueError(f"sampling_params.{field}: {what}: {err.strip()}{where}")
    return grammar


def locate(schema: Any, err: str) -> str:
    """`` (at #/path)`` of the first place in ``schema`` holding what llguidance's error names (an
    unimplemented keyword, an unknown format), or "" when it names neither."""
    m = re.search(r'Unimplemented keys: \[([^\]]*)\]', err)
    keys = set(json.loads(f"[{m.group(1)}]")) if m else set()
    m = re.search(r"Unknown format: (.+)", err)
    fmt = m.group(1).strip().splitlines()[0] if m else None
    stack = [(schema, "#")]
    while stack:
        node, path = stack.pop(0)
        if isinstance(node, dict):
            if keys & node.keys() or (fmt is not None and node.get("format") == fmt):
                return f" (at {path})"
            stack.extend((v, f"{path}/{k}") for k, v in node.items() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, f"{path}/{i}") for i, v in enumerate(node))
    return ""
