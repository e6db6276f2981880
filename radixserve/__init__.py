"""radixserve: a prefix-sharing LLM serving runtime (radix-tree KV cache, continuous batching).

Exports ``Engine`` (imported lazily, so ``import radixserve`` never loads torch) and
``SamplingParams``.  The map, lowest layer first (a module imports only from lower layers and
its own package; docs/ARCHITECTURE.md "Layout", enforced by ``tests/ops/test_import_graph.py``):

* the leaves: ``config`` (the frozen config dataclasses the CLI's flags come from),
  ``lora_config`` (``LoRAConfig``), ``chat_template`` (a ``--chat-template`` read and checked), ``sampling_params``, ``request`` (``FinishReason``,
  ``ReqStatus``), ``tokenizer`` (the one tokenizer loader), ``validation`` (a pydantic error as
  one "field.path: reason" line), ``utils`` (malloc tuning, request ids), ``proc/`` (child
  processes and their ``Supervisor``), ``embedding`` (pooling names, normalization),
  ``lora/`` (adapters read and checked, the served ones by name) and ``reasoning/`` (reasoning
  models: the thinking formats, the split of an output into thinking and answer);
* between processes: ``ipc/`` (the typed messages), ``output_state`` (the one builder of
  ``{text, output_ids, meta_info}``) and ``metrics`` (Prometheus);
* the KV memory and the requests' rules: ``mem_cache/`` (KV slots, prefix caches, the
  hierarchical cache), ``constrained/`` (grammars), ``tools/`` (tool calling) and
  ``request_builder`` (the front door: validation, clamping, ``n``);
* the model worker's side: ``radixserve.kernels`` (the top-level ``kernels/`` folder),
  ``attention/`` (the backends), ``parallel/`` (tensor and pipeline parallelism's groundwork),
  ``model/`` (the models and their loading), ``speculative/`` (proposals and acceptance) and
  ``worker/`` (``ModelRunner``, its process and proxy);
* the processes and front ends: ``scheduler/`` (continuous batching), ``detokenizer/``,
  ``engine/`` (the in-process runtime), ``server/`` (HTTP), ``router/`` (the data-parallel
  router) and ``cli`` (``radixserve {generate,serve,router}``).
"""
from radixserve.sampling_params import SamplingParams

__all__ = ["Engine", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Engine":
        from radixserve.engine import Engine

        return Engine
    raise AttributeError(name)
