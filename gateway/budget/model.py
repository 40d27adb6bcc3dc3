"""Budget values: a granted reservation and remaining counts (the limits are the policy's).

Pure values only: no clock, no I/O, no store. The stores in `memory.py` and `redis.py` take a
`ToolLimits` (defined in `gateway.policy.model`) per call (every number comes from the policy,
which can reload between calls) and hand back a `Reservation` or `BudgetCounts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The limits are the policy's value (one type for the policy file and the stores); re-exported
# here because every store signature takes it.
from gateway.policy.model import ToolLimits

__all__ = ["BudgetCounts", "Reservation", "ToolLimits"]


@dataclass(frozen=True, slots=True)
class BudgetCounts:
    """Remaining step and run reservations for one tool at one moment.

    None means the call carried no step (or run) id, so that budget does not apply.
    """

    remaining_step: int | None
    remaining_run: int | None

    def to_json(self) -> dict[str, Any]:
        """The `budget` object every tool result carries (docs/parts/budgets.md).

        Always both keys: `{"step": {"remaining": 17}, "run": {"remaining": 97}}`, and a key is
        `null` when that budget does not apply (no `X-Egress-Step` / `X-Egress-Run` header).
        """
        return {
            "step": None if self.remaining_step is None else {"remaining": self.remaining_step},
            "run": None if self.remaining_run is None else {"remaining": self.remaining_run},
        }


@dataclass(frozen=True, slots=True)
class Reservation:
    """One granted reservation: counted against step and run, holding one concurrency lease.

    The remaining counts are those right after this reservation was taken.
    """

    principal: str
    tool: str
    run_id: str | None
    step_id: str | None
    lease_id: str
    remaining_step: int | None
    remaining_run: int | None

    @property
    def counts(self) -> BudgetCounts:
        return BudgetCounts(remaining_step=self.remaining_step, remaining_run=self.remaining_run)
