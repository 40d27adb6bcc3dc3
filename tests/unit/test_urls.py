"""The URL guard: schemes, userinfo, length, characters, ports, IDNA, IPv4 spellings, names, secrets.

Table-driven against `vet_url`, `vet_host`, `parse_legacy_ipv4` and `refused_name_reason`, which
are pure: nothing here resolves a name.
"""

from __future__ import annotations

import ipaddress

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.vet.urls import MAX_URL_CHARS, parse_legacy_ipv4, refused_name_reason, vet_host, vet_url

PORTS = (80, 443)


def fullwidth(text: str) -> str:
    """The fullwidth form of ASCII letters and digits (U+FF10...), which UTS #46 maps back to ASCII."""
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in text)


def vet(url: str, *, ports: tuple[int, ...] = PORTS, literal_ips: bool = True, secrets: bool = False) -> str:
    """The canonical URL, or raise."""
    return vet_url(url, allowed_ports=ports, literal_ips_allowed=literal_ips, refuse_secrets=secrets).url


def refused(url: str, *, ports: tuple[int, ...] = PORTS, literal_ips: bool = True, secrets: bool = False) -> str:
    """The unsafe_url message for a refused URL."""
    with pytest.raises(GatewayError) as caught:
        vet_url(url, allowed_ports=ports, literal_ips_allowed=literal_ips, refuse_secrets=secrets)
    assert caught.value.code is ErrorCode.UNSAFE_URL
    return caught.value.message


# --- schemes and userinfo ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://example.com/", "http://example.com/"),
        ("https://example.com/a?b=c", "https://example.com/a?b=c"),
        ("HTTPS://Example.COM/Path", "https://example.com/Path"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com?a=1", "http://example.com/?a=1"),
        ("http://example.com/page#section", "http://example.com/page"),
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/", "https://example.com/"),
        ("http://example.com:443/", "http://example.com:443/"),
    ],
    ids=[
        "http",
        "https-with-query",
        "uppercase-scheme-and-host",
        "no-path",
        "query-without-path",
        "fragment-dropped",
        "default-http-port-dropped",
        "default-https-port-dropped",
        "http-on-443-kept",
    ],
)
def test_http_and_https_urls_are_canonicalised(url: str, canonical: str) -> None:
    assert vet(url) == canonical


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/",
        "file:///etc/passwd",
        "gopher://example.com:70/",
        "javascript:alert(1)",
        "data:text/plain,hi",
        "ws://example.com/",
        "example.com/path",
        "//example.com/",
    ],
    ids=["ftp", "file", "gopher", "javascript", "data", "websocket", "no-scheme", "scheme-relative"],
)
def test_scheme_other_than_http_or_https_is_refused(url: str) -> None:
    refused(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pass@example.com/",
        "http://user@example.com/",
        "http://:@example.com/",
        "http://@example.com/",
        "http://example.com@evil.example/",
        "http://evil.example%40example.com/",
    ],
    ids=[
        "user-and-password",
        "user-only",
        "empty-user-and-password",
        "empty-userinfo",
        "at-trick",
        "encoded-at-in-host",
    ],
)
def test_userinfo_is_refused(url: str) -> None:
    refused(url)


@pytest.mark.parametrize(
    "url",
    ["http://[]@", "http://[::1]@/", "https://[x]@?a"],
    ids=["empty-brackets-then-at", "ipv6-then-empty-host", "bad-brackets-then-at"],
)
def test_bracket_and_at_combination_is_refused_as_unsafe_url_not_a_crash(url: str) -> None:
    refused(url)


# --- length and characters --------------------------------------------------------------------

BASE = "http://example.com/"


def test_url_of_exactly_4096_characters_is_accepted() -> None:
    url = BASE + "a" * (MAX_URL_CHARS - len(BASE))
    assert len(url) == 4096
    assert vet(url) == url


def test_url_of_4097_characters_is_refused() -> None:
    url = BASE + "a" * (MAX_URL_CHARS + 1 - len(BASE))
    assert "longer than 4096" in refused(url)


FORBIDDEN = {
    "nul": "\x00",
    "cr": "\r",
    "lf": "\n",
    "tab": "\t",
    "space": " ",
    "backslash": "\\",
    "del": "\x7f",
    "bell": "\x07",
    "nbsp": "\u00a0",
    "ideographic-space": "\u3000",
    "zero-width-space": "\u200b",
    "line-separator": "\u2028",
    "bom": "\ufeff",
}
PLACES = {
    "in-host": "http://exa{c}mple.com/",
    "after-host": "http://example.com{c}/",
    "in-path": "http://example.com/a{c}b",
    "in-query": "http://example.com/?q={c}",
    "leading": "{c}http://example.com/",
    "trailing": "http://example.com/{c}",
}


@pytest.mark.parametrize(
    "url",
    [template.format(c=char) for char in FORBIDDEN.values() for template in PLACES.values()],
    ids=[f"{name}-{place}" for name in FORBIDDEN for place in PLACES],
)
def test_control_character_whitespace_or_backslash_anywhere_is_refused(url: str) -> None:
    refused(url)


def test_backslash_authority_trick_is_refused() -> None:
    refused("http://example.com\\@evil.example/")


def test_percent_encoded_crlf_in_path_stays_encoded() -> None:
    assert vet("http://example.com/%0d%0aX-Injected:1") == "http://example.com/%0D%0AX-Injected:1"


# --- ports ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "ports"),
    [
        ("http://example.com:8080/", PORTS),
        ("http://example.com:0/", PORTS),
        ("https://example.com/", (80,)),
        ("http://example.com:22/", (80, 443, 8443)),
        ("http://example.com:65536/", PORTS),
        ("http://example.com:99999/", (99999,)),
        ("http://example.com:-1/", PORTS),
        ("http://example.com:0x50/", PORTS),
    ],
    ids=[
        "8080-not-listed",
        "port-zero",
        "default-443-not-listed",
        "ssh-port",
        "65536",
        "beyond-range",
        "negative",
        "hex-port",
    ],
)
def test_port_outside_the_policy_list_is_refused(url: str, ports: tuple[int, ...]) -> None:
    refused(url, ports=ports)


def test_port_in_the_policy_list_is_kept() -> None:
    assert vet("https://example.com:8443/x", ports=(443, 8443)) == "https://example.com:8443/x"


# --- IDNA (UTS #46) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("EXAMPLE.COM", "example.com"),
        ("example.com.", "example.com"),
        (fullwidth("EXAMPLE") + ".com", "example.com"),
        ("example。com", "example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example", "xn--bcher-kva.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
        ("faß.de", "xn--fa-hia.de"),
    ],
    ids=[
        "uppercase",
        "trailing-dot-removed",
        "fullwidth-letters",
        "ideographic-full-stop",
        "u-label",
        "uppercase-u-label",
        "a-label-round-trip",
        "uppercase-a-label",
        "nontransitional-sharp-s",
    ],
)
def test_host_is_uts46_normalised(host: str, name: str) -> None:
    vetted = vet_host(host)
    assert vetted.name == name
    assert vetted.ip is None
    assert vet_host(vetted.name) == vetted


@pytest.mark.parametrize(
    "host",
    [
        "xn--zz.example",
        "xn--a.example",
        "xn--.example",
        "example..com",
        ".example.com",
        "-example.com",
        "a" * 64 + ".com",
        "exa%6dple.com",
        "example.com/",
        "example.com?",
        "example.com#",
        "ex@mple.com",
    ],
    ids=[
        "invalid-punycode",
        "punycode-one-char",
        "empty-punycode",
        "empty-label",
        "leading-dot",
        "leading-hyphen",
        "label-over-63",
        "percent-encoded",
        "slash",
        "question-mark",
        "hash",
        "at-sign",
    ],
)
def test_invalid_host_is_refused(host: str) -> None:
    with pytest.raises(GatewayError) as caught:
        vet_host(host)
    assert caught.value.code is ErrorCode.UNSAFE_URL


# --- IPv4 spellings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7F.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0x7f.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("00000177.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        (fullwidth("127.0.0.1"), "127.0.0.1"),
        ("169.254.43518", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
    ],
    ids=[
        "dotted",
        "decimal",
        "octal",
        "hex-short",
        "hex-uppercase",
        "short-two-part",
        "short-three-part",
        "mixed-hex-decimal",
        "hex-whole",
        "octal-whole",
        "octal-padded",
        "trailing-dot",
        "fullwidth-digits",
        "short-metadata",
        "hex-metadata",
        "zero",
        "bare-0x",
    ],
)
def test_every_ipv4_spelling_is_recognised_as_the_literal_it_is(host: str, address: str) -> None:
    vetted = vet_host(host)
    assert vetted.ip == ipaddress.IPv4Address(address)
    assert vetted.name == address


@pytest.mark.parametrize(
    "host",
    [
        "7147006462",
        "425.510.425.510",
        "0x100000000",
        "256.0.0.1",
        "1.2.3.256",
        "1.2.65536",
        "1.16777216",
        "4294967296",
        "1.2.3.4.5",
        "09.0.0.1",
        "0x1g.0.0.1",
        "example.123",
    ],
    ids=[
        "decimal-overflow",
        "dotted-overflow",
        "hex-overflow",
        "first-octet-256",
        "last-octet-256",
        "short-three-part-overflow",
        "short-two-part-overflow",
        "decimal-2-to-32",
        "five-parts",
        "bad-octal",
        "bad-hex",
        "name-ending-in-number",
    ],
)
def test_overflowing_or_malformed_ipv4_is_refused_never_wrapped(host: str) -> None:
    with pytest.raises(GatewayError) as caught:
        vet_host(host)
    assert caught.value.code is ErrorCode.UNSAFE_URL


def test_parse_legacy_ipv4_returns_none_for_a_name() -> None:
    assert parse_legacy_ipv4("example.com") is None
    assert parse_legacy_ipv4("1.example.com") is None


@pytest.mark.parametrize(
    "url",
    ["http://2130706433/", "http://0177.0.0.1/", "http://0x7f.1/", "http://127.1/", "http://[::1]/"],
    ids=["decimal", "octal", "hex", "short", "ipv6"],
)
def test_literal_ip_in_any_spelling_is_refused_when_literal_ips_deny(url: str) -> None:
    assert "literal_ips: deny" in refused(url, literal_ips=False)


@pytest.mark.parametrize(
    ("url", "canonical"),
    [("http://2130706433/", "http://127.0.0.1/"), ("http://0x7f.0.1:443/x", "http://127.0.0.1:443/x")],
    ids=["decimal", "mixed-with-port"],
)
def test_literal_ip_is_canonicalised_to_dotted_form(url: str, canonical: str) -> None:
    assert vet(url) == canonical


# --- IPv6 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://[::1]/", "::1"),
        ("http://[fe80::1%25eth0]/", "fe80::1"),
        ("http://[fe80::1%eth0]/", "fe80::1"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1"),
        ("http://[::127.0.0.1]/", "::7f00:1"),
        ("http://[64:ff9b::169.254.169.254]/", "64:ff9b::a9fe:a9fe"),
        ("http://[2606:4700:0:0:0:0:0:1111]:443/", "2606:4700::1111"),
    ],
    ids=[
        "loopback",
        "zone-id-encoded",
        "zone-id-raw",
        "mapped-dotted",
        "compatible-dotted",
        "nat64-dotted",
        "uncompressed",
    ],
)
def test_ipv6_literal_is_parsed_to_its_address_without_zone(url: str, address: str) -> None:
    vetted = vet_url(url, allowed_ports=PORTS, literal_ips_allowed=True, refuse_secrets=False)
    assert vetted.host.ip == ipaddress.IPv6Address(address)
    assert vetted.url.startswith(f"http://[{address}]")


@pytest.mark.parametrize(
    "url",
    ["http://[::1/", "http://[gggg::1]/", "http://[1:2:3:4:5:6:7:8:9]/", "http://[127.0.0.1]/"],
    ids=["unterminated", "bad-hex", "too-many-groups", "ipv4-in-brackets"],
)
def test_malformed_ipv6_literal_is_refused(url: str) -> None:
    refused(url)


# --- internal names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST",
        "localhost.",
        "app.localhost",
        "printer.local",
        "box.localdomain",
        "db.internal",
        "metadata.google.internal",
        "router.home.arpa",
        "metadata",
        "metadata.goog",
        "instance-data",
        "kubernetes.default.svc",
        "api.ns.svc.cluster.local",
        "intranet",
        fullwidth("localhost"),
    ],
    ids=[
        "localhost",
        "localhost-uppercase",
        "localhost-trailing-dot",
        "under-localhost",
        "under-local",
        "under-localdomain",
        "under-internal",
        "gcp-metadata",
        "under-home-arpa",
        "metadata-single-label",
        "metadata-goog",
        "instance-data",
        "kubernetes-api",
        "cluster-service",
        "single-label",
        "fullwidth-localhost",
    ],
)
def test_internal_name_is_refused_before_any_lookup(host: str) -> None:
    with pytest.raises(GatewayError) as caught:
        vet_host(host)
    assert caught.value.code is ErrorCode.UNSAFE_URL
    assert "internal" in caught.value.message or "single-label" in caught.value.message


@pytest.mark.parametrize(
    "name",
    ["example.com", "localhost.example.com", "internal.example.com", "local.example", "metadata.example.org"],
    ids=["plain", "localhost-as-label", "internal-as-label", "local-as-label", "metadata-as-label"],
)
def test_public_name_containing_an_internal_word_is_not_refused(name: str) -> None:
    assert refused_name_reason(name) is None
    assert vet_host(name).name == name


# --- secret query parameters ------------------------------------------------------------------

SECRET_PARAMS = [
    "X-Amz-Signature",
    "x-amz-signature",
    "X-Goog-Signature",
    "sig",
    "Sig",
    "signature",
    "token",
    "TOKEN",
    "access_token",
    "api_key",
    "apikey",
    "ApiKey",
    "password",
    "secret",
    "client_secret",
    "Client_Secret",
]


@pytest.mark.parametrize("param", SECRET_PARAMS, ids=SECRET_PARAMS)
def test_secret_query_parameter_is_refused_when_refuse_secrets(param: str) -> None:
    url = f"https://bucket.example.com/object?x=1&{param}=abc123"
    assert repr(param) in refused(url, secrets=True)
    assert vet(url, secrets=False) == url


def test_secret_parameter_without_a_value_is_refused() -> None:
    refused("https://example.com/?token", secrets=True)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/?tokens=1",
        "https://example.com/?q=token",
        "https://example.com/token/signature",
        "https://example.com/?page=2&sort=password_strength",
    ],
    ids=["param-name-prefix", "secret-word-as-value", "secret-word-in-path", "secret-word-inside-value"],
)
def test_non_secret_query_is_accepted_with_refuse_secrets(url: str) -> None:
    assert vet(url, secrets=True) == url
