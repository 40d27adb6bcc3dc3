"""Result links: unwrapping engine redirect wrappers, judging safety, and the dedupe key.

Pure string work on URLs. An agent may follow any link it is handed, so a link is judged on the
destination (wrappers decoded first) and refused when it could reach the gateway's own network
(IP literals in any spelling, single-label and special-use names) or smuggles credentials
(userinfo). Never resolves a name: a public-looking name that resolves privately is the egress
core's to stop when the link is fetched.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
from types import MappingProxyType
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from gateway.errors import GatewayError
from gateway.vet.urls import vet_url

_DDG_HOSTS = frozenset({"duckduckgo.com", "html.duckduckgo.com", "lite.duckduckgo.com"})
_BING_HOST_RE = re.compile(r"(?:[a-z0-9-]+\.)*bing\.com")
# Suffixes that are never a public page but that the egress guard leaves to DNS (RFC 2606/6761
# test, invalid, example; Tor's onion; common LAN suffixes).
NON_PUBLIC_SUFFIXES = ("lan", "intranet", "corp", "test", "invalid", "example", "onion")
ANY_PORT = range(1, 65536)
_DEFAULT_PORTS = MappingProxyType({"http": 80, "https": 443})
# Parameters that only identify the click for a tracker; dropping them changes no page.
_TRACKING_PARAMS = frozenset(
    {
        "gclid",
        "gclsrc",
        "dclid",
        "gbraid",
        "wbraid",
        "fbclid",
        "msclkid",
        "yclid",
        "twclid",
        "ttclid",
        "li_fat_id",
        "mc_cid",
        "mc_eid",
        "igshid",
        "_hsenc",
        "_hsmi",
        "mkt_tok",
        "oly_anon_id",
        "oly_enc_id",
        "vero_id",
        "rb_clickid",
        "s_cid",
        "ref_src",
        "spm",
    }
)
_TRACKING_PREFIXES = ("utm_", "pk_", "mtm_", "matomo_")
MAX_UNWRAP_DEPTH = 3


def _decode_bing_u(value: str) -> str | None:
    # Bing's ck/a wrapper carries the destination as "a1" + unpadded base64url (searx bing.py).
    if not value.startswith("a1"):
        return None
    data = value[2:]
    try:
        raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.decode("utf-8", errors="replace")


def unwrap_redirect(url: str) -> str:
    """The destination of a known engine redirect wrapper, or the URL itself.

    DuckDuckGo: `//duckduckgo.com/l/?uddg=<percent-encoded>`; Bing: `bing.com/ck/a?...&u=a1<b64>`.
    A Bing wrapper that decodes to a relative path is a Bing vertical (images, videos), resolved
    against bing.com so the caller sees what it is. Wrappers nested in wrappers are followed a few
    levels deep.
    """
    current = html.unescape(url.strip())
    for _ in range(MAX_UNWRAP_DEPTH):
        if current.startswith("//"):
            current = "https:" + current
        parts = urlsplit(current)
        host = (parts.hostname or "").lower()
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        if host in _DDG_HOSTS and parts.path == "/l/" and params.get("uddg"):
            current = params["uddg"]
            continue
        if _BING_HOST_RE.fullmatch(host) and parts.path == "/ck/a" and params.get("u"):
            decoded = _decode_bing_u(params["u"])
            if decoded is None:
                return current
            current = "https://www.bing.com" + decoded if decoded.startswith("/") else decoded
            continue
        break
    if current.startswith("//"):
        current = "https:" + current
    return current


def unsafe_reason(url: str) -> str | None:
    """Why a result link must not reach an agent, or None when it may.

    The egress URL guard judges it exactly as a later web_fetch would (IP literals in every
    spelling, internal names, userinfo, schemes), and a few suffixes that are never a public page
    are refused on top.
    """
    try:
        vetted = vet_url(url, allowed_ports=ANY_PORT, literal_ips_allowed=False, refuse_secrets=False)
    except GatewayError as exc:
        return exc.message
    name = vetted.host.name
    if any(name == s or name.endswith("." + s) for s in NON_PUBLIC_SUFFIXES):
        return f"{name} is under a suffix that is never a public site"
    return None


def _is_tracking(name: str) -> bool:
    lowered = name.lower()
    return lowered in _TRACKING_PARAMS or lowered.startswith(_TRACKING_PREFIXES)


def strip_tracking(url: str) -> str:
    """The URL without click-tracking parameters; everything else kept as written."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not _is_tracking(k)]
    if len(kept) == len(pairs):
        return url
    return urlunsplit(parts._replace(query=urlencode(kept, quote_via=quote)))


def host_of(url: str) -> str:
    """The lowercased, IDNA-encoded host of a URL ("" when it has none)."""
    host = (urlsplit(url).hostname or "").rstrip(".")
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        return host.lower()


def on_site(url: str, site: str) -> bool:
    """True when the URL's host is the site or one of its subdomains."""
    host = host_of(url)
    return host == site or host.endswith("." + site)


def dedupe_key(url: str) -> str:
    """The URL compared for duplicates: scheme and host case, default port, fragment, trailing
    slash and tracking parameters do not make two results different."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = host_of(url)
    port = parts.port
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    path = unquote(parts.path).rstrip("/") or "/"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not _is_tracking(k)])
    return urlunsplit((scheme, netloc, path, query, ""))
