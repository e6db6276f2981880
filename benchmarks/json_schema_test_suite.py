"""Compliance with the JSON-Schema-Test-Suite (draft 2020-12): for every schema the runtime accepts,
every valid instance must be producible and every invalid one unproducible.

For each keyword file and each of its schemas: compile it as the llguidance backend does, in one of
two modes (``--mode``): ``exact`` (``llg_spec.exact``: the exact rewrites only: ``oneOf``,
``not``, ``if``, ``propertyNames``, ``uniqueItems``, formats, dependencies) or ``served``
(``llg_spec.tighten``: plus the narrowings a request gets: closed objects, anchored patterns, at
most 10 decimals; valid instances outside them are then unproducible by design).  A schema that
does not compile is *refused* (the message must name a keyword).  For an accepted schema each test
instance is written as compact JSON and forced through the grammar token by token (SmolLM2's
tokenizer); *producible* = every token accepted and the matcher accepting at the end, for the
instance as written or as the grammar writes the same value (``canonical``: ``1.0`` as ``1``, object
keys in schema order).  A valid instance must be producible, an invalid one must not.  Formats are
asserted (as the grammar asserts them): the tests of invalid strings that the suite calls valid
because ``format`` is "only an annotation by default" are skipped, and ``optional/format/<name>``
files (``--keywords``) check the assertion.

Data: ``--suite``, a checkout or a bare git mirror of json-schema-org/JSON-Schema-Test-Suite; a
folder of keyword files (``tests/data/json_schema_test_suite``, the subset the test suite carries)
works too.  Without it the script says so and exits 0.

    .venv/bin/python -m benchmarks.json_schema_test_suite [--mode exact] [--keywords oneOf not ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
from typing import Any, Callable, Optional

MIRROR = "/work/.mirror/json-schema-org+JSON-Schema-Test-Suite/repo"
KEYWORDS = ("type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
            "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
            "exclusiveMaximum", "pattern", "anyOf", "oneOf", "allOf", "not", "if-then-else", "propertyNames",
            "uniqueItems", "dependentRequired", "ref", "defs", "boolean_schema", "format",
            *(f"optional/format/{f}" for f in ("date-time", "date", "time", "duration", "email", "idn-email",
                                                "hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri",
                                                "iri-reference", "uri-template", "uuid", "json-pointer",
                                                "relative-json-pointer")))


def read_file(suite: str, keyword: str) -> Optional[list]:
    """The keyword file's groups, from a folder, a checkout or a bare mirror; None if absent."""
    for path in (os.path.join(suite, f"{keyword}.json"), os.path.join(suite, "tests", "draft2020-12", f"{keyword}.json")):
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
    if os.path.exists(os.path.join(suite, "HEAD")):
        out = subprocess.run(["git", "-C", suite, "show", f"HEAD:tests/draft2020-12/{keyword}.json"],
                             capture_output=True, text=True)
        return json.loads(out.stdout) if out.returncode == 0 else None
    return None


def make_checker(mode: str) -> Callable[[Any], tuple[Optional[Callable[[str], bool]], str]]:
    """``compile(schema) -> (producible(doc) or None when refused, refusal message)``."""
    from llguidance import LLMatcher, LLTokenizer

    from radixserve.constrained.schema.llg_spec import exact, json_options, overlap_report, tighten
    from radixserve.constrained.runtime.vocab import find_backend
    from radixserve.model.loader import resolve_hf_dir
    from radixserve.tokenizer import load_light_tokenizer

    tok = load_light_tokenizer(resolve_hf_dir(None))
    llt = LLTokenizer(find_backend(tok).to_str(), eos_token=[tok.eos_token_id])
    rewrite = exact if mode == "exact" else tighten

    def compile_schema(schema: Any):
        try:
            grammar = LLMatcher.grammar_from_json_schema(json.dumps(rewrite(schema)), overrides=json_options(""))
            err = LLMatcher.validate_grammar(grammar)
        except (ValueError, TypeError) as e:
            return None, str(e)
        if err:  # (an unproven oneOf: the pair that may overlap)
            return None, (overlap_report(schema, mode != "exact") if "coerce_one_of" in err else None) or err.strip()

        def producible(doc: str) -> bool:
            m = LLMatcher(llt, grammar, log_level=0)
            ids = tok.encode(doc)
            return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

        return producible, ""

    return compile_schema


def canonical(value: Any, schema_text: str) -> Any:
    """The same JSON value as the grammar writes it: integral floats as integers, and object keys
    in the order the schema names them (llguidance writes listed properties in schema order)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2 ** 53:
        return int(value)
    if isinstance(value, list):
        return [canonical(v, schema_text) for v in value]
    if isinstance(value, dict):
        at = {k: schema_text.find(json.dumps(k)) for k in value}
        keys = sorted(value, key=lambda k: (at[k] < 0, at[k]))
        return {k: canonical(value[k], schema_text) for k in keys}
    return value


ANNOTATION = "only an annotation by default"  # format asserted here, as the grammar asserts it


def run(suite: str, keywords: list[str], mode: str) -> dict[str, dict]:
    compile_schema = make_checker(mode)
    rows: dict[str, dict] = {}
    for kw in keywords:
        groups = read_file(suite, kw)
        if groups is None:
            continue
        r = rows[kw] = {"schemas": 0, "accepted": 0, "valid": 0, "producible": 0, "invalid": 0, "rejected": 0,
                        "skipped": 0, "failures": [], "refusals": []}
        for g in groups:
            r["schemas"] += 1
            producible, why = compile_schema(g["schema"])
            if producible is None:
                r["refusals"].append(f"{g['description']}: {why[:160]}")
                continue
            r["accepted"] += 1
            text = json.dumps(g["schema"])
            for t in g["tests"]:
                if ANNOTATION in t["description"]:
                    r["skipped"] += 1
                    continue
                doc = json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False)
                ok = producible(doc) or producible(json.dumps(canonical(t["data"], text), separators=(",", ":"),
                                                              ensure_ascii=False))
                if t["valid"]:
                    r["valid"] += 1
                    r["producible"] += ok
                else:
                    r["invalid"] += 1
                    r["rejected"] += not ok
                if ok != t["valid"]:
                    r["failures"].append(f"{g['description']} / {t['description']}: {doc[:80]} "
                                         f"({'valid, not producible' if t['valid'] else 'invalid, producible'})")
    return rows


def table(rows: dict[str, dict]) -> str:
    out = ["| keyword | schemas | accepted | valid producible | invalid rejected |", "|---|---:|---:|---:|---:|"]
    tot = dict.fromkeys(("schemas", "accepted", "valid", "producible", "invalid", "rejected"), 0)
    for kw, r in rows.items():
        out.append(f"| {kw} | {r['schemas']} | {r['accepted']} | {r['producible']}/{r['valid']} | "
                   f"{r['rejected']}/{r['invalid']} |")
        for k in tot:
            tot[k] += r[k]
    out.append(f"| **all** | {tot['schemas']} | {tot['accepted']} | {tot['producible']}/{tot['valid']} | "
               f"{tot['rejected']}/{tot['invalid']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=MIRROR)
    ap.add_argument("--mode", default="exact", choices=["exact", "served"])
    ap.add_argument("--keywords", nargs="+", default=list(KEYWORDS))
    ap.add_argument("--show", action="store_true", help="list every failure and refusal")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    if not os.path.exists(a.suite):
        print(f"no JSON-Schema-Test-Suite at {a.suite} (--suite): nothing to check")
        return 0
    rows = run(a.suite, a.keywords, a.mode)
    print(f"mode: {a.mode}\n" + table(rows))
    for kw, r in rows.items():
        for f in r["failures"] + (r["refusals"] if a.show else []):
            print(f"  {kw}: {f}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(r["failures"] for r in rows.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
