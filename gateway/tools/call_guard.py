"""Permission, budget and policy-generation checks around one tool call.

Order (issue 5): the tool switch is checked when a call starts (`require_tool`, once, by the
caller, before it even parses the arguments); a reservation is taken
atomically before any network access (denials before it cost nothing); the lease is released
whatever happens (the reservation stays counted); before the result is returned the policy
generation is compared with the one the call started under, and a changed policy drops the
result with `policy_changed` even when the new policy would allow it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.budget import BudgetStore
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.policy.model import LoadedPolicy, Principal, ToolLimits

Tool = Literal["search", "fetch"]
MAX_BUDGET_ID_CHARS = 200
_BUDGET_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


@dataclass(frozen=True, slots=True)
class CallContext:
    principal: Principal
    loaded: LoadedPolicy
    run_id: str | None
    step_id: str | None


def parse_budget_id(value: str | None, header: str) -> str | None:
    """Run and step ids are opaque printable ASCII; anything else is refused, never reshaped."""
    if value is None or value == "":
        return None
    if not _BUDGET_ID.match(value):
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"{header} must be 1-{MAX_BUDGET_ID_CHARS} printable ASCII characters"
        )
    return value


def require_tool(principal: Principal, tool: Tool) -> None:
    if not getattr(principal.tools, tool):
        raise GatewayError(ErrorCode.POLICY_DENIED, f"principal {principal.name!r} may not use web_{tool}")


class ToolCalls:
    """Runs tool work under the checks above. One per process, sharing the budget store."""

    def __init__(self, store: BudgetStore, policy_source: Callable[[], LoadedPolicy]) -> None:
        self._store = store
        self._policy_source = policy_source

    async def run(
        self,
        tool: Tool,
        context: CallContext,
        work: Callable[[], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Reserve, run `work`, release, recheck the generation. `require_tool` has passed."""
        limits: ToolLimits = getattr(context.principal.budgets, tool)
        try:
            reservation = await self._store.reserve(
                principal=context.principal.name,
                tool=tool,
                run_id=context.run_id,
                step_id=context.step_id,
                limits=limits,
            )
        except GatewayError as exc:
            metrics.BUDGET_DENIALS.labels(tool=tool, code=str(exc.code)).inc()
            raise
        try:
            result = await work()
        finally:
            await self._store.release(reservation)
        self._recheck(context)
        result["budget"] = reservation.counts.to_json()
        return result

    def _recheck(self, context: CallContext) -> None:
        current = self._policy_source()
        if current.generation != context.loaded.generation:
            raise GatewayError(
                ErrorCode.POLICY_CHANGED,
                f"the policy changed (generation {context.loaded.generation} → {current.generation}) "
                "while the call ran",
            )
