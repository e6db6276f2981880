"""Speculative decoding: propose a few tokens per request, verify them in one target step.

Where each part runs:

* **proposal** runs in the scheduler, which has the tokens and the prefix cache:
  ``ngram.NgramIndex`` (prompt lookup over the request's own prompt + output) and the
  cache's continuation of the request's text (``KVManager.continuation``); a
  ``strategy.Speculator`` decides per request whether and what to propose, and
  ``gate.AcceptanceGate`` pauses it while its acceptance rate stays low;
* **verification** runs in the worker, which has the logits: ``verify.py`` holds the
  acceptance rules (greedy prefix match; rejection sampling at temperature > 0, so that
  the emitted tokens are distributed exactly as the target's own samples).

Must not touch: a request's state, its KV slots or the prefix cache -- a proposal reads the
cache only through the ``cached`` callback the scheduler passes to ``Speculator.propose``, and
verdicts are return values the scheduler and the worker apply.  This package sits between
``radixserve.model`` and ``radixserve.worker`` in the layers and imports nothing of radixserve;
the scheduler and the worker import it.  Modules are imported directly; nothing is re-exported here.
"""
