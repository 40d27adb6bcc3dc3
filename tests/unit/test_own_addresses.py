"""The gateway's own addresses: one listener address, or every host address behind a wildcard."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.egress.own_addresses import host_addresses, own_addresses
from gateway.vet.addresses import AddressGuard, parse_networks


def test_a_listener_on_one_address_owns_only_that_address() -> None:
    assert own_addresses(["127.0.0.1", "127.0.0.1", "::1"]) == (
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    )


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"], ids=["ipv4-wildcard", "ipv6-wildcard"])
def test_a_wildcard_listener_owns_the_loopback_ranges_and_every_interface_address(wildcard: str) -> None:
    owned = own_addresses([wildcard])
    assert ipaddress.ip_network("127.0.0.0/8") in owned
    assert ipaddress.ip_network("::1/128") in owned
    # Every address configured on this host (lo at least) is refused, even when a policy opens it.
    guard = AddressGuard(parse_networks(["0.0.0.0/0", "::/0"]), (), owned)
    assert host_addresses()
    for address in host_addresses():
        assert not guard.vet(address).allowed, address


@pytest.mark.parametrize("address", ["127.0.0.2", "127.255.255.254", "::1"], ids=["127.0.0.2", "127-top", "v6-loop"])
def test_behind_a_wildcard_listener_no_loopback_address_passes_even_when_allowed(address: str) -> None:
    guard = AddressGuard(parse_networks(["127.0.0.0/8", "::1/128"]), (), own_addresses(["0.0.0.0"]))
    verdict = guard.vet(ipaddress.ip_address(address))
    assert not verdict.allowed
    assert "gateway's own listeners" in verdict.reason


def test_behind_a_specific_listener_other_loopback_addresses_stay_reachable_when_allowed() -> None:
    guard = AddressGuard(parse_networks(["127.0.0.0/8"]), (), own_addresses(["127.0.0.1"]))
    assert guard.vet(ipaddress.ip_address("127.0.0.2")).allowed
    assert not guard.vet(ipaddress.ip_address("127.0.0.1")).allowed
