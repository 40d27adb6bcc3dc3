"""The DNS listener's verdicts on wire-format messages, without a socket."""

from __future__ import annotations

import ipaddress

import pytest
from dnslib import EDNS0, QTYPE, RCODE, RR, A, DNSRecord

from gateway.dnsguard.verdict import fit_udp, judge_answer, judge_query
from gateway.policy.load import parse_policy
from gateway.vet.addresses import AddressGuard

POLICY = parse_policy(
    """version: 1
principals:
  default: {egress: {allow_domains: [docs.example.org, "*.wiki.example"]}}
  shadow: {mode: report, egress: {allow_domains: [docs.example.org]}}
transparent:
  dns: {allow_types: [A, AAAA, MX]}
"""
)
REFUSING = parse_policy(
    """version: 1
principals:
  default: {egress: {allow_domains: [docs.example.org]}}
transparent:
  dns: {denied_answer: refused}
"""
)
DEFAULT = POLICY.principals["default"]


def _query(name: str, qtype: str = "A") -> bytes:
    return bytes(DNSRecord.question(name, qtype).pack())


@pytest.mark.parametrize(
    ("name", "qtype", "forward", "rcode"),
    [
        pytest.param("docs.example.org", "A", True, None, id="allowed-a"),
        pytest.param("DOCS.example.org.", "AAAA", True, None, id="case-and-dot"),
        pytest.param("en.wiki.example", "MX", True, None, id="allowed-type-by-policy"),
        pytest.param("secret.attacker.example", "A", False, RCODE.NXDOMAIN, id="denied-name"),
        pytest.param("docs.example.org", "TXT", False, RCODE.REFUSED, id="type-not-allowed"),
        pytest.param("docs.example.org", "ANY", False, RCODE.REFUSED, id="any"),
        pytest.param("wiki.example", "A", False, RCODE.NXDOMAIN, id="apex-not-in-glob"),
    ],
)
def test_query_verdicts(name: str, qtype: str, forward: bool, rcode: int | None) -> None:
    verdict = judge_query(_query(name, qtype), POLICY, DEFAULT)
    assert verdict.forward is forward
    if rcode is not None:
        assert verdict.reply is not None
        assert DNSRecord.parse(verdict.reply).header.rcode == rcode


def test_denied_answer_can_be_refused_instead_of_nxdomain() -> None:
    verdict = judge_query(_query("elsewhere.example"), REFUSING, REFUSING.principals["default"])
    assert verdict.reply is not None
    assert DNSRecord.parse(verdict.reply).header.rcode == RCODE.REFUSED


def test_report_mode_forwards_a_denied_name_and_says_it_would_deny() -> None:
    verdict = judge_query(_query("elsewhere.example"), POLICY, POLICY.principals["shadow"])
    assert verdict.forward
    assert verdict.would_deny is not None


@pytest.mark.parametrize(
    ("name", "code", "rule"),
    [
        pytest.param("bad_name.example", "unsafe_url", None, id="unvettable-name"),
        pytest.param("169.254.169.254", "unsafe_url", "defaults.literal_ips", id="ip-literal-name"),
        pytest.param("secret.attacker.example", "policy_denied", "default_deny", id="policy-denied-name"),
    ],
)
def test_a_refused_name_is_answered_at_once_with_its_rule_and_the_clients_udp_size(
    name: str, code: str, rule: str | None
) -> None:
    # A name the gateway cannot vet and a name the policy denies are one kind of refusal.
    query = DNSRecord.question(name, "A")
    query.add_ar(EDNS0(udp_len=1232))
    verdict = judge_query(bytes(query.pack()), POLICY, DEFAULT)
    assert not verdict.forward
    assert verdict.reply is not None
    assert DNSRecord.parse(verdict.reply).header.rcode == RCODE.NXDOMAIN
    assert (verdict.name, verdict.qtype, verdict.code, verdict.rule) == (name, "A", code, rule)
    assert verdict.reason
    assert verdict.udp_limit == 1232


def test_malformed_messages_get_no_forward() -> None:
    assert not judge_query(b"\x00\x01garbage", POLICY, DEFAULT).forward
    response = DNSRecord.question("docs.example.org").reply().pack()
    assert not judge_query(bytes(response), POLICY, DEFAULT).forward  # a response, not a query


def _answer(query: bytes, *addresses: str) -> bytes:
    reply = DNSRecord.parse(query).reply()
    for address in addresses:
        reply.add_answer(RR("docs.example.org", QTYPE.A, rdata=A(address), ttl=60))
    return bytes(reply.pack())


def test_an_answer_with_a_private_address_is_withheld() -> None:
    query = _query("docs.example.org")
    judged = judge_answer(query, _answer(query, "93.184.216.34", "10.0.0.5"), POLICY, DEFAULT, AddressGuard())
    assert judged.code == "blocked_destination"
    assert DNSRecord.parse(judged.reply).rr == []


def test_a_public_answer_passes_unchanged() -> None:
    query = _query("docs.example.org")
    answer = _answer(query, "93.184.216.34")
    judged = judge_answer(query, answer, POLICY, DEFAULT, AddressGuard())
    assert judged.code is None
    assert judged.reply == answer
    assert judged.answers == 1


def test_an_allow_cidr_exception_lets_an_answer_through() -> None:
    query = _query("docs.example.org")
    guard = AddressGuard(allow_cidrs=[ipaddress.ip_network("10.0.0.5/32")])
    assert judge_answer(query, _answer(query, "10.0.0.5"), POLICY, DEFAULT, guard).code is None


def test_an_answer_with_another_id_is_a_failure() -> None:
    query = _query("docs.example.org")
    other = DNSRecord.question("docs.example.org")
    other.header.id = (DNSRecord.parse(query).header.id + 1) % 65536
    judged = judge_answer(query, bytes(other.reply().pack()), POLICY, DEFAULT, AddressGuard())
    assert judged.code == "dns_failure"


def test_udp_replies_over_the_limit_are_truncated_with_tc() -> None:
    record = DNSRecord.question("docs.example.org")
    record.add_ar(EDNS0(udp_len=1232))
    reply = DNSRecord.parse(_answer(bytes(record.pack()), *(f"93.184.216.{i}" for i in range(60))))
    packed = bytes(reply.pack())
    assert len(packed) > 512
    truncated = DNSRecord.parse(fit_udp(packed, 512))
    assert truncated.header.tc == 1
    assert truncated.rr == []
    assert str(truncated.q.qname) == "docs.example.org."
    assert fit_udp(packed, 4096) == packed
