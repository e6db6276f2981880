"""Structured generation: regex / JSON schema / choices / ebnf constraints, over one of two
grammar libraries chosen at startup (``SchedulerConfig.grammar_backend``).

- ``schema/``: turning a request's constraint into a grammar: sampling parameters -> a
  ``Constraint`` (``spec``), JSON schema -> regex (outlines-core) or llguidance grammar, the exact
  rewrites, formats, ``oneOf`` proofs, shared leaves and the ``"close"`` budget's steering
- ``runtime/``: running grammars: the backend contract and its two libraries, compile pools,
  per-request ``GrammarState``, the vocabulary as bytes, jump-forward
- ``manager``: the scheduler's entry points (``Scheduler.grammars``): it returns decisions
  (masks, ``Finish``, ``Jump``, rejected tokens) that the scheduler applies
- ``protocols``: what this package reads from a request (it never imports the scheduler)

Must not touch: the scheduler's requests, slots or outputs -- the manager returns decisions and
the scheduler applies them (``scheduler/grammar_steps.py``); it imports only ``config`` and
``request`` (never the scheduler, the worker or torch; masks are numpy).  ``schema/`` never
imports ``runtime/``.  Modules are imported directly; nothing is re-exported here.  Importing
this package is cheap; nothing heavy loads until the first constrained request.
"""
