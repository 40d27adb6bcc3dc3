"""The vocabulary of audit lines: the policy verdict of a code, what happened after it, the rule a refusal names.

Pure tables and functions over error codes and close reasons, shared by the audit log and the
surfaces that count decisions (proxy, tools API). docs/reference/audit-log.md lists every value.
Never writes a line, never touches a metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.errors import ErrorCode

# Codes that are the policy's (or its budgets') verdict: the line's `decision` is `deny`.
POLICY_CODES: frozenset[str] = frozenset(
    {
        ErrorCode.UNSAFE_URL,
        ErrorCode.BLOCKED_DESTINATION,
        ErrorCode.POLICY_DENIED,
        ErrorCode.AUTH_REQUIRED,
        ErrorCode.REDIRECT_BLOCKED,
        ErrorCode.ROBOTS_DISALLOWED,
        ErrorCode.QUOTA_EXHAUSTED,
        ErrorCode.CONCURRENCY_LIMITED,
        ErrorCode.COOLDOWN,
        ErrorCode.AUDIT_UNAVAILABLE,
        ErrorCode.INVALID_RUN_TOKEN,
        "destination_mismatch",
        "protocol_unknown",
        ErrorCode.CREDENTIAL_MISUSE,
        ErrorCode.SECRET_DETECTED,
    }
)
# What happened after the verdict, by error code (anything unlisted is `error`).
_OUTCOME_BY_CODE: Mapping[str, str] = MappingProxyType(
    {
        ErrorCode.INVALID_INPUT: "invalid_request",
        ErrorCode.DNS_FAILURE: "dns_error",
        ErrorCode.CONNECT_FAILURE: "connect_error",
        ErrorCode.UPSTREAM_STATUS: "upstream_error",
        ErrorCode.RATE_LIMITED: "upstream_error",
        ErrorCode.UNAVAILABLE: "upstream_error",
        ErrorCode.CHALLENGED: "upstream_error",
        ErrorCode.UNSUPPORTED_CONTENT: "upstream_error",
        ErrorCode.TIMEOUT: "timeout",
        ErrorCode.TOO_LARGE: "too_large",
        ErrorCode.CONTENT_CHANGED: "content_changed",
        ErrorCode.STORE_UNAVAILABLE: "store_unavailable",
        ErrorCode.POLICY_CHANGED: "policy_changed",
    }
)
# Close reasons of tunnels and forwarded requests, as outcomes.
_OUTCOME_BY_CLOSE: Mapping[str, str] = MappingProxyType(
    {
        "done": "ok",
        "client_closed": "ok",
        "upstream_closed": "ok",
        "client_reset": "client_gone",
        "client_gone": "client_gone",
        "abandoned": "client_gone",
        "upstream_reset": "upstream_error",
        "idle_timeout": "timeout",
        "max_lifetime": "limit",
        "sni_denied": "denied",
        "draining": "shutdown",
        "shutdown": "shutdown",
    }
)
# The rule a refusal names when its caller knew no more precise one (docs/reference/audit-log.md):
# the check that refused, by its code.
_RULE_BY_CODE: Mapping[str, str] = MappingProxyType(
    {
        ErrorCode.AUTH_REQUIRED: "credentials",
        ErrorCode.UNSAFE_URL: "url_guard",
        ErrorCode.BLOCKED_DESTINATION: "address_guard",
        ErrorCode.POLICY_DENIED: "default_deny",
        ErrorCode.REDIRECT_BLOCKED: "redirects",
        ErrorCode.ROBOTS_DISALLOWED: "robots",
        ErrorCode.QUOTA_EXHAUSTED: "budgets",
        ErrorCode.CONCURRENCY_LIMITED: "budgets",
        ErrorCode.COOLDOWN: "budgets",
        ErrorCode.AUDIT_UNAVAILABLE: "audit_on_failure",
        ErrorCode.INVALID_RUN_TOKEN: "run_tokens",
        ErrorCode.DESTINATION_MISMATCH: "transparent.destination",
        ErrorCode.PROTOCOL_UNKNOWN: "transparent.raw_tcp",
        ErrorCode.CREDENTIAL_MISUSE: "credentials",
        ErrorCode.SECRET_DETECTED: "scan",
    }
)
OUTCOMES: frozenset[str] = frozenset(
    {"ok", "denied", "error", "limit", "shutdown", "audit_unavailable"}
    | set(_OUTCOME_BY_CODE.values())
    | set(_OUTCOME_BY_CLOSE.values())
)


def verdict_for(code: str) -> str:
    """The policy verdict of a refusal with `code`: `deny` for the policy's own codes, `none`
    for a request too malformed to be judged, `allow` when the policy let it through and
    something later failed (a 404, a DNS error, a timeout: not denials)."""
    if code in POLICY_CODES:
        return "deny"
    if code == ErrorCode.INVALID_INPUT:
        return "none"
    return "allow"


def verdict_of_failure(code: str, rule: str | None) -> str:
    """`verdict_for`, except that a failure no rule had allowed (a request head too large to
    parse, a body that never arrived) is `none`: the policy never judged it."""
    verdict = verdict_for(code)
    return "none" if verdict == "allow" and rule is None else verdict


def outcome_for_code(code: str) -> str:
    if code in POLICY_CODES:
        return "audit_unavailable" if code == ErrorCode.AUDIT_UNAVAILABLE else "denied"
    return _OUTCOME_BY_CODE.get(code, "error")


def rule_for_code(code: str) -> str | None:
    """The check a refusal with `code` comes from, when the caller could not name its rule."""
    return _RULE_BY_CODE.get(code)


def outcome_for_close(reason: str) -> str:
    outcome = _OUTCOME_BY_CLOSE.get(reason)
    if outcome is not None:
        return outcome
    return outcome_for_code(reason) if reason in _OUTCOME_BY_CODE or reason in POLICY_CODES else "error"
