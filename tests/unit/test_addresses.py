"""The address guard: every built-in denied range, public addresses, and the policy's exceptions.

Table-driven against `AddressGuard.vet`, which is pure: no loop, no socket.
"""

from __future__ import annotations

import ipaddress

import pytest

from gateway.vet.addresses import AddressGuard, IPAddress, IPNetwork, parse_networks


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


def net(text: str) -> IPNetwork:
    return ipaddress.ip_network(text)


BUILTIN = AddressGuard()

# (address, range the reason must name)
DENIED_V4: list[tuple[str, str]] = [
    ("0.1.2.3", "0.0.0.0/8"),
    ("0.0.0.0", "0.0.0.0/8"),
    ("10.0.0.1", "10.0.0.0/8"),
    ("100.64.0.1", "100.64.0.0/10"),
    ("100.100.100.200", "100.64.0.0/10"),
    ("127.0.0.1", "127.0.0.0/8"),
    ("127.255.255.254", "127.0.0.0/8"),
    ("169.254.169.254", "169.254.0.0/16"),
    ("172.16.0.1", "172.16.0.0/12"),
    ("172.31.255.255", "172.16.0.0/12"),
    ("192.0.0.192", "192.0.0.0/24"),
    ("192.0.2.1", "192.0.2.0/24"),
    ("192.88.99.1", "192.88.99.0/24"),
    ("192.168.1.1", "192.168.0.0/16"),
    ("198.18.0.1", "198.18.0.0/15"),
    ("198.19.255.1", "198.18.0.0/15"),
    ("198.51.100.1", "198.51.100.0/24"),
    ("203.0.113.1", "203.0.113.0/24"),
    ("224.0.0.1", "224.0.0.0/4"),
    ("239.255.255.250", "224.0.0.0/4"),
    ("240.0.0.1", "240.0.0.0/4"),
    ("255.255.255.255", "255.255.255.255/32"),
    ("168.63.129.16", "168.63.129.16/32"),
]
DENIED_V4_IDS = [
    "this-network",
    "unspecified-v4",
    "private-10",
    "cgnat",
    "alibaba-metadata",
    "loopback",
    "loopback-top",
    "aws-metadata",
    "private-172",
    "private-172-top",
    "oracle-metadata",
    "test-net-1",
    "6to4-relay",
    "private-192-168",
    "benchmarking",
    "benchmarking-top",
    "test-net-2",
    "test-net-3",
    "multicast",
    "multicast-ssdp",
    "reserved-240",
    "broadcast",
    "azure-platform",
]

DENIED_V6: list[tuple[str, str]] = [
    ("::", "::/128"),
    ("::1", "::1/128"),
    ("::ffff:127.0.0.1", "::ffff:0:0/96"),
    ("::127.0.0.1", "::/96"),
    ("64:ff9b::a9fe:a9fe", "64:ff9b::/96"),
    ("64:ff9b:1::a9fe:a9fe", "64:ff9b:1::/48"),
    ("100::1", "100::/64"),
    ("fc00::1", "fc00::/7"),
    ("fd00:ec2::254", "fc00::/7"),
    ("fd20:ce::254", "fc00::/7"),
    ("fe80::1", "fe80::/10"),
    ("fec0::1", "fec0::/10"),
    ("ff02::1", "ff00::/8"),
    ("2001:2::1", "2001::/23"),
    ("2001:db8::1", "2001:db8::/32"),
    ("2002:808:808::1", "2002::/16"),
    ("3fff::1", "3fff::/20"),
    ("5f00::1", "5f00::/16"),
]
DENIED_V6_IDS = [
    "unspecified-v6",
    "loopback-v6",
    "mapped-loopback",
    "compatible-loopback",
    "nat64-metadata",
    "local-nat64-metadata",
    "discard-only",
    "unique-local",
    "aws-metadata-v6",
    "gcp-metadata-v6",
    "link-local-v6",
    "site-local",
    "multicast-v6",
    "ietf-protocol-assignments",
    "documentation-v6",
    "6to4-of-public",
    "documentation-3fff",
    "segment-routing",
]

# IPv4-embedding forms: (address, embedded IPv4 the reason must name)
EMBEDDING: list[tuple[str, str]] = [
    ("::ffff:169.254.169.254", "169.254.169.254"),
    ("::169.254.169.254", "169.254.169.254"),
    ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
    ("64:ff9b:1::a9fe:a9fe", "169.254.169.254"),
    ("2002:a9fe:a9fe::", "169.254.169.254"),
    # Teredo: the client address is stored XOR-ed with all ones (RFC 4380 section 4).
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
    ("2001::5601:5601", "169.254.169.254"),
]
EMBEDDING_IDS = [
    "mapped-metadata",
    "compatible-metadata",
    "nat64-metadata",
    "local-nat64-metadata",
    "6to4-metadata",
    "teredo-rfc4380-example",
    "teredo-xored-metadata",
]


@pytest.mark.parametrize(("address", "range_"), DENIED_V4, ids=DENIED_V4_IDS)
def test_builtin_ipv4_range_is_denied_and_named(address: str, range_: str) -> None:
    verdict = BUILTIN.vet(ip(address))
    assert not verdict.allowed
    assert range_ in verdict.reason


@pytest.mark.parametrize(("address", "range_"), DENIED_V6, ids=DENIED_V6_IDS)
def test_builtin_ipv6_range_is_denied_and_named(address: str, range_: str) -> None:
    verdict = BUILTIN.vet(ip(address))
    assert not verdict.allowed
    assert range_ in verdict.reason


@pytest.mark.parametrize(("address", "embedded"), EMBEDDING, ids=EMBEDDING_IDS)
def test_ipv4_embedding_form_names_the_embedded_ipv4(address: str, embedded: str) -> None:
    verdict = BUILTIN.vet(ip(address))
    assert not verdict.allowed
    assert f"IPv4 {embedded}" in verdict.reason


def test_teredo_reason_names_the_form_and_the_xored_client() -> None:
    verdict = BUILTIN.vet(ip("2001:0:4136:e378:8000:63bf:3fff:fdd2"))
    assert "Teredo" in verdict.reason
    assert "192.0.2.45" in verdict.reason
    assert "63.191.255.210" not in verdict.reason  # the un-XOR-ed bits are not the client


def test_6to4_of_a_public_ipv4_is_still_denied() -> None:
    verdict = BUILTIN.vet(ip("2002:808:808::1"))
    assert not verdict.allowed
    assert "8.8.8.8" in verdict.reason


@pytest.mark.parametrize(
    "address",
    ["fd00::1", "4000::1", "8000::1", "e000::1", "1::1", "::2:1:1"],
    ids=["ula", "outside-2000-3-low", "outside-2000-3-mid", "outside-2000-3-high", "below-2000", "compat-tiny"],
)
def test_ipv6_outside_global_unicast_is_always_denied(address: str) -> None:
    assert not BUILTIN.vet(ip(address)).allowed


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "2a00:1450:4001:80b::200e"],
    ids=["google-dns", "cloudflare-dns", "example-com", "cloudflare-v6", "google-v6"],
)
def test_public_address_is_allowed(address: str) -> None:
    verdict = BUILTIN.vet(ip(address))
    assert verdict.allowed
    assert "public" in verdict.reason


def test_ipv6_zone_id_is_ignored_for_classification() -> None:
    assert not BUILTIN.vet(ipaddress.IPv6Address("fe80::1%eth0")).allowed


@pytest.mark.parametrize(
    "address",
    ["192.0.0.192", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::", "::127.0.0.1", "fec0::1"],
    ids=["oracle-metadata", "nat64-metadata", "6to4-metadata", "compatible-loopback", "site-local"],
)
def test_guard_denies_where_python_is_global_is_wrong(address: str) -> None:
    parsed = ip(address)
    assert parsed.is_global, "Python 3.11 calls this global; if it changed, the table still must deny"
    assert not BUILTIN.vet(parsed).allowed


# (allow_cidrs, deny_cidrs, address, allowed?)
PRECEDENCE: list[tuple[list[str], list[str], str, bool]] = [
    (["127.0.0.2/32"], [], "127.0.0.2", True),
    (["127.0.0.2/32"], [], "127.0.0.3", False),
    (["10.0.0.0/9"], ["10.1.0.0/16"], "10.1.2.3", False),
    (["10.0.0.0/9"], ["10.1.0.0/16"], "10.2.0.1", True),
    (["10.1.2.0/24"], ["10.1.0.0/16"], "10.1.2.3", True),
    (["10.1.0.0/16"], ["10.1.0.0/16"], "10.1.2.3", False),
    ([], ["8.8.8.0/24"], "8.8.8.8", False),
    (["8.8.8.0/24"], ["8.8.8.0/24"], "8.8.8.8", False),
    (["fd00:ec2::/64"], [], "fd00:ec2::254", True),
    (["fd00::/8"], ["fd00:ec2::/32"], "fd00:ec2::254", False),
    (["169.254.0.0/16"], [], "::ffff:169.254.169.254", False),
]
PRECEDENCE_IDS = [
    "allow-exact-host",
    "allow-does-not-open-neighbour",
    "deny-more-specific-wins",
    "allow-outside-deny",
    "allow-more-specific-wins",
    "tie-deny-wins",
    "extra-deny-on-public",
    "tie-on-public-deny-wins",
    "allow-ula-prefix",
    "deny-inside-allowed-ula",
    "v4-allow-does-not-open-mapped-v6",
]


@pytest.mark.parametrize(("allow", "deny", "address", "allowed"), PRECEDENCE, ids=PRECEDENCE_IDS)
def test_allow_and_deny_cidrs_more_specific_wins_tie_denies(
    allow: list[str], deny: list[str], address: str, allowed: bool
) -> None:
    guard = AddressGuard(parse_networks(allow), parse_networks(deny))
    verdict = guard.vet(ip(address))
    assert verdict.allowed is allowed, verdict.reason


@pytest.mark.parametrize(
    ("allow", "address"),
    [("10.0.0.0/8", "10.2.0.1"), ("169.254.0.0/16", "169.254.1.1"), ("fc00::/7", "fd12::1")],
    ids=["whole-private-10", "whole-link-local", "whole-unique-local"],
)
def test_allow_cidr_equal_to_a_builtin_range_is_an_exception_to_it(allow: str, address: str) -> None:
    # allow_cidrs are explicit exceptions to the built-in table (DESIGN.md section 4); the
    # tie-goes-to-deny rule is between a policy allow_cidrs and a policy deny_cidrs entry.
    verdict = AddressGuard(parse_networks([allow])).vet(ip(address))
    assert verdict.allowed, verdict.reason


def test_allow_reason_names_the_policy_exception() -> None:
    verdict = AddressGuard(parse_networks(["127.0.0.2/32"])).vet(ip("127.0.0.2"))
    assert "127.0.0.2/32 (policy allow_cidrs)" in verdict.reason


def test_deny_reason_names_the_policy_denial() -> None:
    verdict = AddressGuard(deny_cidrs=parse_networks(["8.8.8.0/24"])).vet(ip("8.8.8.8"))
    assert "8.8.8.0/24 (policy deny_cidrs)" in verdict.reason


def test_parse_networks_refuses_host_bits_set() -> None:
    with pytest.raises(ValueError, match="host bits set"):
        parse_networks(["10.0.0.1/8"])


def test_per_host_extra_allow_opens_only_that_call() -> None:
    internal = (net("10.20.0.0/16"),)
    assert BUILTIN.vet(ip("10.20.1.1"), extra_allow=internal).allowed
    assert not BUILTIN.vet(ip("10.20.1.1")).allowed
    assert not BUILTIN.vet(ip("10.21.0.1"), extra_allow=internal).allowed


@pytest.mark.parametrize(
    ("allow", "address"),
    [
        (["127.0.0.1/32"], "127.0.0.1"),
        (["8.8.8.8/32"], "8.8.8.8"),
        ([], "8.8.8.8"),
        (["2606:4700::/32"], "2606:4700::1111"),
    ],
    ids=["loopback-allowed-by-policy", "public-allowed-by-policy", "public-no-policy", "public-v6"],
)
def test_gateway_own_listener_is_denied_even_when_allowed(allow: list[str], address: str) -> None:
    guard = AddressGuard(parse_networks(allow), (), self_addresses=(ip(address),))
    verdict = guard.vet(ip(address))
    assert not verdict.allowed
    assert "gateway's own listeners" in verdict.reason


def test_gateway_own_listener_is_denied_even_with_per_host_extra_allow() -> None:
    guard = AddressGuard(self_addresses=(ip("10.0.0.5"),))
    assert not guard.vet(ip("10.0.0.5"), extra_allow=(net("10.0.0.0/24"),)).allowed
    assert guard.vet(ip("10.0.0.6"), extra_allow=(net("10.0.0.0/24"),)).allowed
