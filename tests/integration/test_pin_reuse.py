"""`EgressCore.pin` reuses the name verdict `pin_cached` made on a resolver miss (issue 11).

Real resolver against the fake DNS. The second policy object carries the same generation but
denies the name: a `pin` that decided the name again would refuse, one that reuses the verdict
of the `pin_cached` before it (same generation, same principal, host and port) does not.
"""

from __future__ import annotations

import dataclasses

import pytest

from gateway.egress.own_addresses import own_addresses
from gateway.egress.resolver import Resolver
from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.holder import FixedPolicy
from gateway.policy.load import parse_policy
from gateway.policy.model import EgressRule, LoadedPolicy
from gateway.vet.urls import vet_host
from tests.harness.dns import FakeDNS

POLICY = 'version: 1\nprincipals: {default: {egress: {allow_domains: ["*"]}}}\n'


async def test_pin_after_a_pin_cached_miss_does_not_decide_the_name_again(fake_dns: FakeDNS) -> None:
    fake_dns.add("reuse.example.com", "93.184.216.34")
    allowing = LoadedPolicy(parse_policy(POLICY), 7)
    principal = allowing.policy.principals["default"]
    denying_principal = dataclasses.replace(principal, egress=EgressRule(deny_domains=("*",)))
    denying = LoadedPolicy(
        dataclasses.replace(allowing.policy, principals={"default": denying_principal}), allowing.generation
    )
    resolver = Resolver([fake_dns.nameserver], timeout_s=1.0, tries=1)
    core = EgressCore(resolver, FixedPolicy(allowing), own_addresses(["127.0.0.1"]))
    host = vet_host("reuse.example.com")
    try:
        assert core.pin_cached(principal, host, 443, allowing) is None  # DNS must be asked
        target = await core.pin(denying_principal, host, 443, loaded=denying)
        assert [str(a) for a in target.addresses] == ["93.184.216.34"]
        # Without a pin_cached before it, the same pin decides the name, and refuses it.
        with pytest.raises(GatewayError) as caught:
            await core.pin(denying_principal, host, 443, loaded=denying)
        assert caught.value.code is ErrorCode.POLICY_DENIED
    finally:
        await resolver.close()
