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

This package sits between ``radixserve.model`` and ``radixserve.worker`` in the layers: it
imports neither the scheduler nor the worker; both import it.
"""
