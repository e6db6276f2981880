"""Compute and memory rooflines for bench_peers.py: the machine's GEMM rate, the FLOPs a run
computed, and the bytes a decode step reads.

FLOPs counted (a multiply-add is 2 FLOPs; norms, rotary, SiLU, softmax and sampling are left
out: they are O(hidden) per token against O(hidden^2) for the matmuls):

* linear layers: ``2 * L * P_layer`` per token pass, ``P_layer`` = the weights of
  qkv_proj + o_proj + gate_up_proj + down_proj of one layer (biases ignored);
* LM head: ``2 * hidden * vocab`` per SAMPLED row only (radixserve computes logits for the
  last new token of a request, not for the whole prompt): one row per output token;
* attention: ``4 * L * n_heads * head_dim * ctx`` for a token that attends to ``ctx`` keys
  (itself included): QK^T and PV, each 2 * head_dim per head per key; causal, nothing masked.

Token passes of a request: its uncached prompt tokens plus ``output - 1`` decode passes (the
first output token comes from the prompt's last pass; the last output token is never fed
back).  A token at position ``pos`` (0-based) attends to ``pos + 1`` keys.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.nn.functional as F


def head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def linear_shapes(cfg: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of one decoder layer's matmuls, fused as radixserve runs them."""
    h, d = cfg.hidden_size, head_dim(cfg)
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    return {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "gate_up_proj": (h, 2 * cfg.intermediate_size),
            "down_proj": (cfg.intermediate_size, h)}


def layer_params(cfg: Any) -> int:
    return sum(k * n for k, n in linear_shapes(cfg).values())


def weight_params(cfg: Any) -> int:
    """Parameters a decode step reads: every layer's linear weights and norms, the final norm and
    the LM head (the tied embedding matrix read once in full; the embedding lookup reads one row)."""
    return cfg.num_hidden_layers * (layer_params(cfg) + 2 * cfg.hidden_size) + cfg.hidden_size \
        + cfg.hidden_size * cfg.vocab_size


def gemm_rates(cfg: Any, dtypes: tuple[str, ...] = ("float32", "bfloat16"), m: int = 1024,
               reps: int = 10) -> dict[str, dict[str, float]]:
    """GFLOP/s of ``F.linear`` (M x K by an N x K weight, as nn.Linear stores it) on each layer
    shape: the best of ``reps`` rounds of >= 20 ms each, after warm-ups; ``peak`` is the best shape."""
    gen = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for name in dtypes:
        dt = getattr(torch, name)
        rates = {}
        for shape, (k, n) in linear_shapes(cfg).items():
            x, w = torch.randn(m, k, generator=gen).to(dt), torch.randn(n, k, generator=gen).to(dt)
            once = min(timed_calls(x, w, 1) for _ in range(3))  # the first calls also warm up
            iters = max(1, int(0.02 / max(once, 1e-6)))
            best = min(timed_calls(x, w, iters) for _ in range(reps))
            rates[shape] = 2 * m * k * n / best / 1e9
        rates["peak"] = max(rates.values())
        out[name] = rates
    return out


def timed_calls(x: torch.Tensor, w: torch.Tensor, iters: int) -> float:
    """Seconds per ``F.linear(x, w)``, averaged over ``iters`` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(iters):
        F.linear(x, w)
    return (time.perf_counter() - t0) / iters


def tri(n: int) -> int:
    """1 + 2 + ... + n."""
    return n * (n + 1) // 2


def run_flops(cfg: Any, requests: list[tuple[int, int, int]]) -> dict[str, float]:
    """FLOPs of a run from its (prompt_tokens, cached_tokens, output_tokens) per request."""
    passes = sum(p - c + max(o - 1, 0) for p, c, o in requests)
    sampled = sum(o for _, _, o in requests)
    keys = sum(tri(p + max(o - 1, 0)) - tri(c) for p, c, o in requests)  # sum of (pos + 1) over passes
    n_layers, d = cfg.num_hidden_layers, head_dim(cfg)
    linear = 2.0 * n_layers * layer_params(cfg) * passes
    lm_head = 2.0 * cfg.hidden_size * cfg.vocab_size * sampled
    attention = 4.0 * n_layers * cfg.num_attention_heads * d * keys
    return {"token_passes": passes, "sampled_rows": sampled, "attended_keys": keys, "linear_flop": linear,
            "lm_head_flop": lm_head, "attention_flop": attention, "total_flop": linear + lm_head + attention}


def decode_step_bytes(cfg: Any, weight_bytes: float, kv_elem_bytes: float, ctx: float) -> float:
    """Bytes one single-stream decode step reads: the weights, plus K and V of ``ctx`` tokens."""
    return weight_bytes + 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim(cfg) * ctx * kv_elem_bytes


def gguf_weight_bytes(path: str) -> int:
    """Bytes of every tensor in a GGUF file, quantized as stored (llama.cpp reads them as is)."""
    from gguf import GGUFReader

    return int(sum(int(t.n_bytes) for t in GGUFReader(path).tensors))


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def batch_roofline(cfg: Any, workload: dict[str, Any], ours: dict[str, Any], gemm: dict[str, Any], gemm_m: int,
                   name: str = "shared_prefix") -> dict[str, Any]:
    """Achieved GFLOP/s of radixserve's run of the batch workload ``name`` against the peak GEMM
    rate of its dtype."""
    sp, dtype = ours[name], ours["info"]["dtype"]
    reqs = list(zip(map(len, workload["prompts"]), sp["cached_per_request"], workload["output_lens"]))
    flops = run_flops(cfg, reqs)
    achieved = flops["total_flop"] / sp["time_s"] / 1e9
    return {"peer": "radixserve", "dtype": dtype, "gemm_m": gemm_m, "flops": flops,
            "prompt_tokens": sp["prompt_tokens"], "cached_tokens": sp["cached_tokens"],
            "layers": cfg.num_hidden_layers, "layer_params": layer_params(cfg),
            "lm_head_params": cfg.hidden_size * cfg.vocab_size, "time_s": sp["time_s"], "achieved_gflops": achieved,
            "peak_gflops": gemm[dtype]["peak"], "pct_of_peak": achieved / gemm[dtype]["peak"],
            "attention_flop_share": flops["attention_flop"] / flops["total_flop"]}


def decode_weight_bytes(model: Any) -> int:
    """Bytes of weights a one-row decode step of radixserve's ``model`` reads: each linear as
    it is stored for one row (a quantized layer's int8/int4 tensors and scales, else its dense
    weight), the LM head the same way (its int8 copy when it has one), and the norms; the
    embedding table is read one row per token, so it is not counted."""
    import torch

    seen, total = set(), 0

    def add(t: Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()

    head = getattr(model, "lm_head_quant", None)
    for name, mod in model.named_modules():
        if name.endswith("embed_tokens"):
            continue
        if hasattr(mod, "q") and isinstance(getattr(mod, "q"), torch.Tensor):  # QuantLinear, Int8HeadLinear
            for attr in ("q", "scale", "inv_scale", "bias"):
                add(getattr(mod, attr, None))
            continue
        if isinstance(getattr(mod, "packed", None), torch.Tensor):  # PackedLinear: oneDNN's opaque layout
            total += mod.out_features * mod.in_features * mod.weight_dtype.itemsize
            add(getattr(mod, "bias", None))
            continue
        for p in mod.parameters(recurse=False):
            add(p)
    if head is None and getattr(model, "lm_head_packed", None) is None:  # (a packed head was counted above)
        add(model.lm_head_weight())
    return total


def decode_bandwidth(cfg: Any, results: dict[str, Any], gguf: Optional[str]) -> list[dict[str, Any]]:
    """gpt-fast's figure per peer: bytes one single-stream decode step reads x decode tok/s.
    Weights in the peer's dtype (llama.cpp: the GGUF's tensors as stored, KV in f16); KV at the
    mean context of the decode steps."""
    rows = []
    for name, res in results.items():
        single, info = res.get("single"), res["info"]
        if not single:
            continue
        ctx = single["prompt_len"] + single["output_len"] / 2
        if info["peer"] == "llama.cpp" and gguf:
            wbytes, kv, what = gguf_weight_bytes(gguf), 2, "GGUF tensors as stored, KV f16"
        elif info.get("decode_weight_bytes"):
            b = DTYPE_BYTES[str(info["dtype"]).removeprefix("torch.")]
            wbytes, kv = info["decode_weight_bytes"], b
            what = f"weights as stored ({info.get('quantization', 'none')}), KV {b} B"
        else:
            b = DTYPE_BYTES[str(info["dtype"]).removeprefix("torch.")]
            wbytes, kv, what = weight_params(cfg) * b, b, f"{weight_params(cfg) / 1e6:.1f}M params x {b} B"
        step = decode_step_bytes(cfg, wbytes, kv, ctx)
        rows.append({"peer": name, "weights": what, "step_bytes": step, "tok_s": single["decode_tok_s"],
                     "gb_s": step * single["decode_tok_s"] / 1e9, "ctx": ctx})
    return rows


def memory_rates(mib: int = 1024, reps: int = 10) -> dict[str, float]:
    """The machine's memory bandwidth in GB/s, best of ``reps``, on ``mib`` MiB buffers (far past
    any cache): ``copy`` = bytes read + written by ``dst.copy_(src)`` (STREAM's copy count), and
    ``read`` = bytes read by an fp32 sum (a memory-bound decode step only reads)."""
    from benchmarks.peer_runners.common import timed

    n = mib * 2**20
    src, dst = torch.ones(n // 4), torch.empty(n // 4)
    dst.copy_(src), src.sum()  # touch every page first
    copy = min(timed(lambda: dst.copy_(src))[0] for _ in range(reps))
    read = min(timed(src.sum)[0] for _ in range(reps))
    return {"copy_gb_s": 2 * n / copy / 1e9, "read_gb_s": n / read / 1e9, "buffer_mib": mib}
