"""The fields the OpenAI routes take, per request body and per nested object the route validates,
kept in one place (as ``protocol.UNSUPPORTED_WHEN_SET`` / ``protocol.IGNORED`` are for /generate).

Each body is ``*_OPENAI`` (the fields of OpenAI's API reference that the route implements, or
refuses with a reason when set: ``suffix``, ``best_of`` other than ``n``), ``*_EXTENSIONS``
(SGLang's and vLLM's extra fields that radixserve implements, and radixserve's own) and
``*_IGNORED`` (fields of OpenAI's reference that have no effect here, accepted so that the
official client's every argument is taken).  The request models forbid every other name, so a
misspelling (``temprature``, ``max_tokenz``) is a 400 naming it.  ``accepted(...)`` is what a
model must declare: tests/server/test_openai_fields.py checks each model's fields against it both
ways, and the official ``openai`` package's parameter types against it, so neither drifts.
"""
from __future__ import annotations

from typing import Any

# ------------------------------------------------------------------ /v1/completions and /v1/chat/completions
SHARED_OPENAI = ("model", "frequency_penalty", "logit_bias", "max_tokens", "n", "presence_penalty", "seed", "stop",
                 "stream", "stream_options", "temperature", "top_p", "user")
# SamplingParams fields under their own names (protocol.OPENAI_SAMPLING_FIELDS less OpenAI's), SGLang's
# min_tokens / json_schema / rid / response_format (an OpenAI chat field, an extension on completions)
SHARED_EXTENSIONS = (
    "top_k", "min_p", "repetition_penalty", "stop_token_ids", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "regex", "ebnf", "structural_tag", "json_schema", "constraint_budget",
    "stop_regex", "no_stop_trim", "sampling_seed", "custom_params", "stream_interval", "priority", "cache_salt",
    "lora_path", "document_recompute", "document_select", "min_tokens", "rid", "response_format",
    "require_reasoning", "thinking_token_budget",  # reasoning models (docs/REASONING.md)
)

COMPLETION_OPENAI = (*SHARED_OPENAI, "prompt", "logprobs", "echo", "suffix", "best_of")
COMPLETION_EXTENSIONS = SHARED_EXTENSIONS
COMPLETION_IGNORED: dict[str, str] = {}

CHAT_OPENAI = (*SHARED_OPENAI, "messages", "logprobs", "top_logprobs", "max_completion_tokens", "response_format",
               "tools", "tool_choice", "parallel_tool_calls")
CHAT_EXTENSIONS = (*SHARED_EXTENSIONS, "continue_final_message", "chat_template_kwargs", "separate_reasoning")
CHAT_IGNORED: dict[str, str] = {
    "audio": "audio output is not produced (text-only models)",
    "modalities": "the output is text",
    "functions": "the deprecated form of tools",
    "function_call": "the deprecated form of tool_choice",
    "metadata": "stored completions are not kept",
    "store": "stored completions are not kept",
    "service_tier": "one tier of service",
    "prediction": "predicted outputs are not used",
    "reasoning_effort": "no effect here (chat_template_kwargs sets a template's thinking switch)",
    "verbosity": "no effect here",
    "web_search_options": "no web search",
    "moderation": "no moderation",
    "safety_identifier": "an end-user id (as user)",
    "prompt_cache_key": "the radix cache needs no key (cache_salt isolates tenants)",
    "prompt_cache_options": "the radix cache needs no options",
    "prompt_cache_retention": "the radix cache keeps prefixes while memory allows",
}

# ------------------------------------------------------------------ /v1/embeddings
EMBEDDING_OPENAI = ("input", "model", "encoding_format", "dimensions", "user")
EMBEDDING_EXTENSIONS = ("pooling", "normalize")
EMBEDDING_IGNORED: dict[str, str] = {}

# ------------------------------------------------------------------ nested objects of the chat body
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
MESSAGE_IGNORED: dict[str, str] = {
    "refusal": "an assistant message's refusal text (not rendered)",
    "audio": "an assistant message's audio (not rendered)",
    "function_call": "the deprecated form of tool_calls",
    "reasoning_content": "an earlier answer's reasoning (SGLang's and vLLM's field; not rendered)",
}
CONTENT_PART_FIELDS = ("type", "text", "document")  # document: radixserve's (docs/DOCUMENTS.md)
CONTENT_PART_IGNORED: dict[str, str] = {
    "image_url": "text-only models: only text parts are rendered",
    "input_audio": "text-only models: only text parts are rendered",
    "file": "text-only models: only text parts are rendered",
    "refusal": "only text parts are rendered",
    "prompt_cache_breakpoint": "the radix cache finds shared prefixes itself",
}
STREAM_OPTIONS_FIELDS = ("include_usage",)
STREAM_OPTIONS_IGNORED: dict[str, str] = {"include_obfuscation": "chunks are not padded"}
RESPONSE_FORMAT_FIELDS = ("type", "json_schema")
JSON_SCHEMA_FORMAT_FIELDS = ("name", "description", "schema", "strict")

# ------------------------------------------------------------------ /v1/responses (openai/responses_protocol.py)
# background, conversation and prompt are refused when set (no background runs, conversations or saved prompts);
# truncation "auto" is refused (the prompt is never cut)
RESPONSES_OPENAI = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
                    "tool_choice", "parallel_tool_calls", "text", "reasoning", "previous_response_id", "store",
                    "stream", "metadata", "user", "truncation", "background", "conversation", "prompt")
RESPONSES_EXTENSIONS = ("top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "seed",
                        "stop", "priority", "cache_salt", "chat_template_kwargs", "thinking_token_budget")
RESPONSES_IGNORED: dict[str, str] = {
    "access_programs": "no access programs",
    "background_options": "no background runs",
    "context_management": "the context is never compacted",
    "image": "text-only models",
    "include": "nothing extra to include (no logprobs, encrypted reasoning or built-in tools)",
    "max_tool_calls": "no built-in tools",
    "moderation": "no moderation",
    "prompt_cache_key": "the radix cache needs no key (cache_salt isolates tenants)",
    "prompt_cache_options": "the radix cache needs no options",
    "prompt_cache_retention": "the radix cache keeps prefixes while memory allows",
    "safety_identifier": "an end-user id (as user)",
    "service_tier": "one tier of service",
    "stream_options": "events are not padded (include_obfuscation)",
    "top_logprobs": "logprobs are not returned on /v1/responses",
}
RESPONSES_TOOL_FIELDS = ("type", "name", "description", "parameters", "strict")
RESPONSES_TOOL_IGNORED: dict[str, str] = {
    "allowed_callers": "every function may be called directly",
    "async": "calls are returned to the client, which runs them",
    "defer_loading": "every tool is in the prompt",
    "output_schema": "a function's output is rendered as given",
}
RESPONSES_CONTENT_PART_FIELDS = ("type", "text", "refusal")
RESPONSES_CONTENT_PART_IGNORED: dict[str, str] = {
    "annotations": "an earlier answer's annotations (not rendered)",
    "logprobs": "an earlier answer's logprobs (not rendered)",
    "prompt_cache_breakpoint": "the radix cache finds shared prefixes itself",
    "image_url": "refused: text-only models", "file_id": "refused: text-only models",
    "detail": "refused: text-only models", "file_data": "refused: text-only models",
    "file_url": "refused: text-only models", "filename": "refused: text-only models",
    "input_audio": "refused: text-only models",
}


def accepted(*groups: Any) -> frozenset[str]:
    """Every name in ``groups`` (tuples of names, or dicts of ignored names and their reasons)."""
    return frozenset(name for g in groups for name in g)


def ignored_fields(ignored: dict[str, str]) -> dict[str, Any]:
    """``ignored`` as ``create_model`` field definitions: any value, default None."""
    return {name: (Any, None) for name in ignored}
