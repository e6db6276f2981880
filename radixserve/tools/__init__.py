"""Tool calling, shared by the server's chat route and ``frontend_lang`` (docs/tool_calling.md).

Owns: ``protocol`` (the OpenAI tool shapes, pydantic), ``spec`` (``plan_tools``: tools /
tool_choice -> a ``ToolPlan``, with the ``json_schema`` constraint of a required or named call),
``prompt`` (tools and tool messages in the prompt), ``parsers`` (``make_parser``: output text ->
content and calls: Hermes, Mistral, Llama 3, JSON), ``json_scan`` (incremental scan of call
JSON) and ``stream.ToolCallStream`` (``tool_calls`` whole or as stream deltas).
Must not touch: requests, the server or the grammar backends -- it returns plans, text and
parsed calls for the caller to apply; it imports only ``validation`` (no torch).
Modules are imported directly; nothing is re-exported here.
"""
