"""Constraints -> grammar sources, checked synchronously (no tokenizer, no compiled grammar).

- ``spec``: sampling parameters -> a ``Constraint`` whose ``source`` a backend compiles
  (ValueError naming the field on error)
- ``json_schema``: schema -> regex for outlines-core, enforcing what it would silently ignore
- ``llg_spec``: constraints -> llguidance grammars (lenient mode off), validated
- ``rewrites``: exact rewrites of keywords llguidance lacks (``not``, ``if``/``then``/``else``,
  ``propertyNames``, ``uniqueItems``, dependencies), or a refusal naming the keyword and path
- ``formats``: JSON Schema string formats as exact-or-narrower patterns
- ``one_of``: ``oneOf`` decided per schema (proven-disjoint branches compile as ``anyOf``)
- ``shared_leaves``: repeated format leaves compiled once, as ``$defs`` entries
- ``budget``: ``constraint_budget: "close"``: the shortest completions the mask steers to near
  the end of ``max_new_tokens``
"""
