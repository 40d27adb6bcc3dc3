"""Parse, normalise and vet a URL or a host before anything is resolved.

Parsing uses yarl, the parser aiohttp connects with, so the host we vet is the host we reach.
Every spelling a resolver or `inet_aton` would read as an IPv4 literal (decimal, octal, hex,
short and mixed forms) is recognised as one; overflowing forms are refused, never wrapped.
Internal and metadata names are refused here, before any lookup.

Pure: never resolves a name, never opens a socket.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from dataclasses import dataclass
from types import MappingProxyType

import idna
import yarl

from gateway.errors import ErrorCode, GatewayError
from gateway.vet.addresses import IPAddress

MAX_URL_CHARS = 4096
MAX_HOST_CHARS = 253
ALLOWED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = MappingProxyType({"http": 80, "https": 443})

# Query parameters that carry credentials or signatures: a URL holding one is a secret, and
# fetching it would leak it into logs, caches and the page the agent reads back.
SECRET_QUERY_PARAMS = frozenset(
    {
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
        "sig",
        "signature",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth",
        "auth_token",
        "api_key",
        "apikey",
        "api-key",
        "key",
        "password",
        "passwd",
        "pwd",
        "secret",
        "client_secret",
        "private_token",
        "sessionid",
        "jwt",
    }
)

REFUSED_NAMES = frozenset(
    {"localhost", "metadata", "metadata.goog", "instance-data", "kubernetes.default", "kubernetes.default.svc"}
)
REFUSED_SUFFIXES = (
    ".localhost",
    ".local",
    ".localdomain",
    ".internal",
    ".home.arpa",
    ".svc",
    ".cluster.local",
    ".svc.cluster.local",
)

_NUMERIC_LABEL = re.compile(r"^(0[xX][0-9a-fA-F]*|[0-9]+)$")
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x20\x7f\\\s\u0085\u00a0\u1680\u2000-\u200f\u2028-\u202f\u205f\u3000\ufeff]")
_HOST_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")


@dataclass(frozen=True, slots=True)
class VettedHost:
    """A host in canonical form: an IDNA A-label name or an IP address."""

    name: str
    ip: IPAddress | None
    # Set (to why) for a name under an internal suffix (`*.svc`, `*.cluster.local`...) kept by
    # `vet_host(..., keep_internal=True)`: only a principal's exact `internal_hosts` entry may
    # reach it (`policy.decide.decide_form`); every other use refuses it.
    internal: str | None = None


@dataclass(frozen=True, slots=True)
class VettedUrl:
    url: str
    scheme: str
    host: VettedHost
    port: int
    target: str

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.authority}"

    @property
    def authority(self) -> str:
        host = f"[{self.host.name}]" if self.host.ip is not None and self.host.ip.version == 6 else self.host.name
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


def _unsafe(message: str) -> GatewayError:
    return GatewayError(ErrorCode.UNSAFE_URL, message)


def _parse_ipv4_part(part: str) -> int:
    lowered = part.lower()
    if lowered.startswith("0x"):
        return int(lowered[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        if not all(c in "01234567" for c in part):
            raise ValueError("bad octal digit")
        return int(part, 8)
    return int(part, 10)


def parse_legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """Read `host` the way inet_aton and the WHATWG URL parser would.

    Returns None when the host is a name. A host whose last label is numeric is an IPv4 attempt
    (WHATWG "ends in a number"); if it does not parse or overflows it is refused, so that
    `7147006462` never wraps to 127.0.0.1 in some resolver down the line.
    """
    parts = host.split(".")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts = parts[:-1]
    if not parts or not _NUMERIC_LABEL.match(parts[-1]):
        return None
    if len(parts) > 4 or not all(_NUMERIC_LABEL.match(p) for p in parts):
        raise _unsafe(f"host {host!r} ends in a number but is not a valid IPv4 literal")
    try:
        values = [_parse_ipv4_part(p) for p in parts]
    except ValueError:
        raise _unsafe(f"host {host!r} is a malformed IPv4 literal") from None
    last_limit = 256 ** (5 - len(values))
    if any(v > 255 for v in values[:-1]) or values[-1] >= last_limit:
        raise _unsafe(f"host {host!r} is an overflowing IPv4 literal")
    number = values[-1]
    for index, value in enumerate(values[:-1]):
        number += value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def refused_name_reason(name: str) -> str | None:
    """Why a name is internal by construction, or None."""
    if name in REFUSED_NAMES:
        return f"{name!r} is an internal or metadata name"
    for suffix in REFUSED_SUFFIXES:
        if name.endswith(suffix):
            return f"{name!r} is under {suffix}, an internal namespace"
    if "." not in name:
        return f"{name!r} is a single-label name (resolved by search domains, never public)"
    return None


def _parse_ipv6(text: str) -> ipaddress.IPv6Address:
    # A zone id names an interface on this host: link-local by definition. Keep the address,
    # drop the zone, and let the address guard classify it.
    bare = text.split("%", 1)[0]
    try:
        return ipaddress.IPv6Address(bare)
    except ValueError:
        raise _unsafe(f"host [{text}] is not a valid IPv6 literal") from None


def internal_suffix_reason(name: str) -> str | None:
    """Why a multi-label name is under an internal suffix (an in-cluster name), or None."""
    for suffix in REFUSED_SUFFIXES:
        if name.endswith(suffix) and name not in REFUSED_NAMES:
            return f"{name!r} is under {suffix}, an internal namespace"
    return None


def vet_host(raw_host: str, *, keep_internal: bool = False) -> VettedHost:
    """Canonicalise a host (name or literal) or refuse it with `unsafe_url`.

    With `keep_internal`, a name under an internal suffix is returned marked (`internal`) instead
    of refused, for the policy to allow only where a principal names it in `internal_hosts`;
    internal names by themselves (`localhost`, `metadata`, single labels) are refused anyway."""
    if not raw_host:
        raise _unsafe("the URL has no host")
    if _FORBIDDEN_CHARS.search(raw_host) or any(c in raw_host for c in "@/?#"):
        raise _unsafe("the host holds whitespace, control characters or URL delimiters")
    if raw_host.startswith("["):
        if not raw_host.endswith("]"):
            raise _unsafe("unterminated IPv6 literal")
        ip6 = _parse_ipv6(raw_host[1:-1])
        return VettedHost(ip6.compressed, ip6)
    if ":" in raw_host:
        ip6 = _parse_ipv6(raw_host)
        return VettedHost(ip6.compressed, ip6)
    if "%" in raw_host:
        raise _unsafe("percent-encoded hosts are refused")
    host = raw_host[:-1] if raw_host.endswith(".") else raw_host
    if not host or ".." in host or host.startswith("."):
        raise _unsafe(f"host {raw_host!r} has an empty label")
    ip4 = parse_legacy_ipv4(host.lower())
    if ip4 is not None:
        return VettedHost(str(ip4), ip4)
    try:
        ascii_name = idna.encode(host, uts46=True, transitional=False).decode("ascii").lower()
    except (idna.IDNAError, UnicodeError, ValueError):
        raise _unsafe(f"host {raw_host!r} is not a valid internationalised name") from None
    if len(ascii_name) > MAX_HOST_CHARS or not all(_HOST_LABEL.match(lbl) for lbl in ascii_name.split(".")):
        raise _unsafe(f"host {raw_host!r} is not a valid DNS name")
    # UTS #46 mapping can turn fullwidth digits and dots into an IPv4 form: check again.
    ip4 = parse_legacy_ipv4(ascii_name)
    if ip4 is not None:
        return VettedHost(str(ip4), ip4)
    return _named_host(ascii_name, keep_internal=keep_internal)


def _named_host(ascii_name: str, *, keep_internal: bool) -> VettedHost:
    reason = refused_name_reason(ascii_name)
    if reason is None:
        return VettedHost(ascii_name, None)
    if keep_internal and internal_suffix_reason(ascii_name) is not None:
        return VettedHost(ascii_name, None, reason)
    raise _unsafe(reason)


def port_or_literal_refusal(
    host: VettedHost, port: int | None, *, allowed_ports: Collection[int], literal_ips_allowed: bool
) -> str | None:
    """Why the policy's `ports` and `literal_ips` refuse `host:port`, or None.

    The one place both rules are decided, for every surface (a URL on the tools API, a CONNECT
    or absolute-URI request on the proxy, `check`): always `unsafe_url`, in report mode too,
    because they are about the form of the destination, not about who may reach which name.
    """
    if host.ip is not None and not literal_ips_allowed:
        return f"IP-literal host {host.name} is refused by policy (literal_ips: deny)"
    if port is None or port not in allowed_ports:
        return f"port {port} is not in the policy's ports {sorted(allowed_ports)}"
    return None


def secret_param(url: yarl.URL) -> str | None:
    for name in url.query:
        if name.lower() in SECRET_QUERY_PARAMS:
            return name
    return None


def vet_url(
    raw: str,
    *,
    allowed_ports: Collection[int],
    literal_ips_allowed: bool,
    refuse_secrets: bool,
    keep_internal: bool = False,
) -> VettedUrl:
    """Parse and vet `raw`, returning its canonical form, or raise `unsafe_url`."""
    if not isinstance(raw, str):
        raise _unsafe("the URL must be a string")
    if len(raw) > MAX_URL_CHARS:
        raise _unsafe(f"the URL is longer than {MAX_URL_CHARS} characters")
    if _FORBIDDEN_CHARS.search(raw):
        raise _unsafe("the URL holds whitespace, control characters or a backslash")
    # Judge userinfo on the raw text: parsers differ on `@` inside brackets or an empty userinfo,
    # and a URL two parsers read differently is how host checks get bypassed.
    _, sep, rest = raw.partition("://")
    if sep and "@" in re.split(r"[/?#]", rest, maxsplit=1)[0]:
        raise _unsafe("URLs with userinfo (user:password@) are refused")
    try:
        parsed = yarl.URL(raw)
        scheme = parsed.scheme.lower()
        raw_authority = parsed.raw_authority
        port = parsed.port
        raw_host = parsed.raw_host
    except (ValueError, TypeError, UnicodeError, IndexError):
        raise _unsafe("the URL cannot be parsed") from None
    if scheme not in ALLOWED_SCHEMES:
        raise _unsafe(f"scheme {scheme or '(none)'!r} is not http or https")
    if "@" in raw_authority or parsed.raw_user is not None or parsed.raw_password is not None:
        raise _unsafe("URLs with userinfo (user:password@) are refused")
    if raw_host is None:
        raise _unsafe("the URL has no host")
    # yarl already turned a bracketed literal into its bare form; keep the brackets signal.
    host = vet_host(f"[{raw_host}]" if ":" in raw_host else raw_host, keep_internal=keep_internal)
    refusal = port_or_literal_refusal(host, port, allowed_ports=allowed_ports, literal_ips_allowed=literal_ips_allowed)
    if refusal is not None:
        raise _unsafe(refusal)
    assert port is not None  # a missing port was refused just above
    if refuse_secrets:
        name = secret_param(parsed)
        if name is not None:
            raise _unsafe(f"query parameter {name!r} carries a credential or signature")
    target = parsed.raw_path_qs or "/"
    if not target.startswith("/"):
        target = "/" + target
    vetted = VettedUrl("", scheme, host, port, target)
    # The fragment never leaves the client; everything else is kept exactly as encoded.
    return VettedUrl(vetted.origin + target, scheme, host, port, target)
