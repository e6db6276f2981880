"""Structured generation: regex / JSON schema / choices / ebnf constraints, over one of two
grammar libraries chosen at startup (``SchedulerConfig.grammar_backend``).

- ``spec``: sampling parameters -> a ``Constraint`` whose ``source`` the backend compiles
  (validated synchronously, ValueError naming the field on error)
- ``json_schema``: schema -> regex for outlines-core, enforcing what it would silently ignore
- ``llg_spec``: constraints -> llguidance grammars (lenient mode off), validated
- ``vocab``: the model's vocabulary as exact byte strings
- ``backend``: the backend contract and its compiled-grammar cache; ``registry``: ``make_backend``
- ``outlines_backend`` (+ ``compile_pool`` / ``compile_worker``: index compilation in child
  processes, with a timeout) and ``outlines_state``: outlines-core, per-state mask cache
- ``llg_backend`` and ``llg_state``: llguidance (``LLMatcher``, compiled in threads)
- ``fsm_state``: the per-request ``GrammarState`` contract both backends implement
- ``jump_forward``: forced text and boundary re-tokenization (backend-independent)
- ``manager``: the scheduler's entry points (``Scheduler.grammars``): it returns decisions
  (masks, ``Finish``, ``Jump``, rejected tokens) that the scheduler applies
- ``protocols``: what this package reads from a request (it never imports the scheduler)

Must not touch: the scheduler's requests, slots or outputs -- the manager returns decisions and
the scheduler applies them (``scheduler/grammar_steps.py``); it imports only ``config`` and
``request`` (never the scheduler, the worker or torch; masks are numpy).  Modules are imported
directly; nothing is re-exported here.  Importing this package is cheap; nothing heavy loads
until the first constrained request.
"""
