"""Detokenization: token ids in, text deltas out (its own process, or the Engine's stepping thread).

Owns: ``incremental.IncrementalDecoder`` (UTF-8-safe incremental decoding; ``trim_stop``,
``safe_text_len``) and ``process``: ``DetokState`` (one request's text, holding back whatever
could still become a stop string; the Engine uses it too) and ``Detokenizer`` /
``run_detokenizer`` (the process: the scheduler's ``BatchReqOutput`` in, text to the server).
Contract (``process.py``): the concatenated text deltas are always a prefix of the final text.
Must not touch: scheduler or worker state -- it sees only ``ipc.server_link`` messages; it
imports the leaf modules (config, tokenizer, proc, sampling_params) and ``ipc``, never torch.
Modules are imported directly; nothing is re-exported here.
"""
