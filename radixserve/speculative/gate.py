"""Per-request auto-off: speculation pauses while its acceptance rate stays low.

``AcceptanceGate`` keeps an exponential moving average of the accepted share of proposed
tokens.  After ``warmup`` verified proposals with the average under ``threshold`` it
pauses for ``pause`` decode steps (doubling each time, up to ``max_pause``), so a request
whose text cannot be predicted pays for a few rejected proposals, then almost nothing;
one that turns predictable later (a quote after a preamble) gets speculation back.
"""
from __future__ import annotations


class AcceptanceGate:
    def __init__(self, threshold: float = 0.3, warmup: int = 4, alpha: float = 0.3, first_pause: int = 16,
                 max_pause: int = 512) -> None:
        self.threshold, self.warmup, self.alpha = threshold, warmup, alpha
        self.max_pause = max_pause
        self.pause = first_pause
        self.ema = 1.0
        self.attempts = 0
        self.paused = 0  # decode steps left without speculation

    def open(self) -> bool:
        """May this decode step speculate?  (Counts down a pause: call once per step.)"""
        if self.paused > 0:
            self.paused -= 1
            return False
        return True

    def record(self, proposed: int, accepted: int) -> None:
        """One verified proposal of ``proposed`` tokens of which ``accepted`` were kept."""
        if proposed <= 0:
            return
        rate = accepted / proposed
        self.ema = rate if self.attempts == 0 else (1 - self.alpha) * self.ema + self.alpha * rate
        self.attempts += 1
        if self.attempts >= self.warmup and self.ema < self.threshold:
            self.paused, self.pause = self.pause, min(2 * self.pause, self.max_pause)
            self.attempts = 0
