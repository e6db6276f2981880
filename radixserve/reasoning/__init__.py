"""Reasoning models: the thinking block of a model's output, apart from its answer.

- ``formats``: the ``--reasoning-parser`` names (SGLang's: ``qwen3``, ``qwen3-thinking``,
  ``deepseek-r1``, ``deepseek-v3``) as ``ReasoningFormat`` (the tags, whether the output always
  starts thinking, the chat-template switch that turns thinking on or off), the start-time check
  that the tokenizer has the tags as single tokens (``think_token_ids``)
- ``split``: the text split into reasoning and answer (``split_reasoning``), whole or as stream
  deltas (``ReasoningStream``) that never emit a tag split across deltas

Shared by the server (``reasoning_content`` on /v1/chat/completions, ``/separate_reasoning``), the
scheduler (the think-end token that opens a deferred grammar, ``constrained/runtime/reasoner_state``)
and ``frontend_lang`` (``separate_reasoning``).  Must not touch anything above ``config``: it reads
text and a tokenizer's ``encode``/``decode`` only.  Modules are imported directly; nothing is
re-exported here.
"""
