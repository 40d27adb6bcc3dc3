"""Pure pieces of the proxy's HTTP/1.1 handling: credentials, CONNECT authorities, header rewriting.

The listener parses bytes with httptools (llhttp in strict mode: it already refuses conflicting
Content-Length and Transfer-Encoding, duplicate Content-Length, obs-fold, bare CR/LF, NUL and
invalid methods); this module holds what is left once a head is parsed, as functions on values so
they are table-tested without a loop. Never opens a socket, never decides policy.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import httptools
import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.vet.urls import VettedHost, vet_host

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_URL_BYTES = 8 * 1024
PROXY_REALM = b'Basic realm="egress-gateway"'

# RFC 9110 section 7.6.1: connection-specific fields a proxy must not forward; `Proxy-*` are
# ours (the credential is never forwarded) and Transfer-Encoding is re-framed by the proxy.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
# The fields that frame a message body (RFC 9112 section 6). They are never hop-by-hop: a
# Connection field naming one would have the proxy strip it after the body was framed by it, so
# the next hop reads the body as another message (request smuggling). Such a message is refused.
FRAMING_FIELDS = frozenset({b"content-length", b"transfer-encoding"})

# tchar (RFC 9110 section 5.6.2): a `Proxy-*` name is `proxy-` and any token. For the patterns
# that cut the lines of note out of a head llhttp accepted (`request_head`, `response_fields`).
TOKEN_CHARS = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]"


def any_case(name: bytes) -> bytes:
    """A pattern for `name` in any letter case: explicit classes, not re.IGNORECASE, which sre
    scans far slower."""
    return b"".join(
        b"[%c%c]" % (char, char - _UPPER_CASE_OFFSET) if _LOWER_A <= char <= _LOWER_Z else re.escape(bytes([char]))
        for char in name
    )


_LOWER_A, _LOWER_Z = ord("a"), ord("z")
_UPPER_CASE_OFFSET = ord("a") - ord("A")


# A field named `close`: `Connection: close` makes it hop-by-hop too (RFC 9110 section 7.6.1), so
# a head with both is read line by line. Clients and origins almost never send one.
CLOSE_FIELD = re.compile(rb"\r\n" + any_case(b"close") + b":")


@dataclass(frozen=True, slots=True)
class Credential:
    user: str | None
    token: str | None


NO_CREDENTIAL = Credential(None, None)


def _auth_error(message: str) -> GatewayError:
    return GatewayError(ErrorCode.AUTH_REQUIRED, message)


def parse_proxy_authorization(value: bytes | None) -> Credential:
    """`Basic base64(user:token)` or `Bearer token`; anything else is a wrong credential.

    Messages never quote the value: it is a secret even when it is malformed.
    """
    if value is None:
        return NO_CREDENTIAL
    scheme, _, rest = value.strip().partition(b" ")
    rest = rest.strip()
    lowered = scheme.lower()
    if lowered == b"bearer" and rest:
        try:
            return Credential(None, rest.decode("ascii"))
        except UnicodeDecodeError:
            raise _auth_error("the Bearer credential is not ASCII") from None
    if lowered == b"basic" and rest:
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise _auth_error("the Basic credential is not valid base64 of UTF-8") from None
        user, sep, token = decoded.partition(":")
        if not sep or not token:
            raise _auth_error("the Basic credential has no token (user:token)")
        return Credential(user or None, token)
    raise _auth_error("Proxy-Authorization must be Basic or Bearer")


@dataclass(frozen=True, slots=True)
class Authority:
    host: VettedHost
    port: int


def parse_connect_authority(raw: bytes, vet: Callable[[str], VettedHost] = vet_host) -> Authority:
    """RFC 9110 section 9.3.6 authority-form `host:port`: IPv6 bracketed, port required.

    `vet` canonicalises the host (`vet_host`, or a cache in front of it).
    """
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise GatewayError(ErrorCode.INVALID_INPUT, "the CONNECT target is not ASCII") from None
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise GatewayError(ErrorCode.INVALID_INPUT, "CONNECT needs host:port")
    if not port_text.isdigit() or len(port_text) > 5 or not 1 <= int(port_text) <= 65535:
        raise GatewayError(ErrorCode.INVALID_INPUT, "CONNECT port must be 1-65535")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise GatewayError(ErrorCode.INVALID_INPUT, "an IPv6 CONNECT host must be bracketed")
    return Authority(vet(host), int(port_text))


@dataclass(frozen=True, slots=True)
class AbsoluteTarget:
    """An absolute-form request target split into what the upstream request needs."""

    raw_host: bytes
    port: int
    origin_form: bytes


def split_absolute_target(raw: bytes) -> AbsoluteTarget:
    """Split `http://host[:port]/path?query` (RFC 9112 section 3.2.2) with llhttp's URL parser.

    The host is returned raw; the caller vets it with `vet_host` (the same canonicalisation the
    rest of the gateway uses). Userinfo is refused, the fragment dropped, https refused (an
    https URL goes through CONNECT so the client keeps end-to-end TLS). A target that cannot be
    read is `invalid_input` (400); a readable one the gateway refuses is `unsafe_url` (403).
    """
    if raw.startswith(b"/") or raw == b"*":
        raise GatewayError(
            ErrorCode.INVALID_INPUT, "this is a forward proxy: send an absolute URI (http://host/path) or CONNECT"
        )
    if len(raw) > MAX_URL_BYTES:
        raise GatewayError(ErrorCode.UNSAFE_URL, f"the request target is longer than {MAX_URL_BYTES} bytes")
    try:
        parsed = httptools.parse_url(raw)
    except httptools.HttpParserInvalidURLError:
        raise GatewayError(ErrorCode.INVALID_INPUT, "the request target is not a valid absolute URI") from None
    scheme = (parsed.schema or b"").lower()
    if scheme != b"http":
        if scheme == b"https":
            raise GatewayError(ErrorCode.UNSAFE_URL, "https URLs go through CONNECT, not plain forwarding")
        raise GatewayError(ErrorCode.UNSAFE_URL, "the request target scheme is not http")
    if parsed.userinfo is not None:
        raise GatewayError(ErrorCode.UNSAFE_URL, "URLs with userinfo (user:password@) are refused")
    host = parsed.host
    if not host:
        raise GatewayError(ErrorCode.INVALID_INPUT, "the request target has no host")
    port = parsed.port if parsed.port is not None else 80
    if not 1 <= port <= 65535:
        raise GatewayError(ErrorCode.UNSAFE_URL, "the request target port is out of range")
    bracketed = b"[" + host + b"]" if b":" in host else host
    path = parsed.path or b"/"
    origin_form = path + b"?" + parsed.query if parsed.query is not None else path
    return AbsoluteTarget(bracketed, port, origin_form)


def host_authority(host: VettedHost, port: int) -> bytes:
    """The Host header for the upstream: the canonical (IDNA, lower-case) name, never the raw one."""
    name = host.name.encode("ascii")
    if host.ip is not None and host.ip.version == 6:
        name = b"[" + name + b"]"
    return name if port == 80 else name + b":%d" % port


def connection_tokens(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Header names the Connection field declares hop-by-hop."""
    return named_by_connection([value for name, value in headers if name.lower() == b"connection"])


NOTHING_NAMED: frozenset[bytes] = frozenset()


def named_by_connection(values: list[bytes]) -> frozenset[bytes]:
    """Header names listed by these Connection field values (lower-cased); a listener's
    `head_memos.HeadMemos` remembers the answer for a short value."""
    if not values:
        return NOTHING_NAMED
    tokens: set[bytes] = set()
    for value in values:
        tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(tokens)


def proxy_status(error: GatewayError) -> int:
    """The status the proxy answers `error` with (`errors.status_for`, the table both listeners share)."""
    return error.status_on("proxy")


def refusal_subject(error: GatewayError, default_port: int | None) -> str:
    """The destination a refusal is about, for its status line and body: `github.com`, or
    `github.com:8443` when the port is not the request's default; "" when none was decided."""
    if error.destination is None:
        return ""
    host, port = error.destination
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"


def refusal_hint(error: GatewayError) -> str:
    """What the agent or its operator can change to get past the refusal."""
    if error.code == ErrorCode.DNS_FAILURE and error.retryable:
        # SERVFAIL, REFUSED, a timeout: the name may well exist.
        return (
            "the DNS lookup failed, not the name: retry later, or ask the operator to check the gateway's nameservers"
        )
    return CHANGE_HINTS.get(error.code, DEFAULT_HINT)


def refusal_body(error: GatewayError, subject: str) -> bytes:
    """The proxy's refusal body: one readable line as the top-level `error` and `message`, the
    structured object of DESIGN.md section 3 beside it as `egress`.

    npm prints the body's `error` field as text (an object came out as `[object Object]`) and
    other clients print `message`; agents read `egress.code`. The /v1 API keeps its own shape.
    """
    structured = error.to_body()["error"]
    hint = refusal_hint(error)
    structured["hint"] = hint
    if subject:
        structured["destination"] = subject
    line = f"{error.code}: {error.message} ({hint})"
    return orjson.dumps({"error": line, "message": line, "egress": structured})


def error_response(
    error: GatewayError, *, keep_alive: bool, conn: object = None, default_port: int | None = None
) -> bytes:
    """A refusal: status line naming the code and the destination, X-Egress-Code, the body of
    `refusal_body`; never a credential.

    `conn` is the connection's audit id, echoed as X-Egress-Id so a client can quote it;
    `default_port` the request's own (443 for CONNECT, 80 for plain HTTP), left out of the line."""
    status = proxy_status(error)
    code = str(error.code).encode("ascii")
    subject = refusal_subject(error, default_port)
    body = refusal_body(error, subject)
    # pip, apt and curl -v print only the status line: it carries the code and the destination
    # (a vetted IDNA name or an IP, so nothing a client could inject). Never a rule name.
    about = b" " + subject.encode("ascii") if subject else b""
    lines = [
        b"HTTP/1.1 %d %s (egress: %s%s)\r\n" % (status, REASONS.get(status, b"Error"), code, about),
        b"X-Egress-Code: " + code + b"\r\n",
        b"Content-Type: application/json\r\n",
        b"Content-Length: %d\r\n" % len(body),
    ]
    if isinstance(conn, str):
        lines.append(b"X-Egress-Id: " + conn.encode("ascii") + b"\r\n")
    if status == 407:
        lines.append(b"Proxy-Authenticate: " + PROXY_REALM + b"\r\n")
    if error.retry_after_s is not None:
        lines.append(b"Retry-After: %d\r\n" % max(1, round(error.retry_after_s)))
    lines.append(b"Connection: keep-alive\r\n\r\n" if keep_alive else b"Connection: close\r\n\r\n")
    return b"".join(lines) + body


REASONS: Mapping[int, bytes] = MappingProxyType(
    {
        400: b"Bad Request",
        403: b"Forbidden",
        407: b"Proxy Authentication Required",
        409: b"Conflict",
        415: b"Unsupported Media Type",
        429: b"Too Many Requests",
        431: b"Request Header Fields Too Large",
        502: b"Bad Gateway",
        503: b"Service Unavailable",
        504: b"Gateway Timeout",
    }
)

# What the agent or its operator can change to get past each refusal (the body's `hint`).
DEFAULT_HINT = "see the message; the gateway's audit log has the decision"
CHANGE_HINTS: Mapping[ErrorCode, str] = MappingProxyType(
    {
        ErrorCode.POLICY_DENIED: "this principal may not reach that host or port: ask the operator to add it to "
        "the principal's egress.allow_domains (or defaults.ports) in the gateway policy",
        ErrorCode.BLOCKED_DESTINATION: "the host resolves to a denied address range; only the policy's "
        "defaults.allow_cidrs or an internal_hosts entry can allow it",
        ErrorCode.UNSAFE_URL: "use a host name instead of an IP literal, no userinfo, and CONNECT for https",
        ErrorCode.AUTH_REQUIRED: "send Proxy-Authorization: Basic base64(principal:token) or Bearer token",
        ErrorCode.INVALID_INPUT: "send a well-formed HTTP/1.1 request with an absolute URI, or CONNECT host:port",
        ErrorCode.TOO_LARGE: "the message passed a size cap (the message names it); send or fetch less",
        ErrorCode.CONCURRENCY_LIMITED: "too many open tunnels: close some, or retry after Retry-After",
        ErrorCode.DNS_FAILURE: "the name does not exist or has no address: check the host name",
        ErrorCode.CONNECT_FAILURE: "the origin refused, reset or answered badly; retry later or check the origin",
        ErrorCode.TIMEOUT: "the origin was too slow; retry, or ask the operator about the proxy timeouts",
    }
)
