"""Budget values: the limits a policy sets for one tool, a granted reservation, remaining counts.

Pure values only: no clock, no I/O, no store. The stores in `memory.py` and `redis.py` take a
`ToolLimits` per call (every number comes from the policy, which can reload between calls) and
hand back a `Reservation` or `BudgetCounts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SEARCH_TOOL = "search"
FETCH_TOOL = "fetch"
DEFAULT_LEASE_TTL_S = 45.0


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Budget limits for one tool of one principal.

    `per_step` and `per_run` bound reservations (attempts, not successes) within one
    `X-Egress-Step` and one `X-Egress-Run`; `concurrent` bounds unexpired leases;
    `min_interval_s` is the minimum time between two starts (0 means none); a lease that is never
    released (a crashed worker) frees its slot after `lease_ttl_s`.
    """

    per_step: int
    per_run: int
    concurrent: int
    min_interval_s: float
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S

    def __post_init__(self) -> None:
        # A negative or NaN limit would silently turn a check off; refuse it when the policy loads.
        for name in ("per_step", "per_run", "concurrent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not math.isfinite(self.min_interval_s) or self.min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {self.min_interval_s!r}")
        if not math.isfinite(self.lease_ttl_s) or self.lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {self.lease_ttl_s!r}")

    @classmethod
    def search_defaults(cls) -> ToolLimits:
        """Issue 5's defaults for web_search: 20 per step, 100 per run, 1 active, 2 s apart."""
        return cls(per_step=20, per_run=100, concurrent=1, min_interval_s=2.0)

    @classmethod
    def fetch_defaults(cls) -> ToolLimits:
        """Issue 5's defaults for web_fetch: 40 per step, 200 per run, 3 active, no interval."""
        return cls(per_step=40, per_run=200, concurrent=3, min_interval_s=0.0)

    @classmethod
    def defaults_for(cls, tool: str) -> ToolLimits:
        if tool == SEARCH_TOOL:
            return cls.search_defaults()
        if tool == FETCH_TOOL:
            return cls.fetch_defaults()
        raise ValueError(f"no default budget for tool {tool!r}")


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
