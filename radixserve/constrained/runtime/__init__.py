"""Compiled grammars, run per request in the scheduler thread.

- ``backend``: the backend contract and the compiled-grammar cache both libraries share;
  ``registry``: ``make_backend``, the backend the configuration names
- ``llg_backend`` and ``llg_state``: llguidance (``LLMatcher`` templates compiled in threads)
- ``outlines_backend`` and ``outlines_state``: outlines-core, masks cached per state; indexes
  compiled in child processes by ``compile_pool`` (per-job timeout) running ``compile_worker``
- ``fsm_state``: the per-request ``GrammarState`` contract both backends implement
- ``reasoner_state``: ``ReasonerState``, a grammar deferred until its request's thinking ends
  (reasoning models), with the thinking budget's forced think-end token
- ``vocab``: the model's vocabulary as exact byte strings
- ``jump_forward``: forced text and boundary re-tokenization (backend-independent)
"""
