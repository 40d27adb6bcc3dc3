"""Run tokens: an orchestrator's signed word that a run id (and optionally a step) is real.

Owns the compact token format and its HMAC: `egr1.<payload>.<signature>`, both base64url without
padding, the payload a JSON object of claims, the signature HMAC-SHA256 over `egr1.<payload>`
with the gateway's run token secret. A token binds the orchestrator that minted it, the
principal, the run id, an optional step id, an expiry (unix seconds) and optional per-tool limits
that can only lower the policy's. Stateless: minting stores nothing, so a hostile agent cannot
grow memory by asking for tokens, and every replica holding the same secret verifies alike.

Pure: the clock arrives as an argument; never reads a policy, a setting or a socket.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import ErrorCode, GatewayError

TOKEN_PREFIX = "egr1"  # noqa: S105 - a format tag, not a secret
MAX_TOKEN_CHARS = 2048
MIN_SECRET_BYTES = 32
# Only the id-keyed budgets can be narrowed by a token; window quotas are the principal's own.
NARROWABLE_LIMITS = ("per_run", "per_step")


@dataclass(frozen=True, slots=True)
class RunClaims:
    """What a verified run token vouches for."""

    orchestrator: str
    principal: str
    run_id: str
    expires_at: int
    step_id: str | None = None
    # tool -> {"per_run": n, "per_step": n}: ceilings under the policy's own limits.
    limits: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "o": self.orchestrator,
            "p": self.principal,
            "r": self.run_id,
            "exp": self.expires_at,
        }
        if self.step_id is not None:
            payload["s"] = self.step_id
        if self.limits:
            payload["l"] = self.limits
        return payload

    def limit(self, tool: str, name: str) -> int | None:
        return self.limits.get(tool, {}).get(name)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest()


def mint_run_token(secret: bytes, claims: RunClaims) -> str:
    payload = _b64(orjson.dumps(claims.to_payload(), option=orjson.OPT_SORT_KEYS))
    signed = f"{TOKEN_PREFIX}.{payload}"
    return f"{signed}.{_b64(_signature(secret, signed))}"


def _refused(reason: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_RUN_TOKEN, f"X-Egress-Run-Token refused: {reason}")


def _claims(payload: Any) -> RunClaims:
    if not isinstance(payload, dict):
        raise _refused("malformed claims")
    orchestrator, principal, run_id = payload.get("o"), payload.get("p"), payload.get("r")
    expires_at, step_id, limits = payload.get("exp"), payload.get("s"), payload.get("l", {})
    if not all(isinstance(value, str) and value for value in (orchestrator, principal, run_id)):
        raise _refused("malformed claims")
    if isinstance(expires_at, bool) or not isinstance(expires_at, int):
        raise _refused("malformed expiry")
    if step_id is not None and not isinstance(step_id, str):
        raise _refused("malformed step")
    if not isinstance(limits, dict) or not all(
        isinstance(per_tool, dict)
        and all(
            name in NARROWABLE_LIMITS and isinstance(value, int) and not isinstance(value, bool) and value >= 0
            for name, value in per_tool.items()
        )
        for per_tool in limits.values()
    ):
        raise _refused("malformed limits")
    return RunClaims(str(orchestrator), str(principal), str(run_id), expires_at, step_id, limits)


def verify_run_token(secret: bytes, token: str, *, now_s: float) -> RunClaims:
    """The claims of a token this secret signed and that has not expired, else `invalid_run_token`.

    The signature is checked (in constant time) before the payload is parsed, so a forged token
    never reaches the JSON parser; binding to the caller's principal is the caller's check.
    """
    if len(token) > MAX_TOKEN_CHARS:
        raise _refused(f"longer than {MAX_TOKEN_CHARS} characters")
    prefix, payload_text, signature_text = [*token.split("."), "", ""][:3]
    if prefix != TOKEN_PREFIX or not payload_text or not signature_text or token.count(".") != 2:
        raise _refused("not a run token")
    try:
        signature = _unb64(signature_text)
    except (binascii.Error, ValueError):
        raise _refused("bad signature") from None
    if not hmac.compare_digest(signature, _signature(secret, f"{prefix}.{payload_text}")):
        raise _refused("bad signature")
    try:
        claims = _claims(orjson.loads(_unb64(payload_text)))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        raise _refused("malformed claims") from None
    if claims.expires_at <= math.floor(now_s):
        raise _refused("expired")
    return claims
