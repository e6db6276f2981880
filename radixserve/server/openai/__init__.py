"""The OpenAI-compatible routes of the HTTP server.

Owns: ``routes`` (``openai_router``: /v1/models, /v1/completions), ``chat`` (``chat_router``:
/v1/chat/completions with tool calling), ``chat_encoder.ChatEncoder`` (chat templates in the
server process), ``completion_view.CompletionView`` (a completion choice's text and legacy
logprobs), ``reasoning`` (reasoning models on chat: ``chat_template_kwargs``, ``reasoning_content``,
the thinking switch that defers a constraint), ``embeddings`` (``embeddings_router``: /v1/embeddings) and
the Responses API: ``responses`` (``responses_router``: /v1/responses, GET/DELETE /v1/responses/{id}),
``responses_protocol`` (its request body), ``responses_items`` (items <-> chat messages),
``responses_events`` (output items and stream events as the text grows) and ``responses_store``
(stored responses for ``previous_response_id``, SQLite).
Must not touch: the scheduler or the Engine -- every request goes through the
``TokenizerManager`` it is handed.  From ``server`` it imports only the shared plumbing
(``http_utils``, ``protocol``, ``req_state``, ``openapi_doc``, ``lora_routes``' model names and
``tenancy.accounting``'s current key), never ``app``, ``launcher`` or
``tokenizer_manager``; no torch.
Modules are imported directly; nothing is re-exported here.
"""
