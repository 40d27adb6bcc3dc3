"""Property tests for the URL guard: no input makes it raise anything but `unsafe_url`.

And what it accepts is a fixed point: the canonical URL (or host) vets to itself, so the URL we
log, match and connect to is the one we vetted. Bounded `max_examples` keep the file fast.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.errors import ErrorCode, GatewayError
from gateway.vet.urls import DEFAULT_PORTS, VettedHost, VettedUrl, refused_name_reason, vet_host, vet_url
from tests.harness.fuzz import examples

# Hundreds of generated examples a test: seconds of CPU, left out of `make test-fast` (`make test`
# runs them with their own bounded count, `make fuzz` with more).
pytestmark = pytest.mark.slow

# Every port allowed, so that acceptance depends only on the URL's shape.
ALL_PORTS = range(65536)
FAST = examples(300)


def vet_or_none(raw: str) -> VettedUrl | None:
    try:
        return vet_url(raw, allowed_ports=ALL_PORTS, literal_ips_allowed=True, refuse_secrets=True)
    except GatewayError as exc:
        error = exc
    assert error.code is ErrorCode.UNSAFE_URL, error
    return None


def host_or_none(raw: str) -> VettedHost | None:
    try:
        return vet_host(raw)
    except GatewayError as exc:
        error = exc
    assert error.code is ErrorCode.UNSAFE_URL, error
    return None


def assert_url_is_a_fixed_point(raw: str) -> None:
    vetted = vet_or_none(raw)
    if vetted is not None:
        assert vet_or_none(vetted.url) == vetted, raw


def assert_host_is_a_fixed_point(raw: str) -> None:
    vetted = host_or_none(raw)
    if vetted is not None:
        again = f"[{vetted.name}]" if vetted.ip is not None and vetted.ip.version == 6 else vetted.name
        assert host_or_none(again) == vetted, raw


schemes = st.sampled_from(["http", "https", "HTTP", "HtTpS", "ftp", "file", "javascript", ""])
numeric_hosts = st.from_regex(r"(0[xX])?[0-9a-fA-F]{0,10}(\.(0[xX])?[0-9a-fA-F]{0,4}){0,4}\.?", fullmatch=True)
ip_hosts = st.ip_addresses().map(lambda a: f"[{a}]" if a.version == 6 else str(a))
zoned_hosts = st.ip_addresses(v=6).map(lambda a: f"[{a}%25eth0]")
name_hosts = st.from_regex(r"[a-zA-Z0-9-]{1,12}(\.[a-zA-Z0-9-]{1,12}){0,3}\.?", fullmatch=True)
unicode_hosts = st.text(
    alphabet=st.characters(categories=["Ll", "Lu", "Lo", "Nd", "Pd"], codec="utf-8"), min_size=1, max_size=12
).map(lambda label: f"{label}.example")
tricky_hosts = st.sampled_from(
    [
        "example.com",
        "EXAMPLE.COM.",
        "bücher.example",
        "xn--bcher-kva.example",
        "xn--zz.example",
        "localhost",
        "metadata.google.internal",
        "0x7f.1",
        "2130706433",
        "\uff11\uff12\uff17.\uff10.\uff10.\uff11",
        "[]",
        "[::1",
        "user@host.example",
        "a..b",
        "[fe80::1%25eth0]",
        "[::ffff:127.0.0.1]",
    ]
)
hosts = st.one_of(numeric_hosts, ip_hosts, zoned_hosts, name_hosts, unicode_hosts, tricky_hosts, st.text(max_size=20))
ports = st.one_of(
    st.just(""), st.integers(-1, 70000).map(lambda p: f":{p}"), st.text(max_size=4).map(lambda t: f":{t}")
)
paths = st.one_of(st.just(""), st.text(max_size=30).map(lambda t: "/" + t), st.text(max_size=30))
urls = st.builds(lambda s, h, p, rest: f"{s}://{h}{p}{rest}", schemes, hosts, ports, paths)


@FAST
@given(st.text(max_size=200))
def test_vet_url_on_arbitrary_text_accepts_a_fixed_point_or_refuses_as_unsafe_url(raw: str) -> None:
    assert_url_is_a_fixed_point(raw)


@FAST
@given(urls)
@example("http://[]@")  # yarl 1.25 raised IndexError on an empty host after brackets
@example("http://[::1]@/")
def test_vet_url_on_url_shaped_text_accepts_a_fixed_point_or_refuses_as_unsafe_url(raw: str) -> None:
    assert_url_is_a_fixed_point(raw)


@FAST
@given(st.text(max_size=60))
def test_vet_host_on_arbitrary_text_accepts_a_fixed_point_or_refuses_as_unsafe_url(raw: str) -> None:
    assert_host_is_a_fixed_point(raw)


@FAST
@given(hosts)
def test_vet_host_on_host_shaped_text_accepts_a_fixed_point_or_refuses_as_unsafe_url(raw: str) -> None:
    assert_host_is_a_fixed_point(raw)


@FAST
@given(st.integers(0, 2**32 - 1))
def test_every_decimal_ipv4_spelling_is_read_as_that_address(number: int) -> None:
    vetted = vet_host(str(number))
    assert vetted.ip is not None
    assert int(vetted.ip) == number
    assert vet_host(hex(number)) == vetted
    assert vet_host("0" + oct(number)[2:]) == vetted


@FAST
@given(st.integers(2**32, 2**40))
def test_every_overflowing_decimal_ipv4_is_refused(number: int) -> None:
    assert host_or_none(str(number)) is None
    assert host_or_none(hex(number)) is None


def assert_a_plain_parser_reads_the_vetted_url_alike(vetted: VettedUrl) -> None:
    """urllib.parse and ipaddress, reading the canonical URL, find the scheme, host, port and
    target the guard vetted: nothing downstream can read another destination into it."""
    parts = urlsplit(vetted.url)
    assert parts.scheme == vetted.scheme
    assert parts.username is None
    assert parts.password is None
    assert (DEFAULT_PORTS[vetted.scheme] if parts.port is None else parts.port) == vetted.port
    assert parts.hostname is not None
    if vetted.host.ip is not None:
        assert ipaddress.ip_address(parts.hostname) == vetted.host.ip
    else:
        assert parts.hostname == vetted.host.name
        assert not _is_ip_literal(parts.hostname)
    assert (parts.path or "/") + (f"?{parts.query}" if parts.query else "") == vetted.target


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@FAST
@given(st.one_of(urls, st.text(max_size=120)))
@example("http://a.example\\@b.example/")
@example("http://a.example%2f@b.example/")
@example("http://0x7f.1:80/")
def test_what_the_guard_accepts_a_plain_parser_reads_alike(raw: str) -> None:
    vetted = vet_or_none(raw)
    if vetted is not None:
        assert_a_plain_parser_reads_the_vetted_url_alike(vetted)


plain_names = st.from_regex(
    r"[a-z][a-z0-9-]{0,10}[a-z0-9](\.[a-z][a-z0-9-]{0,10}[a-z0-9]){1,3}", fullmatch=True
).filter(
    # Public-looking names only: internal suffixes (`.local`, `.svc`...) are refused by design,
    # and IDNA reserves hyphens in a label's third and fourth places (`xn--`, `ab--c`).
    lambda name: refused_name_reason(name) is None and all(label[2:4] != "--" for label in name.split("."))
)
plain_hosts = st.one_of(
    plain_names.map(lambda name: (name, name)),
    st.ip_addresses(v=4).map(lambda ip: (str(ip), str(ip))),
    st.ip_addresses(v=6).map(lambda ip: (f"[{ip}]", str(ip))),
)
safe_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~", max_size=12)


@FAST
@given(
    st.sampled_from(["http", "https"]),
    plain_hosts,
    st.one_of(st.none(), st.integers(1, 65535)),
    st.lists(safe_text, max_size=4),
    st.lists(st.tuples(st.sampled_from(["q", "page", "lang", "id"]), safe_text), max_size=3),
)
def test_a_plain_url_is_vetted_as_urllib_and_ipaddress_read_it(
    scheme: str, host: tuple[str, str], port: int | None, segments: list[str], query: list[tuple[str, str]]
) -> None:
    authority, bare = host
    raw = f"{scheme}://{authority}{f':{port}' if port is not None else ''}/{'/'.join(segments)}"
    if query:
        raw += "?" + "&".join(f"{key}={value}" for key, value in query)
    vetted = vet_or_none(raw)
    assert vetted is not None, raw
    parts = urlsplit(raw)
    assert (vetted.scheme, vetted.port) == (parts.scheme, DEFAULT_PORTS[scheme] if parts.port is None else parts.port)
    if _is_ip_literal(bare):
        assert vetted.host.ip == ipaddress.ip_address(bare)
    else:
        assert vetted.host.name == bare
    assert_a_plain_parser_reads_the_vetted_url_alike(vetted)
