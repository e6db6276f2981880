"""The server the fuzzer launches, with every wave-3 feature on: a tiny random Qwen 3 reasoner
(``<think>`` tokens, Qwen 3's template: ``--reasoning-parser qwen3``), a LoRA adapter served from
the start (``fz``), the hierarchical cache (its tiers in ``/cache/stats`` and ``/cache/tree``), and
the adapter directories the fuzzer loads while serving: a good one, one over ``--max-lora-rank``,
one targeting a module the slots do not hold, and broken ones (bad JSON, wrong types in the config,
garbage weights, shapes that do not fit the model, NaN weights).

``build_fuzz_setup(smol_dir, root)`` -> ``FuzzSetup(model, args, ctx)``: start the server with
``ServerHandle(setup.model, *setup.args)`` and pass ``setup.ctx`` to ``run_fuzz``.  The adapters
are written here directly (safetensors + PEFT's adapter_config.json, no peft import: fast).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from tests.helpers.fuzz_cases import FuzzContext

# flags of the server the fuzzer launches: short outputs (a short context), bounded compiles
FUZZ_SERVER_ARGS = ("--max-total-tokens", "8192", "--context-length", "96", "--chunked-prefill-size", "256",
                    "--grammar-compile-timeout", "5")
# Qwen 3's template in short (its own renders one tool in 167 tokens, past the short context): the
# same roles, tool calls as <tool_call> (the hermes format), the enable_thinking switch, a namespace
COMPACT_QWEN3_TEMPLATE = (
    "{%- set ns = namespace(sys=false) %}{%- if messages[0].role == 'system' %}{%- set ns.sys = true %}{%- endif %}"
    "{%- if tools or ns.sys %}<|im_start|>system\n{% if ns.sys %}{{ messages[0].content }}{% endif %}"
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><tool_call>{% endif %}"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if not (loop.first and ns.sys) %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% endif %}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ (c.function or c).name }}</tool_call>{% endfor %}"
    "<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{%- endif %}")
ADAPTER, MAX_RANK, MAX_LOADED = "fz", 8, 6
TARGETS = ("q_proj", "v_proj")


@dataclass
class FuzzSetup:
    model: str
    args: tuple[str, ...]
    ctx: FuzzContext


def write_adapter(model_dir: str, out: str, rank: int, seed: int = 0, targets: tuple[str, ...] = TARGETS,
                  config: dict | None = None, shapes: dict | None = None, fill: float | None = None) -> str:
    """A PEFT LoRA adapter of ``model_dir`` in ``out``: random A and B (std 0.02) for ``targets`` of
    every layer; ``config`` overrides keys of adapter_config.json, ``shapes`` ``{module: (A shape, B
    shape)}`` the tensors' shapes, ``fill`` every weight's value (NaN, ...)."""
    from safetensors.torch import save_file

    with open(os.path.join(model_dir, "config.json")) as f:
        mc = json.load(f)
    hidden, heads, kv = mc["hidden_size"], mc["num_attention_heads"], mc["num_key_value_heads"]
    hd = mc.get("head_dim") or hidden // heads
    dims = {"q_proj": (hidden, heads * hd), "k_proj": (hidden, kv * hd), "v_proj": (hidden, kv * hd),
            "o_proj": (heads * hd, hidden), "gate_proj": (hidden, mc["intermediate_size"]),
            "up_proj": (hidden, mc["intermediate_size"]), "down_proj": (mc["intermediate_size"], hidden)}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(mc["num_hidden_layers"]):
        for m in targets:
            fan_in, fan_out = dims[m]
            a_shape, b_shape = (shapes or {}).get(m, ((rank, fan_in), (fan_out, rank)))
            kind = "mlp" if m in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{kind}.{m}"
            for which, shape in (("A", a_shape), ("B", b_shape)):
                t = torch.randn(shape, generator=g) * 0.02 if fill is None else torch.full(shape, fill)
                tensors[f"{key}.lora_{which}.weight"] = t.contiguous()
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(targets),
           "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM", **(config or {})}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    return out


def broken_adapters(model_dir: str, root: str) -> dict[str, str]:
    """Adapter directories that a load must refuse with a 400 naming ``lora_path`` (or load: NaN
    weights are the client's business, but must not break the server)."""
    out: dict[str, str] = {}

    def adapter(name: str, **kw) -> None:
        out[name] = write_adapter(model_dir, os.path.join(root, name), kw.pop("rank", 4), **kw)

    adapter("big", rank=16)
    adapter("k_proj", targets=("q_proj", "k_proj"))
    adapter("alpha_str", config={"lora_alpha": "x"})
    adapter("alpha_null", config={"lora_alpha": None})
    adapter("r_str", config={"r": "4"})
    adapter("r_zero", config={"r": 0})
    adapter("dora", config={"use_dora": True})
    adapter("prefix", config={"peft_type": "PREFIX_TUNING"})
    adapter("bias", config={"bias": "all"})
    adapter("alpha_pattern", config={"alpha_pattern": {"q_proj": "big"}})
    adapter("alpha_pattern_re", config={"alpha_pattern": {"(": 4}})
    adapter("alpha_nan", config={"lora_alpha": float("nan")})
    adapter("rank_pattern", config={"rank_pattern": {"q_proj": "x"}})
    adapter("target_str", config={"target_modules": "q_proj"})
    adapter("in_dim", shapes={"q_proj": ((4, 7), (64, 4))})
    adapter("out_dim", shapes={"v_proj": ((4, 64), (3, 4))})
    adapter("nan", fill=float("nan"))
    adapter("inf", fill=float("inf"))
    adapter("huge", fill=1e30)
    for name, files in {"no_weights": {"adapter_config.json": b'{"peft_type": "LORA", "r": 4}'},
                        "bad_json": {"adapter_config.json": b"{not json", "adapter_model.safetensors": b"x"},
                        "json_list": {"adapter_config.json": b"[1, 2]", "adapter_model.safetensors": b"x"},
                        "garbage": {"adapter_config.json": b'{"peft_type": "LORA", "r": 4}',
                                    "adapter_model.safetensors": b"\xff" * 64},
                        "header_lie": {"adapter_config.json": b'{"peft_type": "LORA", "r": 4}',
                                       "adapter_model.safetensors": (200).to_bytes(8, "little") + b"{}"},
                        "bin_garbage": {"adapter_config.json": b'{"peft_type": "LORA", "r": 4}',
                                        "adapter_model.bin": b"\x80\x02garbage"},
                        "empty": {}}.items():
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        for fname, data in files.items():
            with open(os.path.join(d, fname), "wb") as f:
                f.write(data)
        out[name] = d
    os.makedirs(os.path.join(root, "cfg_is_dir", "adapter_config.json"), exist_ok=True)
    out["cfg_is_dir"] = os.path.join(root, "cfg_is_dir")
    return out


def build_fuzz_setup(smol_dir: str, root: str) -> FuzzSetup:
    """The fuzz server's model, flags and the fuzzer's context, built under ``root``."""
    from tests.helpers.reasoning_models import build_tiny_reasoner

    model = build_tiny_reasoner(smol_dir, os.path.join(root, "model"), COMPACT_QWEN3_TEMPLATE)
    served = write_adapter(model, os.path.join(root, "adapters", ADAPTER), 4, seed=1)
    good = write_adapter(model, os.path.join(root, "adapters", "good"), 8, seed=2)
    bad = broken_adapters(model, os.path.join(root, "broken"))
    args = (*FUZZ_SERVER_ARGS, "--reasoning-parser", "qwen3", "--lora-paths", f"{ADAPTER}={served}",
            "--max-lora-rank", str(MAX_RANK), "--max-loaded-loras", str(MAX_LOADED), "--enable-hierarchical-cache")
    # odd but servable: non-finite or huge weights (the outputs are the client's business), config keys unused
    loadable = [good, *(bad[k] for k in ("nan", "inf", "huge", "target_str", "rank_pattern"))]
    ctx = FuzzContext(adapter=ADAPTER, good_adapter=good, broken_adapters=bad, loadable=loadable, model_dir=model,
                      reasoning=True)
    return FuzzSetup(model, args, ctx)
