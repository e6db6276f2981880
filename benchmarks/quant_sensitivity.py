"""Which layers cost a quantization method its accuracy: teacher-forced argmax agreement with fp32
(``auto``'s measure, ``worker/tuning/quant_accuracy.py``) with every decoder linear quantized, then
with one class of layers (qkv, o, gate_up, down), the first/last layers, or one layer at a time
kept dense in bf16.  It tells whether a mixed-precision variant could clear the 97% bar.

    python -m benchmarks.quant_sensitivity [--method w8a8] [--model PATH] [--per-layer]
"""
from __future__ import annotations

import argparse
import re

import torch

from radixserve.model import loader
from radixserve.model.quant import calibration
from radixserve.model.quant.linear import QuantLinear
from radixserve.worker.tuning.quant_accuracy import lower_bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="w8a8")
    ap.add_argument("--model", default=None)
    ap.add_argument("--per-layer", action="store_true", help="also keep each layer dense in turn")
    args = ap.parse_args()
    hf = loader.resolve_hf_dir(args.model)
    cfg, cpu = loader.load_config(hf), torch.device("cpu")
    seqs = calibration.encode(hf, calibration.CHECK)
    max_pos = max(len(s) for s in seqs) + 1
    ref = calibration.teacher_forced_logits(loader.load_model(cfg, hf, torch.float32, cpu, max_pos), seqs).argmax(-1)
    dense = loader.load_model(cfg, hf, torch.bfloat16, cpu, max_pos)
    quant = loader.load_model(cfg, hf, torch.bfloat16, cpu, max_pos, quantization=args.method)
    dmods, qmods = dict(dense.named_modules()), dict(quant.named_modules())
    names = [n for n, m in quant.named_modules() if isinstance(m, QuantLinear)]

    def layer(n: str) -> int:
        return int(re.search(r"layers\.(\d+)", n)[1])

    def agreement(model: torch.nn.Module) -> float:
        return float((calibration.teacher_forced_logits(model, seqs).argmax(-1) == ref).float().mean())

    def with_dense(keep) -> float:
        swapped = [n for n in names if keep(n)]
        for n in swapped:
            parent, child = n.rsplit(".", 1)
            setattr(qmods[parent], child, dmods[n])
        try:
            return agreement(quant)
        finally:
            for n in swapped:
                parent, child = n.rsplit(".", 1)
                setattr(qmods[parent], child, qmods[n])

    last = cfg.num_hidden_layers - 1
    rows = [("bf16, nothing quantized", agreement(dense)), (f"{args.method} everywhere", with_dense(lambda n: False))]
    for label, part in (("qkv", "qkv_proj"), ("o", "o_proj"), ("gate_up", "gate_up_proj"), ("down", "down_proj")):
        rows.append((f"{args.method}, {label} dense", with_dense(lambda n, p=part: n.endswith(p))))
    rows.append((f"{args.method}, layers 0 and {last} dense", with_dense(lambda n: layer(n) in (0, last))))
    rows.append((f"{args.method}, layers 0-1 and {last - 1}-{last} dense",
                 with_dense(lambda n: layer(n) in (0, 1, last - 1, last))))
    if args.per_layer:
        for i in range(cfg.num_hidden_layers):
            rows.append((f"{args.method}, layer {i} dense", with_dense(lambda n, i=i: layer(n) == i)))
    n = int(ref.numel())
    print(f"model {hf}: {n} positions (calibration CHECK texts); bar: lower bound >= 97%")
    print("| variant | agreement | lower bound |\n|---|---:|---:|")
    for label, rate in rows:
        print(f"| {label} | {100 * rate:.2f}% | {100 * lower_bound(rate, n):.2f}% |")


if __name__ == "__main__":
    main()
