"""frontend_lang: an SGLang-style frontend language for radixserve.

    from frontend_lang import function, gen, select, system, user, assistant, RuntimeEndpoint, set_default_backend

    @function
    def qa(s, question):
        s += system("You are terse.")
        s += user(question)
        s += assistant(gen("answer", max_tokens=64, stop="\\n"))

    set_default_backend(RuntimeEndpoint("http://127.0.0.1:30000"))
    state = qa.run(question="What is 2+2?", temperature=0)
    print(state["answer"], state.get_meta_info("answer")["cached_tokens"])

Backends: ``RuntimeEndpoint(url, api_key=None)`` (HTTP) and ``Runtime(model_path, **engine_options)``
/ ``EngineBackend(engine)`` (in-process ``radixserve.Engine``); the same program runs on either.

The program API is SGLang's (``sglang.lang``): a program written for SGLang runs here by
changing only ``import sglang as sgl`` to ``import frontend_lang as sgl``.  What has no
meaning for a text-only radixserve backend raises a clear error when used (``image``,
``video``, ``gen(n>1)``); ``function(num_api_spec_tokens=...)``
is accepted and ignored.  Tool calling: ``gen(name, tools=[...], tool_choice=...)`` and
``state.tool_calls(name)`` (see ``tools``).  LoRA adapters served by the backend:
``gen(..., lora="name")`` / ``select(..., lora="name")``, or ``program.run(..., lora="name")`` for
every gen and select of the run (radixserve's extension; sent as /generate's ``lora_path``).
Documents: ``s += document(text)`` appends text the runtime may reuse out of order (radixserve's
extension; a gen's prompt with documents is sent as /generate's ``segments``).
Reasoning models: ``s += separate_reasoning(gen("x"), model_type="qwen3")`` (SGLang's) leaves the
answer in ``s["x"]`` and the thinking in ``s["x_reasoning_content"]``; ``gen(..., require_reasoning=True)``
applies a constraint after the thinking only (with a server started with ``--reasoning-parser``).

Owns: the program API (``api``, ``ir``, ``program``), its interpreter (``state``, ``executor``,
``batch``, ``tracer``, ``stream``, ``transcript``), client-side chat templates
(``chat_template``), ``select`` scoring (``select_op``, ``choice_scoring``), typed generation
(``dtypes``), the sampling parameters of a run and of each gen (``sampling``: the run's defaults
merged with a gen's overrides, split into /generate's request options and ``sampling_params``),
tool calling in programs (``tools``), the exceptions (``errors``: ``FrontendError``,
``BackendError``, ``ProgramError``) and the backends (``backend/``).
Must not touch: the runtime's internals -- it is a client of the HTTP API or of the Engine's
public API, never of the scheduler or the worker; of radixserve it imports only
``sampling_params``, ``radixserve.tools``, ``radixserve.reasoning`` and (lazily, in ``backend``) ``engine`` and
``tokenizer``, so importing it never loads torch.  Public names: ``__all__``.
"""
from frontend_lang.api import (assistant, assistant_begin, assistant_end, document, flush_cache, gen, gen_int,
                               gen_string, get_default_backend, get_server_info, global_config, image, select,
                               separate_reasoning, set_default_backend, system, system_begin, system_end, user,
                               user_begin, user_end, video)
from frontend_lang.backend import Backend, EngineBackend, Runtime, RuntimeEndpoint
from frontend_lang.chat_template import ChatTemplate
from frontend_lang.choice_scoring import (greedy_token_selection, token_length_normalized,
                                          unconditional_likelihood_normalized)
from frontend_lang.errors import BackendError, FrontendError, ProgramError
from frontend_lang.program import SglFunction, function
from frontend_lang.state import ProgramState, ProgramStateGroup
from frontend_lang.tools import tools_prompt

__all__ = [
    "assistant", "assistant_begin", "assistant_end", "document", "flush_cache", "gen", "gen_int", "gen_string",
    "get_default_backend", "get_server_info", "global_config", "image", "select", "separate_reasoning",
    "set_default_backend", "video",
    "system", "system_begin", "system_end", "user", "user_begin", "user_end",
    "Backend", "EngineBackend", "Runtime", "RuntimeEndpoint", "ChatTemplate",
    "greedy_token_selection", "token_length_normalized", "unconditional_likelihood_normalized",
    "BackendError", "FrontendError", "ProgramError", "SglFunction", "function", "ProgramState", "ProgramStateGroup",
    "tools_prompt",
]
