"""The gateway's error taxonomy (DESIGN.md section 5).

One exception type, `GatewayError`, carries a stable code; each code knows its HTTP status and
whether a caller may retry. I/O edges translate OSError, ssl.SSLError and TimeoutError into it, so
nothing else ever reaches a client. Messages are one line and never carry a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal


class ErrorCode(StrEnum):
    INVALID_INPUT = "invalid_input"
    UNSAFE_URL = "unsafe_url"
    BLOCKED_DESTINATION = "blocked_destination"
    POLICY_DENIED = "policy_denied"
    AUTH_REQUIRED = "auth_required"
    DNS_FAILURE = "dns_failure"
    CONNECT_FAILURE = "connect_failure"
    REDIRECT_BLOCKED = "redirect_blocked"
    TOO_LARGE = "too_large"
    UNSUPPORTED_CONTENT = "unsupported_content"
    CHALLENGED = "challenged"
    ROBOTS_DISALLOWED = "robots_disallowed"
    UPSTREAM_STATUS = "upstream_status"
    TIMEOUT = "timeout"
    CONTENT_CHANGED = "content_changed"
    QUOTA_EXHAUSTED = "quota_exhausted"
    CONCURRENCY_LIMITED = "concurrency_limited"
    COOLDOWN = "cooldown"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    STORE_UNAVAILABLE = "store_unavailable"
    POLICY_CHANGED = "policy_changed"
    INVALID_RUN_TOKEN = "invalid_run_token"  # noqa: S105 - an error code
    DESTINATION_MISMATCH = "destination_mismatch"
    PROTOCOL_UNKNOWN = "protocol_unknown"
    AUDIT_UNAVAILABLE = "audit_unavailable"
    # A credential placeholder (or a held secret's real value) outside its binding: an
    # exfiltration attempt by definition (issue 26).
    CREDENTIAL_MISUSE = "credential_misuse"
    # The outbound scanner found a secret-shaped token and its tier's action is `deny`.
    SECRET_DETECTED = "secret_detected"  # noqa: S105 - an error code
    # Issue 25: an inspected request whose Host or absolute authority is not the TLS name (fronting).
    HOST_MISMATCH = "host_mismatch"
    # Issue 25: an inspected host asked for a protocol interception does not speak (h2-only ALPN).
    INSPECTION_UNSUPPORTED = "inspection_unsupported"
    # Issue 25: the agent refused the gateway's certificate for an inspected host (CA not trusted).
    TLS_UNTRUSTED = "tls_untrusted"


HTTP_STATUS: Mapping[ErrorCode, int] = MappingProxyType(
    {
        ErrorCode.INVALID_INPUT: 400,
        ErrorCode.UNSAFE_URL: 400,
        ErrorCode.BLOCKED_DESTINATION: 403,
        ErrorCode.POLICY_DENIED: 403,
        ErrorCode.AUTH_REQUIRED: 407,
        ErrorCode.DNS_FAILURE: 502,
        ErrorCode.CONNECT_FAILURE: 502,
        ErrorCode.REDIRECT_BLOCKED: 403,
        ErrorCode.TOO_LARGE: 502,
        ErrorCode.UNSUPPORTED_CONTENT: 415,
        ErrorCode.CHALLENGED: 403,
        ErrorCode.ROBOTS_DISALLOWED: 403,
        ErrorCode.UPSTREAM_STATUS: 502,
        ErrorCode.TIMEOUT: 504,
        ErrorCode.CONTENT_CHANGED: 409,
        ErrorCode.QUOTA_EXHAUSTED: 429,
        ErrorCode.CONCURRENCY_LIMITED: 429,
        ErrorCode.COOLDOWN: 429,
        ErrorCode.RATE_LIMITED: 503,
        ErrorCode.UNAVAILABLE: 503,
        ErrorCode.STORE_UNAVAILABLE: 503,
        ErrorCode.POLICY_CHANGED: 409,
        ErrorCode.INVALID_RUN_TOKEN: 403,
        ErrorCode.DESTINATION_MISMATCH: 403,
        ErrorCode.PROTOCOL_UNKNOWN: 403,
        ErrorCode.AUDIT_UNAVAILABLE: 503,
        ErrorCode.CREDENTIAL_MISUSE: 403,
        ErrorCode.SECRET_DETECTED: 403,
        ErrorCode.HOST_MISMATCH: 400,
        ErrorCode.INSPECTION_UNSUPPORTED: 501,
        ErrorCode.TLS_UNTRUSTED: 502,
    }
)

# A retry can succeed without the caller changing anything.
RETRYABLE: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.DNS_FAILURE,
        ErrorCode.CONNECT_FAILURE,
        ErrorCode.TIMEOUT,
        ErrorCode.CONCURRENCY_LIMITED,
        ErrorCode.COOLDOWN,
        ErrorCode.RATE_LIMITED,
        ErrorCode.UNAVAILABLE,
        ErrorCode.STORE_UNAVAILABLE,
        ErrorCode.POLICY_CHANGED,
        ErrorCode.UPSTREAM_STATUS,
        ErrorCode.AUDIT_UNAVAILABLE,
    }
)

# Where an error is answered: the tools API (a caller passed an argument) or the proxy (an agent
# asked for a destination). The two differ only where clients read the status differently.
Surface = Literal["api", "proxy"]
# On the proxy every refused destination is 403: clients (pip, git, curl) treat 403 as final,
# while a 400 reads as "your proxy client is broken". The API keeps 400 for a bad URL argument.
PROXY_DENIAL_CODES = frozenset({ErrorCode.UNSAFE_URL, ErrorCode.BLOCKED_DESTINATION, ErrorCode.POLICY_DENIED})


def status_for(code: ErrorCode, surface: Surface) -> int:
    """The HTTP status `code` is answered with on `surface` (the one table for both listeners)."""
    if code == ErrorCode.AUTH_REQUIRED:
        return 407 if surface == "proxy" else 401
    if surface == "proxy" and code in PROXY_DENIAL_CODES:
        return 403
    return HTTP_STATUS[code]


# Origin statuses worth retrying (besides 5xx): request timeout, too early, too many requests.
RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 425, 429})

MAX_MESSAGE_CHARS = 500
# Fields of the error body that an `extra` decoded from another process may not replace.
WIRE_RESERVED_FIELDS = frozenset({"code", "message", "retryable"})


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Collapse whitespace so a reason always fits one log or header line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class GatewayError(Exception):
    """The only error the gateway raises across a module boundary."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        extra: dict[str, Any] | None = None,
        permanent: bool = False,
        rule: str | None = None,
        rule_pattern: str | None = None,
    ) -> None:
        self.code = ErrorCode(code)
        self.message = one_line(message)
        # A more precise status than the code's own (431 for an oversized request head).
        self.status_override = status
        self.retry_after_s = retry_after_s
        self.extra = extra or {}
        # Set where the failure is known to repeat (a certificate the gateway does not trust):
        # decided by the I/O boundary from the exception's type, never from the message text.
        self.permanent = permanent
        # The policy rule that refused (`deny_domains[0]`, `*.example.com`): for the audit line
        # only, never in the response body (an agent is not told the policy's layout).
        self.rule = rule
        self.rule_pattern = rule_pattern
        # The addresses a refused name resolved to (`check` prints them), never in a body.
        self.addresses: tuple[str, ...] = ()
        # The (host, port) a refusal is about, set by the egress core that decided it: the proxy's
        # status line names it, since a status line is all some clients print.
        self.destination: tuple[str, int] | None = None
        super().__init__(f"{code}: {self.message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles its args (the one formatted string): rebuild from the fields instead,
        # so an extraction worker can hand a GatewayError back across the process boundary.
        options = {
            "status": self.status_override,
            "retry_after_s": self.retry_after_s,
            "extra": self.extra,
            "permanent": self.permanent,
            "rule": self.rule,
            "rule_pattern": self.rule_pattern,
        }
        return (_rebuild, (self.code, self.message, options))

    def to_wire(self) -> dict[str, Any]:
        """Every field as plain JSON, for a process boundary (the extraction workers answer so)."""
        return {
            "code": str(self.code),
            "message": self.message,
            "status": self.status_override,
            "retry_after_s": self.retry_after_s,
            "extra": self.extra,
            "permanent": self.permanent,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> GatewayError:
        """Rebuild from `to_wire` output sent by a process that parses hostile input: every field
        is checked, and `extra` keeps only scalar fields that cannot shadow the error body's own.
        Raises ValueError (or KeyError, TypeError) on anything malformed."""
        status, retry_after_s, extra = data["status"], data["retry_after_s"], data["extra"]
        if status is not None and (type(status) is not int or not 100 <= status <= 599):
            raise ValueError("status out of range")
        if retry_after_s is not None and (type(retry_after_s) not in (int, float) or retry_after_s < 0):
            raise ValueError("retry_after_s must be a non-negative number")
        if not isinstance(extra, dict) or type(data["permanent"]) is not bool:
            raise TypeError("malformed error fields")
        scalars = {
            str(key): value
            for key, value in extra.items()
            if key not in WIRE_RESERVED_FIELDS and (value is None or type(value) in (str, int, float, bool))
        }
        return cls(
            ErrorCode(data["code"]),
            str(data["message"]),
            status=status,
            retry_after_s=None if retry_after_s is None else float(retry_after_s),
            extra=scalars,
            permanent=data["permanent"],
        )

    def status_on(self, surface: Surface) -> int:
        # A credential refusal is the surface's own challenge (401 or 407) whatever was asked for.
        if self.status_override is not None and self.code != ErrorCode.AUTH_REQUIRED:
            return self.status_override
        return status_for(self.code, surface)

    @property
    def retryable(self) -> bool:
        """True only when the same call can succeed later: an origin's 404 or a certificate the
        gateway does not trust fails the same way every time."""
        if self.code == ErrorCode.UPSTREAM_STATUS:
            status = self.extra.get("status")
            return not isinstance(status, int) or status >= 500 or status in RETRYABLE_STATUSES
        if self.permanent:
            return False
        return self.code in RETRYABLE

    def to_body(self) -> dict[str, Any]:
        """The JSON error body of DESIGN.md section 3, plus any code-specific fields."""
        error: dict[str, Any] = {
            "code": str(self.code),
            "message": self.message,
            "retryable": self.retryable,
        }
        error.update(self.extra)
        return {"error": error}


def _rebuild(code: ErrorCode, message: str, options: dict[str, Any]) -> GatewayError:
    return GatewayError(code, message, **options)
