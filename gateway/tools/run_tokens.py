"""Who may make a run id count: minting run tokens for orchestrators, vouching for agents' calls.

Owns the trust rule of issue 12. An agent's `X-Egress-Run` / `X-Egress-Step` headers are its own
words and count for nothing on their own; only an `X-Egress-Run-Token` minted by an orchestrator
of the policy (`POST /v1/runs`, its own bearer credential) makes a run id, and under it a step
id, key a budget. Without a token a call counts against the principal's window quotas only.
A token is refused (`invalid_run_token`) when forged, expired, minted for another principal, by
an orchestrator the policy no longer has or no longer lets mint for that principal, or when a
header contradicts it.

Never touches a store or a socket; the wall clock is read once per call (token expiry is an
absolute time shared by every replica).
"""

from __future__ import annotations

import hmac
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gateway.budget.run_token import NARROWABLE_LIMITS, RunClaims, mint_run_token, verify_run_token
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import token_digest
from gateway.policy.model import Orchestrator, Policy, Principal, ToolLimits
from gateway.settings import Settings

log = logging.getLogger("egress_gateway.run_tokens")

RUN_HEADER = "X-Egress-Run"
STEP_HEADER = "X-Egress-Step"
RUN_TOKEN_HEADER = "X-Egress-Run-Token"  # noqa: S105 - a header name
MAX_BUDGET_ID_CHARS = 200
_BUDGET_ID = re.compile(r"^[\x21-\x7e]{1,200}$")
DEFAULT_TOKEN_TTL_S = 3600
MAX_NARROWED_LIMIT = 1_000_000
TOOLS = ("search", "fetch")


def parse_budget_id(value: str | None, header: str) -> str | None:
    """Run and step ids are opaque printable ASCII; anything else is refused, never reshaped."""
    if value is None or value == "":
        return None
    if not _BUDGET_ID.match(value):
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"{header} must be 1-{MAX_BUDGET_ID_CHARS} printable ASCII characters"
        )
    return value


@dataclass(frozen=True, slots=True)
class VouchedIds:
    """The ids a call may count against, and the token that vouched for them (None: no ids)."""

    run_id: str | None = None
    step_id: str | None = None
    claims: RunClaims | None = None
    # Seconds the token has left: the ids' counters live as long, then the run is over.
    id_ttl_s: float | None = None
    # The headers as the agent sent them (syntax-checked), kept for the audit line only.
    claimed_run: str | None = None
    claimed_step: str | None = None

    def limits(self, tool: str, policy_limits: ToolLimits) -> ToolLimits:
        """The policy's limits, with per_run / per_step lowered where the token asks."""
        if self.claims is None:
            return policy_limits
        changes = {
            name: min(getattr(policy_limits, name), value)
            for name in NARROWABLE_LIMITS
            if (value := self.claims.limit(tool, name)) is not None
        }
        return replace(policy_limits, **changes) if changes else policy_limits


def run_token_secret(settings: Settings) -> bytes:
    """`EGRESS_RUN_TOKEN_SECRET`, or a random secret of this process alone.

    Replicas must share the secret to accept each other's tokens; a random one also means that
    tokens die with the process, which is safe (the run's calls are refused, never over-granted).
    """
    if settings.run_token_secret:
        return settings.run_token_secret.encode("utf-8")
    if settings.redis_url:
        log.warning("EGRESS_RUN_TOKEN_SECRET is unset: run tokens minted here are refused by other replicas")
    return secrets.token_bytes(32)


NO_IDS = VouchedIds()


def _refused(reason: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_RUN_TOKEN, f"{RUN_TOKEN_HEADER} refused: {reason}")


class RunTokens:
    """Mints and verifies run tokens with this gateway's secret (shared by its replicas)."""

    def __init__(self, secret: bytes, *, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._clock = clock

    def vouch(self, policy: Policy, principal: Principal, headers: Mapping[str, str]) -> VouchedIds:
        """The ids of one call: the token's, or none at all when the call carries no token."""
        run_header = parse_budget_id(headers.get(RUN_HEADER), RUN_HEADER)
        step_header = parse_budget_id(headers.get(STEP_HEADER), STEP_HEADER)
        token = headers.get(RUN_TOKEN_HEADER)
        if not token:
            # The agent's own headers are not evidence: the call counts against its windows only.
            return VouchedIds(claimed_run=run_header, claimed_step=step_header)
        now_s = self._clock()
        claims = verify_run_token(self._secret, token.strip(), now_s=now_s)
        if claims.principal != principal.name:
            raise _refused("minted for another principal")
        orchestrator = policy.orchestrators.get(claims.orchestrator)
        if orchestrator is None or not orchestrator.may_mint_for(principal.name):
            raise _refused("its orchestrator no longer vouches for this principal")
        if run_header is not None and run_header != claims.run_id:
            raise _refused(f"{RUN_HEADER} differs from the token's run")
        step_id = step_header
        if claims.step_id is not None:
            if step_header is not None and step_header != claims.step_id:
                raise _refused(f"{STEP_HEADER} differs from the token's step")
            step_id = claims.step_id
        return VouchedIds(claims.run_id, step_id, claims, max(1.0, claims.expires_at - now_s), run_header, step_header)

    @staticmethod
    def with_meta_ids(vouched: VouchedIds, run_meta: str | None, step_meta: str | None) -> VouchedIds:
        """Ids an MCP call names in `_meta`, under the same rule as the headers: they count only
        inside the run a token vouched for (a `_meta` run must be that run; a step may be named
        unless the token fixed it); without a token they are noted and count for nothing."""
        if vouched.claims is None:
            return replace(vouched, claimed_run=run_meta or vouched.claimed_run, claimed_step=step_meta)
        if run_meta is not None and run_meta != vouched.claims.run_id:
            raise _refused("the _meta run differs from the token's run")
        if step_meta is None:
            return vouched
        if vouched.claims.step_id is not None and step_meta != vouched.claims.step_id:
            raise _refused("the _meta step differs from the token's step")
        return replace(vouched, step_id=step_meta, claimed_step=step_meta)

    def authenticate_orchestrator(self, policy: Policy, authorization: str | None) -> Orchestrator:
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise GatewayError(ErrorCode.AUTH_REQUIRED, "minting needs 'Authorization: Bearer <orchestrator token>'")
        digest = token_digest(value.strip())
        match: Orchestrator | None = None
        # Every hash is compared so the time taken does not reveal which one matched.
        for orchestrator in policy.orchestrators.values():
            if hmac.compare_digest(orchestrator.token_sha256, digest):
                match = orchestrator
        if match is None:
            raise GatewayError(ErrorCode.AUTH_REQUIRED, "the credential is not an orchestrator's")
        return match

    def mint(self, policy: Policy, orchestrator: Orchestrator, payload: Any) -> dict[str, Any]:
        """`POST /v1/runs`: a token for {principal, run, step?, ttl_s?, limits?}."""
        if not isinstance(payload, dict):
            raise GatewayError(ErrorCode.INVALID_INPUT, "the request body must be a JSON object")
        unknown = set(payload) - {"principal", "run", "step", "ttl_s", "limits"}
        if unknown:
            raise GatewayError(ErrorCode.INVALID_INPUT, f"unknown field(s): {', '.join(sorted(unknown))}")
        principal = payload.get("principal")
        if not isinstance(principal, str) or principal not in policy.principals:
            raise GatewayError(ErrorCode.INVALID_INPUT, "principal must name a principal of the policy")
        if not orchestrator.may_mint_for(principal):
            raise GatewayError(
                ErrorCode.POLICY_DENIED, f"orchestrator {orchestrator.name!r} may not mint for {principal!r}"
            )
        run_id = _id_field(payload, "run", required=True)
        step_id = _id_field(payload, "step", required=False)
        # Without ttl_s the default, but never beyond what this orchestrator may grant: an
        # orchestrator capped under the default must not have to name a ttl to mint at all.
        ttl_s = payload.get("ttl_s", min(DEFAULT_TOKEN_TTL_S, orchestrator.max_ttl_s))
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 1 <= ttl_s <= orchestrator.max_ttl_s:
            raise GatewayError(ErrorCode.INVALID_INPUT, f"ttl_s must be 1-{orchestrator.max_ttl_s:g} seconds")
        expires_at = math.floor(self._clock() + ttl_s)
        assert run_id is not None
        claims = RunClaims(orchestrator.name, principal, run_id, expires_at, step_id, _limits(payload.get("limits")))
        return {
            "token": mint_run_token(self._secret, claims),
            "principal": principal,
            "run": run_id,
            "step": step_id,
            "expiresAt": datetime.fromtimestamp(expires_at, UTC).isoformat().replace("+00:00", "Z"),
        }


def _id_field(payload: dict[str, Any], name: str, *, required: bool) -> str | None:
    value = payload.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not _BUDGET_ID.match(value):
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"{name} must be 1-{MAX_BUDGET_ID_CHARS} printable ASCII characters"
        )
    return value


def _limits(value: Any) -> dict[str, dict[str, int]]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not set(value) <= set(TOOLS):
        raise GatewayError(ErrorCode.INVALID_INPUT, f"limits must map {' / '.join(TOOLS)} to per_run / per_step")
    out: dict[str, dict[str, int]] = {}
    for tool, per_tool in value.items():
        if not isinstance(per_tool, dict) or not set(per_tool) <= set(NARROWABLE_LIMITS):
            raise GatewayError(ErrorCode.INVALID_INPUT, f"limits.{tool} may set only {', '.join(NARROWABLE_LIMITS)}")
        for name, number in per_tool.items():
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= MAX_NARROWED_LIMIT:
                raise GatewayError(ErrorCode.INVALID_INPUT, f"limits.{tool}.{name} must be 0-{MAX_NARROWED_LIMIT}")
        out[tool] = dict(per_tool)
    return out
