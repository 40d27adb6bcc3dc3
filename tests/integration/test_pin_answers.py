"""`EgressCore.pin_cached` reuses a remembered target only for the very answer it was vetted on.

Real resolver against the fake DNS, its cache expired through the resolver's own `clock`. A name's
answer is stored again when several lookups of it were in flight together, or when it is asked
again after its TTL: an equal answer must not leave the remembered target on the old tuple (every
CONNECT after would compare the addresses by value), and a changed answer is vetted afresh.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.egress.own_addresses import own_addresses
from gateway.egress.resolver import Resolver
from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.holder import FixedPolicy
from gateway.policy.load import parse_policy
from gateway.policy.model import LoadedPolicy
from gateway.vet.urls import vet_host
from tests.harness.dns import FakeDNS

POLICY = 'version: 1\nprincipals: {default: {egress: {allow_domains: ["*"]}}}\n'
TTL_S = 60
# c-ares keeps answers for their TTL as well (in real time): a changed answer needs a short one.
SHORT_TTL_S = 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _core(fake_dns: FakeDNS, generation: int) -> tuple[LoadedPolicy, Clock, Resolver, EgressCore]:
    """The egress core on the real resolver, whose cache expires when the test moves its clock."""
    loaded = LoadedPolicy(parse_policy(POLICY), generation)
    clock = Clock()
    resolver = Resolver([fake_dns.nameserver], timeout_s=1.0, tries=1, clock=clock)
    return loaded, clock, resolver, EgressCore(resolver, FixedPolicy(loaded), own_addresses(["127.0.0.1"]))


async def test_an_answer_stored_again_is_the_one_the_remembered_target_holds(fake_dns: FakeDNS) -> None:
    fake_dns.add("again.example.com", "93.184.216.34", ttl=TTL_S)
    loaded, clock, resolver, core = _core(fake_dns, 3)
    principal = loaded.policy.principals["default"]
    host = vet_host("again.example.com")
    try:
        assert core.pin_cached(principal, host, 443, loaded) is None
        await core.pin(principal, host, 443, loaded=loaded)
        first = core.pin_cached(principal, host, 443, loaded)
        assert first is not None
        assert core.pin_cached(principal, host, 443, loaded) is first

        clock.now += TTL_S + 1
        assert core.pin_cached(principal, host, 443, loaded) is None  # expired: DNS is asked again
        await core.pin(principal, host, 443, loaded=loaded)
        stored = resolver.cached_addresses("again.example.com")
        assert stored is not None
        assert stored is not first.addresses  # a new tuple for the same answer
        assert stored == first.addresses

        again = core.pin_cached(principal, host, 443, loaded)
        assert again is not None
        assert again.addresses is stored
        assert again.address_texts == ("93.184.216.34",)
        assert core.pin_cached(principal, host, 443, loaded) is again
    finally:
        await resolver.close()


async def test_a_changed_answer_is_vetted_again_not_reused(fake_dns: FakeDNS) -> None:
    fake_dns.add("changed.example.com", "93.184.216.34", ttl=SHORT_TTL_S)
    loaded, clock, resolver, core = _core(fake_dns, 4)
    principal = loaded.policy.principals["default"]
    host = vet_host("changed.example.com")
    try:
        await core.pin(principal, host, 443, loaded=loaded)
        assert core.pin_cached(principal, host, 443, loaded) is not None

        fake_dns.add("changed.example.com", "10.0.0.7", ttl=SHORT_TTL_S)
        await asyncio.sleep(SHORT_TTL_S + 0.2)  # past c-ares's own cache of the first answer
        clock.now += SHORT_TTL_S + 1
        with pytest.raises(GatewayError) as by_pin:
            await core.pin(principal, host, 443, loaded=loaded)
        assert by_pin.value.code is ErrorCode.BLOCKED_DESTINATION
        # The resolver keeps the answer it got; the remembered allow must not stand for it.
        assert [str(a) for a in resolver.cached_addresses("changed.example.com") or ()] == ["10.0.0.7"]
        with pytest.raises(GatewayError) as by_cache:
            core.pin_cached(principal, host, 443, loaded)
        assert by_cache.value.code is ErrorCode.BLOCKED_DESTINATION
    finally:
        await resolver.close()
