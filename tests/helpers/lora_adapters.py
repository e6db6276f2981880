"""Tiny random PEFT LoRA adapters for a test model, and PEFT's merged model as the oracle."""
from __future__ import annotations

from typing import Sequence

import torch

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(base_dir: str, out_dir: str, rank: int, seed: int, targets: Sequence[str] = ALL,
                 alpha: float = 16.0, std: float = 0.05, rslora: bool = False) -> str:
    """Save a LoRA adapter of ``base_dir`` with random A and B (PEFT starts B at zero, which
    would make every adapter the base model) in ``out_dir``; return it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM", use_rslora=rslora)
    model = get_peft_model(base, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    model.save_pretrained(out_dir)
    return out_dir


def merged_model(base_dir: str, adapter_dir: str):
    """PEFT's merged model (``W + scale * B @ A``) in fp32, eval mode."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().eval()


def greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy continuation of ``ids`` by an HF model: the tokens and each one's logprob."""
    out, lps = [], []
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            logits = model(x).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            t = int(lp.argmax())
            out.append(t)
            lps.append(float(lp[t]))
            x = torch.cat([x, torch.tensor([[t]])], 1)
    return out, lps
