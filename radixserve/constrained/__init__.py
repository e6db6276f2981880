"""Structured generation: regex / JSON schema / choices constraints over outlines-core.

- ``spec``: sampling parameters -> one regex (validated synchronously, ValueError on error)
- ``json_schema``: schema -> regex, enforcing what outlines-core would silently ignore
- ``vocab``: the model's vocabulary as exact byte strings
- ``compile_pool`` / ``compile_worker``: index compilation in child processes, with a timeout
- ``backend``: compiled-index cache and per-state masks
- ``fsm_state``: one request's FSM state
- ``jump_forward``: forced text and boundary re-tokenization
- ``manager``: the scheduler's entry points (``Scheduler.grammars``): it returns decisions
  (masks, ``Finish``, ``Jump``, rejected tokens) that the scheduler applies
- ``protocols``: what this package reads from a request (it never imports the scheduler)

Importing this package is cheap; nothing heavy loads until the first constrained request.
"""
