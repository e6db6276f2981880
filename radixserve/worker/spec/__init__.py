"""Speculative decoding's worker side (the algorithms live in ``radixserve.speculative``).

Owns: ``draft_runner`` (``DraftRunner``: the draft model of ``--speculative-algorithm draft``,
with its own KV pool read through the target's request->token table, mirroring every target
forward; ``NoDraft``) and ``verify.verify_drafts`` (the target's logits at each proposed position
-> accepted tokens, by ``speculative.verify``'s rules).
Must not touch: the scheduler's requests or slots -- it returns what was accepted; the scheduler
folds it in (``scheduler/spec_steps.py``) and frees rejected slots through ``KVManager``.
Modules are imported directly; nothing is re-exported here.
"""
