"""Calibration for quantization: fixed texts, a teacher-forced forward, per-layer input scales.

Two fixed sets of texts, tokenized with the model's own tokenizer: ``FIT`` (~300 tokens with
SmolLM2's tokenizer) is what the input-channel scales of ``model/quant/linear.py`` are searched on;
``CHECK`` (~1,300 tokens; chat turns, prose, code, a how-to, notes, a config, numbers) is what
``worker/tuning/quant_accuracy.py`` measures agreement on, so a method is never checked on the text
its scales were fitted to.  ``CALIBRATION_VERSION`` is part of every cache key built on them.

Scales are searched once per (model, method) on the fp32 model (forward hooks see each linear
layer's fp32 input) and cached in ``$RADIXSERVE_CACHE/quant_scales/`` as a small ``.pt`` file.  A
weight-only method whose grid holds every weight exactly (int4 on a Q4_1 GGUF's weights) keeps
none, as the search would, without running the forward.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import time
from typing import Optional

import torch
from torch import nn

from radixserve.attention.base import ForwardBatch, ForwardMode
from radixserve.attention.registry import create_attention_backend
from radixserve.mem_cache.kv_pool import KVPool
from radixserve.model.quant.linear import fake_quantize, search_in_scale, supports
from radixserve.tokenizer import load_hf_tokenizer

logger = logging.getLogger(__name__)

CALIBRATION_VERSION = 2  # 2: CHECK doubled (~1,300 tokens), so that a method at 98% clears the bar's bound
FIT = (
    "The Amazon River in South America is the largest river in the world by discharge volume of water. It "
    "flows for about 6,400 kilometres from the Andes mountains of Peru to the Atlantic Ocean, and its basin "
    "covers about seven million square kilometres, much of it tropical rainforest.",
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n        mid = "
    "(lo + hi) // 2\n        if items[mid] == target:\n            return mid\n        if items[mid] < target:"
    "\n            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n",
    "<|im_start|>user\nGive me three tips for sleeping better.<|im_end|>\n<|im_start|>assistant\n1. Go to bed "
    "and wake up at the same time every day, even at weekends.\n2. Keep your bedroom dark, quiet and cool.\n"
    "3. Avoid caffeine in the afternoon and screens in the hour before bed.<|im_end|>\n",
    "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"known_for\": [\"Analytical Engine\", \"first computer "
    "program\"], \"languages\": {\"english\": true, \"french\": true}}\nSELECT name, born FROM people WHERE "
    "born < 1900 ORDER BY born;",
    "Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker who never "
    "spoke. Every morning he opened his shop, wound every clock on the walls, and sat down at his bench to "
    "work. The children of the village said the clocks told him secrets.",
    "Question: A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost?\nAnswer: Twelve pencils "
    "are four groups of three, and each group costs 45 cents, so they cost 4 x 45 = 180 cents, or $1.80.",
)
CHECK = (
    "<|im_start|>user\nWhat is the difference between a list and a tuple in Python, and when should I "
    "use each?<|im_end|>\n<|im_start|>assistant\nA list is mutable: you can append, remove or change its "
    "items after you create it. A tuple is immutable: once created, it cannot change. Use a list for a "
    "collection that grows or shrinks, such as the lines of a file you are reading. Use a tuple for a fixed "
    "group of values, such as the x and y coordinates of a point, or as a dictionary key.<|im_end|>\n",
    "The French Revolution began in 1789 with the storming of the Bastille, a royal prison in Paris. Over the "
    "next decade the monarchy was abolished, King Louis XVI was executed, and France became a republic, "
    "until Napoleon Bonaparte seized power in 1799 and later crowned himself emperor.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        "
    "self.items.append(item)\n\n    def pop(self):\n        if not self.items:\n            raise IndexError("
    "\"pop from an empty stack\")\n        return self.items.pop()\n\n    def __len__(self):\n        return "
    "len(self.items)\n",
    "How to make a cup of tea:\n1. Boil fresh water in a kettle.\n2. Warm the teapot with a little hot water, "
    "then pour it away.\n3. Put one teaspoon of loose tea per person into the pot.\n4. Pour the boiling water "
    "over the leaves and let them steep for three to five minutes.\n5. Pour the tea through a strainer.",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nMy train leaves at 14:35 "
    "and the trip takes 2 hours and 50 minutes. When do I arrive?<|im_end|>\n<|im_start|>assistant\nYou "
    "arrive at 17:25. Adding 2 hours to 14:35 gives 16:35, and 50 more minutes gives 17:25.<|im_end|>\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make "
    "glucose and oxygen. It takes place mainly in the leaves, inside small structures called chloroplasts, "
    "which contain the green pigment chlorophyll that absorbs light energy.",
    "Dear Ms. Patel,\n\nThank you for your letter of 12 March. I am sorry to hear that your order arrived "
    "damaged. We have sent a replacement by express delivery, and you should receive it within three working "
    "days. Please keep the damaged item; there is no need to return it.\n\nYours sincerely,\nTom Walker",
    "The mitochondrion is often called the powerhouse of the cell. It converts nutrients into adenosine "
    "triphosphate, the molecule cells use to store and transfer energy. Unlike most organelles, mitochondria "
    "have their own DNA, which is inherited from the mother.",
    "import numpy as np\n\ndef normalize(v):\n    norm = np.linalg.norm(v)\n    return v if norm == 0 else "
    "v / norm\n\nvectors = np.random.rand(10, 3)\nunit = np.array([normalize(v) for v in vectors])\n"
    "print(unit.shape, np.allclose(np.linalg.norm(unit, axis=1), 1.0))\n",
    "<|im_start|>user\nCan you explain what a mortgage is in simple terms?<|im_end|>\n<|im_start|>assistant\n"
    "A mortgage is a loan you take out to buy a home. The bank pays the seller, and you pay the bank back "
    "in monthly instalments over many years, usually fifteen to thirty. Each payment covers part of the "
    "amount you borrowed and some interest. If you stop paying, the bank can take the house, because the "
    "house is the security for the loan.<|im_end|>\n",
    "The Great Barrier Reef, off the coast of Queensland in Australia, is the largest coral reef system on "
    "Earth. It stretches for more than 2,300 kilometres and is made of thousands of individual reefs and "
    "hundreds of islands. Rising sea temperatures have caused several mass bleaching events since 1998, "
    "when corals expel the algae that give them their colour and most of their food.",
    "function debounce(fn, wait) {\n  let timer = null;\n  return function (...args) {\n    clearTimeout("
    "timer);\n    timer = setTimeout(() => fn.apply(this, args), wait);\n  };\n}\n\nconst onResize = "
    "debounce(() => console.log(window.innerWidth), 200);\nwindow.addEventListener(\"resize\", onResize);\n",
    "Meeting notes, 4 June\nAttendees: Priya, Marco, Lena, Sam\n- The launch moves from 20 June to 1 July "
    "because the payment tests are not finished.\n- Marco will ask the design team for the final icons by "
    "Friday.\n- Lena reported that support tickets fell by 18% after the new help pages went live.\n"
    "Next meeting: Tuesday at 10:00.",
    "<|im_start|>user\nA rectangle is 8 cm long and 5 cm wide. What are its area and its perimeter?"
    "<|im_end|>\n<|im_start|>assistant\nThe area is length times width: 8 x 5 = 40 square centimetres. The "
    "perimeter is twice the sum of the sides: 2 x (8 + 5) = 26 centimetres.<|im_end|>\n",
    "When the first settlers arrived, the valley was covered with oak and beech. They cleared the lower "
    "slopes for wheat and sheep, built a mill where the river narrows, and within a century the forest "
    "survived only on the steep ground above the village, where the soil was too thin to plough.",
    "server:\n  host: 0.0.0.0\n  port: 8080\n  workers: 4\ndatabase:\n  url: postgres://app@db:5432/shop\n"
    "  pool_size: 10\n  timeout_seconds: 30\nlogging:\n  level: info\n  format: json\n",
    "Vaccines train the immune system to recognise a germ without causing the disease. Most contain a "
    "weakened or inactivated form of the germ, or one of its proteins. After vaccination, the body makes "
    "antibodies and memory cells, so that if the real germ appears later, the immune system can respond "
    "quickly and strongly.",
)


def encode(hf_dir: str, texts: tuple[str, ...]) -> list[list[int]]:
    tok = load_hf_tokenizer(hf_dir)
    return [tok.encode(t) for t in texts]


def model_fingerprint(hf_dir: str) -> str:
    """config.json, and the name, size and first/middle/last MiB of every weight file."""
    h = hashlib.sha1()
    with open(os.path.join(hf_dir, "config.json"), "rb") as f:
        h.update(f.read())
    mib = 1 << 20
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")) + glob.glob(os.path.join(hf_dir, "*.bin"))):
        size = os.path.getsize(path)
        h.update(f"{os.path.basename(path)}:{size}".encode())
        with open(path, "rb") as f:
            for offset in (0, max(0, size // 2 - mib // 2), max(0, size - mib)):
                f.seek(offset)
                h.update(f.read(mib))
    return h.hexdigest()[:16]


def teacher_forced_logits(model: nn.Module, seqs: list[list[int]], pool_dtype: Optional[torch.dtype] = None,
                          kv_quant: Optional[str] = None) -> torch.Tensor:
    """fp32 logits ``[sum(len), vocab]`` at every position of ``seqs``, run as one extend step
    over a KV pool of their own (on the model's device; in ``pool_dtype``, default the model's,
    packed as ``kv_quant`` when given: ``mem_cache/kv_quant.py``)."""
    cfg = model.config
    device = model.embed_tokens.weight.device
    lens = [len(s) for s in seqs]
    n = sum(lens)
    kv_heads, head_dim, shared = model.kv_cache_shape()
    pool = KVPool(n + 1, cfg.num_hidden_layers, kv_heads, head_dim, pool_dtype or model.embed_tokens.weight.dtype,
                  device, shared, quant=kv_quant)
    table = torch.zeros(len(seqs), max(lens), dtype=torch.int32, device=device)
    slots = torch.arange(1, n + 1, device=device)
    lens_t = torch.tensor(lens, device=device)
    starts = torch.cumsum(lens_t, 0) - lens_t
    for i, (s, m) in enumerate(zip(starts.tolist(), lens)):
        table[i, :m] = slots[s: s + m].to(torch.int32)
    batch = ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=torch.tensor([t for s in seqs for t in s], device=device),
        positions=torch.cat([torch.arange(m, device=device) for m in lens]), out_cache_loc=slots,
        req_pool_indices=torch.arange(len(seqs), device=device), seq_lens=lens_t,
        extend_prefix_lens=torch.zeros_like(lens_t), extend_seq_lens=lens_t, extend_start_loc=starts,
        req_to_token=table, seq_lens_cpu=lens, extend_prefix_lens_cpu=[0] * len(lens), extend_seq_lens_cpu=lens)
    backend = create_attention_backend("torch_native", pool, device, layers=model.layer_attention())
    backend.init_forward_metadata(batch)
    return model(batch, backend, torch.arange(n, device=device))


def input_scales(model: nn.Module, seqs: list[list[int]], method: str, max_rows: int = 256) -> dict[str, torch.Tensor]:
    """``search_in_scale`` for every linear layer but the LM head, on its inputs (at most
    ``max_rows`` evenly spaced rows) while ``model`` (fp32, not yet quantized) runs ``seqs``."""
    found: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def run(mod: nn.Linear, args: tuple, out: torch.Tensor) -> None:
            x = args[0].reshape(-1, mod.in_features).float()
            x = x[torch.linspace(0, x.shape[0] - 1, min(max_rows, x.shape[0])).long()]
            scale = search_in_scale(method, mod.weight.detach().float(), x)
            if scale is not None:
                found[name] = scale
        return run

    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)
              and not name.endswith("lm_head") and supports(method, m.out_features, m.in_features)]  # (others: dense)
    weights = (m.weight.detach().float() for _, m in layers)
    if method != "w8a8" and all(torch.equal(fake_quantize(method, w), w) for w in weights):
        return found  # every weight on the grid (int4 from a GGUF Q4_1): the search keeps none; no forward needed
    handles = [m.register_forward_hook(hook(name)) for name, m in layers]
    try:
        teacher_forced_logits(model, seqs)
    finally:
        for h in handles:
            h.remove()
    return found


def cached_input_scales(model: nn.Module, hf_dir: str, method: str,
                        cache_root: Optional[str]) -> dict[str, torch.Tensor]:
    """``input_scales`` on the FIT texts, from ``cache_root/quant_scales/`` when computed before."""
    path = None
    if cache_root:
        path = os.path.join(cache_root, "quant_scales",
                            f"{model_fingerprint(hf_dir)}-{method}-v{CALIBRATION_VERSION}.pt")
        try:
            return torch.load(path, weights_only=True)
        except (OSError, RuntimeError, EOFError):
            pass
    t0 = time.perf_counter()
    scales = input_scales(model, encode(hf_dir, FIT), method)
    logger.info("quantization %s: input scales searched for %d layers in %.1f s", method, len(scales),
                time.perf_counter() - t0)
    if path:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            torch.save(scales, tmp)
            os.replace(tmp, path)
        except OSError as e:
            logger.warning("quantization: could not cache the input scales in %s: %s", path, e)
    return scales
