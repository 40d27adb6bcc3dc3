"""An absolute deadline for one tool call: the loop time it ends at and the budget it was given.

Taken once when a call starts and handed down (robots.txt, every hop, extraction), so every step
measures against the same end instead of starting a fresh timeout of its own. Never sleeps and
never cancels anything itself: `asyncio.timeout_at(deadline.at)` at the one place that waits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError


@dataclass(frozen=True, slots=True)
class Deadline:
    at: float
    budget_s: float

    @classmethod
    def after(cls, budget_s: float) -> Deadline:
        """`budget_s` from now on the running loop's clock."""
        return cls(asyncio.get_running_loop().time() + budget_s, budget_s)

    def expired_error(self) -> GatewayError:
        return GatewayError(ErrorCode.TIMEOUT, f"the {self.budget_s:g} s deadline passed")
