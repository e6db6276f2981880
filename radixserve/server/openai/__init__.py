"""The OpenAI-compatible routes of the HTTP server.

Owns: ``routes`` (``openai_router``: /v1/models, /v1/completions), ``chat`` (``chat_router``:
/v1/chat/completions with tool calling), ``chat_encoder.ChatEncoder`` (chat templates in the
server process), ``completion_view.CompletionView`` (a completion choice's text and legacy
logprobs) and ``embeddings`` (``embeddings_router``: /v1/embeddings).
Must not touch: the scheduler or the Engine -- every request goes through the
``TokenizerManager`` it is handed.  From ``server`` it imports only the shared plumbing
(``http_utils``, ``protocol``, ``req_state``, ``openapi_doc``), never ``app``, ``launcher`` or
``tokenizer_manager``; no torch.
Modules are imported directly; nothing is re-exported here.
"""
