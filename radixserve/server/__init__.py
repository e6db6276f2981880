"""The HTTP serving runtime (``radixserve serve``): FastAPI app, TokenizerManager and the launcher.

Owns: ``app`` (``create_app``: the native SGLang-compatible routes), ``protocol`` (the pydantic
request bodies), ``openai_fields`` (the fields each OpenAI route takes, in one place), ``tokenizer_manager.TokenizerManager`` (the asyncio side: tokenize, submit,
collect ``ReqOutput``s), ``req_state`` (one in-flight sequence's ``OutputState``),
``http_utils`` (errors, SSE, API key), ``openapi_doc``, ``reasoning_routes`` (SGLang's
``/separate_reasoning``), ``lora_routes`` (``/load_lora_adapter``
and ``/unload_lora_adapter``, the adapter an OpenAI ``model`` names, the adapters' model cards)
and ``launcher`` (``serve``: the worker, scheduler and detokenizer processes and this node's
other tensor- or pipeline-parallel ranks, watched; ``follower_node`` on nodes other than 0).  Subpackages: ``openai`` (/v1 routes), ``tenancy``
(API keys, budgets, usage) and ``inspector`` (/cache routes, dashboard).
Must not touch: scheduler, worker or KV state except through ``ipc`` messages, nor the
``engine``; the server process never loads torch (child entry points and the GGUF converter
are imported only where they run).
Modules are imported directly; nothing is re-exported here.
"""
