"""JSON Schema 2020-12 string formats that llguidance does not know, as exact-or-narrower patterns.

llguidance enforces ``duration``, ``email``, ``ipv4``, ``ipv6``, ``uri`` and ``uuid`` itself
(and ``date``, ``time``, ``date-time``, ``hostname``, but more widely than the specification: see
``DATE`` below).  For the other formats of the specification a schema's ``format`` is rewritten here (``llg_spec.close_objects``) so that every string the grammar
allows is valid in that format (a narrower language is fine; a wider one never):

* ``idn-email`` / ``idn-hostname`` / ``iri``: the ASCII ``email`` / ``hostname`` / ``uri`` (an
  ASCII address, host name or URI is a valid internationalized one);
* ``uri-reference`` and ``iri-reference``: RFC 3986's URI-reference (``URI_REFERENCE``: an absolute
  URI or a relative reference whose first path segment has no colon), with hosts as reg-names;
* ``json-pointer`` / ``relative-json-pointer``: RFC 6901 and its relative form;
* ``uri-template``: RFC 6570 literals and expressions (``{var}``, ``{+var,x:3}``, ``{/path*}``).

``regex`` has no such pattern (a regex language is not regular) and stays refused.

A name outside the specification (``color``, ``ISO 8601``, ``int64``...) is an annotation: dropped,
as JSON Schema says validators treat it; ``url`` is written as a ``uri``.  ``regex`` stays refused.
A ``format`` beside a ``pattern`` is left alone (two patterns cannot be intersected here): llguidance
then refuses an unknown one, naming it.
"""
from __future__ import annotations

from typing import Optional

ALIASES = {"idn-email": "email", "idn-hostname": "hostname", "iri": "uri", "url": "uri"}
# JSON Schema 2020-12's formats (and OpenAPI's byte, handled by llg_spec); any other name is an
# annotation the specification tells validators to ignore, so it is dropped (exact), except "url",
# written as a URI
STANDARD = frozenset({"date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
                      "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
                      "json-pointer", "relative-json-pointer", "regex", "byte"})

_PCT = "%[0-9A-Fa-f]{2}"
_SUB = "!$&'()*+,;="
_PCHAR_NC = f"(?:[A-Za-z0-9\\-._~{_SUB}@]|{_PCT})"  # a path character other than ':'
_PCHAR = f"(?:[A-Za-z0-9\\-._~{_SUB}@:]|{_PCT})"
_SEG = f"{_PCHAR}*"
_AUTH = (f"(?:(?:[A-Za-z0-9\\-._~{_SUB}:]|{_PCT})*@)?(?:[A-Za-z0-9\\-._~{_SUB}]|{_PCT})*(?::[0-9]*)?")
_QF = f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_ABS_PATH = f"/(?:{_PCHAR}+(?:/{_SEG})*)?"
_HIER = f"(?://{_AUTH}(?:/{_SEG})*|{_ABS_PATH}|{_PCHAR}+(?:/{_SEG})*)?"
_REL = f"(?://{_AUTH}(?:/{_SEG})*|{_ABS_PATH}|{_PCHAR_NC}+(?:/{_SEG})*)?"
URI_REFERENCE = f"^(?:[A-Za-z][A-Za-z0-9+.\\-]*:{_HIER}{_QF}|{_REL}{_QF})$"

_TOKEN = "(?:[^~/]|~[01])*"
JSON_POINTER = f"^(?:/{_TOKEN})*$"
RELATIVE_JSON_POINTER = f"^(?:0|[1-9][0-9]*)(?:#|(?:/{_TOKEN})*)$"

_LITERAL = f"(?:[A-Za-z0-9\\-._~!#$&()*+,/:;=?@\\[\\]]|{_PCT})"
_VARSPEC = "[A-Za-z0-9_]+(?::[1-9][0-9]{0,3}|\\*)?"
URI_TEMPLATE = f"^(?:{_LITERAL}|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*$"

# llguidance's own date, time and hostname are wider than RFC 3339 / 1123 + IDNA (the suite's
# tests: 2021-02-29, a leap second at 22:59:60, "xn--X", a 256-character host name): these are exact
# or narrower (years 1000-9999; no leap second; at most 4 labels of at most 62 characters, none with
# "--" in its 3rd and 4th place, so no A-label).
_Y = "[1-9][0-9]{3}"
_LEAP = "(?:[1-9][0-9](?:0[48]|[2468][048]|[13579][26])|(?:1[26]|[2468][048]|[3579][26])00)"
_MD = "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
_DATE = f"(?:{_Y}-{_MD}|{_LEAP}-02-29)"
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_AN = "[A-Za-z0-9]"
_LABEL = (f"(?:{_AN}|{_AN}{_AN}|{_AN}[A-Za-z0-9-]{_AN}|{_AN}[A-Za-z0-9-](?:{_AN}{_AN}|-{_AN})"
          f"(?:[A-Za-z0-9-]{{0,57}}{_AN})?|{_AN}[A-Za-z0-9-]{_AN}-[A-Za-z0-9-]{{0,57}}{_AN})")
DATE, TIME, DATE_TIME = f"^{_DATE}$", f"^{_TIME}$", f"^{_DATE}T{_TIME}$"
HOSTNAME = f"^{_LABEL}(?:\\.{_LABEL}){{0,3}}$"

PATTERNS = {"date": DATE, "time": TIME, "date-time": DATE_TIME, "hostname": HOSTNAME,
            "uri-reference": URI_REFERENCE, "iri-reference": URI_REFERENCE, "json-pointer": JSON_POINTER,
            "relative-json-pointer": RELATIVE_JSON_POINTER, "uri-template": URI_TEMPLATE}


def rewrite(node: dict, out: dict) -> None:
    """Rewrite ``out``'s ``format`` (a copy of ``node``) as this module says, in place."""
    fmt = node.get("format")
    if not isinstance(fmt, str):
        return
    if fmt not in STANDARD and fmt not in ALIASES:
        del out["format"]
        return
    fmt = ALIASES.get(fmt, fmt)
    if fmt in PATTERNS and "pattern" not in node:
        del out["format"]
        out["pattern"] = PATTERNS[fmt]
    elif fmt != node["format"]:
        out["format"] = fmt


def pattern_for(fmt: str) -> Optional[str]:
    """The pattern that stands for ``fmt`` (None: llguidance's own, or none)."""
    return PATTERNS.get(fmt)
