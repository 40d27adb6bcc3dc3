"""Budget values: a granted reservation and remaining counts (the limits are the policy's).

Pure values only: no clock, no I/O, no store. The stores in `memory.py` and `redis.py` take a
`ToolLimits` (defined in `gateway.policy.model`) per call (every number comes from the policy,
which can reload between calls) and hand back a `Reservation` or `BudgetCounts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The limits are the policy's value (one type for the policy file and the stores); re-exported
# here because every store signature takes it.
from gateway.policy.model import ToolLimits

__all__ = ["BudgetCounts", "Reservation", "ToolLimits"]


@dataclass(frozen=True, slots=True)
class BudgetCounts:
    """Remaining step and run reservations for one tool at one moment.

    None means the call carried no vouched step (or run) id, so that budget does not apply; a
    window is None when the tool has no such window (or the count was not taken).
    """

    remaining_step: int | None
    remaining_run: int | None
    remaining_minute: int | None = None
    remaining_hour: int | None = None
    remaining_day: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The `budget` object every tool result carries (docs/parts/budgets.md).

        Always both keys: `{"step": {"remaining": 17}, "run": {"remaining": 97}}`, and a key is
        `null` when that budget does not apply (no `X-Egress-Step` / `X-Egress-Run` header).
        """
        body: dict[str, Any] = {
            "step": None if self.remaining_step is None else {"remaining": self.remaining_step},
            "run": None if self.remaining_run is None else {"remaining": self.remaining_run},
        }
        for name, value in (
            ("minute", self.remaining_minute),
            ("hour", self.remaining_hour),
            ("day", self.remaining_day),
        ):
            if value is not None:
                body[name] = {"remaining": value}
        return body


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
    # name -> remaining in that window right after this reservation.
    remaining_windows: dict[str, int] = field(default_factory=dict)

    @property
    def counts(self) -> BudgetCounts:
        return BudgetCounts(
            remaining_step=self.remaining_step,
            remaining_run=self.remaining_run,
            remaining_minute=self.remaining_windows.get("minute"),
            remaining_hour=self.remaining_windows.get("hour"),
            remaining_day=self.remaining_windows.get("day"),
        )
