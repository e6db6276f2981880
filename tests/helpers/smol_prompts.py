"""The SmolLM2 prompts that the real-weights tests share (tests/core/test_smollm2.py,
test_speculative_smollm2.py, test_tp.py): RAG-style chat questions over a system prompt of
documents, and plain-text continuations."""
from __future__ import annotations

from typing import Any

SYSTEM = ("<|im_start|>system\nYou are a meticulous assistant. Answer briefly and cite the documents you "
          "were given. Documents: (1) The Eiffel Tower is in Paris and was finished in 1889. (2) The Golden "
          "Gate Bridge opened in 1937 in San Francisco. (3) Mount Everest is 8,849 metres high.<|im_end|>\n")
QUESTIONS = ["When was the Eiffel Tower finished?", "How tall is Everest?", "Where is the Golden Gate Bridge?",
             "Which document mentions 1937?"]
OTHERS = ["The quick brown fox", "def quicksort(arr):\n", "In 1492, Columbus",
          "Photosynthesis is the process by which plants"]


def chat_prompt(question: str) -> str:
    """``question`` asked of the assistant after ``SYSTEM``, in SmolLM2's chat format."""
    return SYSTEM + f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def core_prompts(tok: Any) -> list[list[int]]:
    """Token ids (by ``tok``) of every chat question, then of every plain-text prompt."""
    return [tok.encode(chat_prompt(q)) for q in QUESTIONS] + [tok.encode(t) for t in OTHERS]
