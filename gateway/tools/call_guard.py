"""Permission, budget and policy-generation checks around one tool call.

Order (issue 5): the tool switch is checked when a call starts (`require_tool`, once, by the
caller, before it even parses the arguments); a reservation is taken atomically before any
network access (denials before it cost nothing), against the principal's window quotas always
and against run and step ids only when a run token vouched for them (issue 12,
`run_tokens.py`), with the token's narrower limits; the lease is released
whatever happens (the reservation stays counted); before the result is returned the policy
generation is compared with the one the call started under, and a changed policy drops the
result with `policy_changed` even when the new policy would allow it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.budget import BudgetStore
from gateway.errors import ErrorCode, GatewayError
from gateway.idle_trim import IdleTrim
from gateway.observe import metrics
from gateway.policy.model import LoadedPolicy, Principal, ToolLimits
from gateway.tools.run_tokens import NO_IDS, RunTokens, VouchedIds, parse_budget_id

__all__ = ["CallContext", "ToolCalls", "parse_budget_id", "require_tool"]

Tool = Literal["search", "fetch"]


@dataclass(frozen=True, slots=True)
class CallContext:
    principal: Principal
    loaded: LoadedPolicy
    run_id: str | None
    step_id: str | None
    # What vouched for run_id / step_id; empty (no ids) for a call without a run token.
    vouched: VouchedIds = NO_IDS


def require_tool(principal: Principal, tool: Tool) -> None:
    if not getattr(principal.tools, tool):
        raise GatewayError(
            ErrorCode.POLICY_DENIED, f"principal {principal.name!r} may not use web_{tool}", rule=f"tools.{tool}"
        )


class ToolCalls:
    """Runs tool work under the checks above. One per process, sharing the budget store."""

    def __init__(
        self,
        store: BudgetStore,
        policy_source: Callable[[], LoadedPolicy],
        run_tokens: RunTokens,
        idle_trim: IdleTrim,
    ) -> None:
        self._store = store
        self._policy_source = policy_source
        self.run_tokens = run_tokens
        self._idle_trim = idle_trim

    def context(self, principal: Principal, loaded: LoadedPolicy, headers: Mapping[str, str]) -> CallContext:
        """The call's context with only the ids a run token vouches for (see `run_tokens.py`)."""
        vouched = self.run_tokens.vouch(loaded.policy, principal, headers)
        return CallContext(principal, loaded, vouched.run_id, vouched.step_id, vouched)

    def with_meta_ids(self, context: CallContext, run_meta: str | None, step_meta: str | None) -> CallContext:
        """`context` with the run and step an MCP call's `_meta` names, if its run token allows."""
        vouched = self.run_tokens.with_meta_ids(
            context.vouched,
            parse_budget_id(run_meta, "_meta run"),
            parse_budget_id(step_meta, "_meta step"),
        )
        return CallContext(context.principal, context.loaded, vouched.run_id, vouched.step_id, vouched)

    async def run(
        self,
        tool: Tool,
        context: CallContext,
        work: Callable[[], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Reserve, run `work`, release, recheck the generation. `require_tool` has passed."""
        self._idle_trim.started()
        try:
            return await self._reserved(tool, context, work)
        finally:
            self._idle_trim.finished()

    async def _reserved(
        self, tool: Tool, context: CallContext, work: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        limits: ToolLimits = getattr(context.principal.budgets, tool)
        try:
            reservation = await self._store.reserve(
                principal=context.principal.name,
                tool=tool,
                run_id=context.run_id,
                step_id=context.step_id,
                limits=context.vouched.limits(tool, limits),
                id_ttl_s=context.vouched.id_ttl_s,
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
