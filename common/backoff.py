"""One backoff value for every retry loop: reconnects, capture, the apply's retries.

``delay(attempt, rand)`` is the wait before attempt number ``attempt`` (1-based):
``min(max_s, initial_s * multiplier ** (attempt - 1))``, spread by ``jitter``
(a fraction: 0.2 gives ±20 %) with ``rand`` in [0, 1) so callers and tests choose
the randomness.  Frozen and validated once; errors name the field.
"""

from __future__ import annotations

import dataclasses
import random

__all__ = ["Backoff"]


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Jittered, capped exponential backoff."""

    initial_s: float = 0.2
    max_s: float = 15.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s:
            raise ValueError("need 0 < initial_s <= max_s")
        if self.multiplier < 1:
            raise ValueError("multiplier must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")

    def delay(self, attempt: int, rand: float | None = None) -> float:
        """Seconds to wait before attempt number ``attempt`` (1-based)."""
        base = min(self.max_s, self.initial_s * self.multiplier ** max(0, attempt - 1))
        r = random.random() if rand is None else rand
        return base * (1 - self.jitter + 2 * self.jitter * r)
