"""Callers asking for a name whose lookup is in flight share it: one A and one AAAA query per burst.

Real resolver against the fake DNS, which counts the queries it is sent and holds its answer for
a moment so that the callers really overlap.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.egress.resolver import Resolver
from gateway.errors import ErrorCode, GatewayError
from tests.harness.dns import FakeDNS

BURST = 20
HOLD_S = 0.3


def _queries_for(dns: FakeDNS, name: str) -> list[str]:
    return sorted(qtype for qname, qtype in dns.queries if qname.rstrip(".").lower() == name)


async def test_a_burst_for_one_name_sends_one_query_pair_and_all_get_the_answer(fake_dns: FakeDNS) -> None:
    fake_dns.add("burst.example.com", "93.184.216.34", ttl=60, delay_s=HOLD_S)
    resolver = Resolver([fake_dns.nameserver])
    try:
        answers = await asyncio.gather(*(resolver.resolve("burst.example.com") for _ in range(BURST)))
    finally:
        await resolver.close()
    assert {str(a) for answer in answers for a in answer.addresses} == {"93.184.216.34"}
    assert _queries_for(fake_dns, "burst.example.com") == ["A", "AAAA"]


async def test_a_caller_that_gives_up_does_not_cancel_the_lookup_the_others_wait_on(fake_dns: FakeDNS) -> None:
    fake_dns.add("patient.example.com", "93.184.216.35", ttl=60, delay_s=HOLD_S)
    resolver = Resolver([fake_dns.nameserver])
    try:
        impatient = asyncio.ensure_future(resolver.resolve("patient.example.com"))
        patient = asyncio.ensure_future(resolver.resolve("patient.example.com"))
        await asyncio.sleep(0)  # both are waiting on the one lookup
        impatient.cancel()
        answer = await asyncio.wait_for(patient, 10)
        with pytest.raises(asyncio.CancelledError):
            await impatient
    finally:
        await resolver.close()
    assert [str(a) for a in answer.addresses] == ["93.184.216.35"]
    assert _queries_for(fake_dns, "patient.example.com") == ["A", "AAAA"]


async def test_a_shared_failure_reaches_every_caller_and_is_not_remembered(fake_dns: FakeDNS) -> None:
    fake_dns.fail("gone.example.com", "NXDOMAIN")
    resolver = Resolver([fake_dns.nameserver])
    try:
        outcomes = await asyncio.gather(
            *(resolver.resolve("gone.example.com") for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(o, GatewayError) and o.code is ErrorCode.DNS_FAILURE for o in outcomes), outcomes
        assert _queries_for(fake_dns, "gone.example.com") == ["A", "AAAA"]
        fake_dns.add("gone.example.com", "93.184.216.36", ttl=60)
        again = await resolver.resolve("gone.example.com")
    finally:
        await resolver.close()
    assert [str(a) for a in again.addresses] == ["93.184.216.36"]
