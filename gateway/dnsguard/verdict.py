"""The DNS listener's decisions on wire-format messages: may a query go upstream, may its answer
come back. dnslib reads and writes the wire format.

A query is forwarded only when it is one ordinary question, of a type the policy allows, for a
name the principal may reach (the same domain rules as every connection). A denied name gets
NXDOMAIN or REFUSED and is never sent anywhere: a name is itself data (`<secret>.attacker.example`).
An answer comes back only when every address in it passes the address guard (a name that answers
a private or metadata address gets the denied answer too). Replies larger than the client can take
over UDP are truncated with TC set so it asks again over TCP.

Pure: bytes and policy values in, bytes and a verdict out. Never opens a socket.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from dnslib import CLASS, QTYPE, RCODE, DNSError, DNSHeader, DNSQuestion, DNSRecord

from gateway.dnsguard.wire import MAX_LABEL_BYTES, MAX_NAME_BYTES, header_only_reply
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import decide_addresses, decide_destination
from gateway.policy.model import Policy, Principal
from gateway.vet.addresses import AddressGuard, IPAddress
from gateway.vet.urls import vet_host

# RFC 1035 section 4.2.1: without EDNS0 a UDP reply is at most 512 bytes; RFC 6891 lets the
# client announce more, which we honour up to a sane bound.
CLASSIC_UDP_BYTES = 512
MAX_UDP_BYTES = 4096
OPT_TYPE = 41
ADDRESS_TYPES = frozenset({QTYPE.A, QTYPE.AAAA})


@dataclass(frozen=True, slots=True)
class QueryVerdict:
    """What to do with one query: forward it, or answer `reply` at once."""

    name: str
    qtype: str
    forward: bool
    reply: bytes | None = None
    code: str | None = None
    reason: str = ""
    udp_limit: int = CLASSIC_UDP_BYTES
    would_deny: GatewayError | None = None
    # The rule that decided (the audit line's `rule` and `rule_pattern`).
    rule: str | None = None
    rule_pattern: str | None = None


def _qtype_name(value: int) -> str:
    try:
        return str(QTYPE[value])
    except (KeyError, DNSError):
        return f"TYPE{value}"


def _rcode_reply(query: DNSRecord, rcode: int) -> bytes:
    reply = query.reply()
    reply.header.rcode = rcode
    reply.header.aa = 0
    return bytes(reply.pack())


def _within_limits(query: DNSRecord) -> bool:
    """Every question name within RFC 1035's limits (labels of 63 bytes, names of 255 on the wire).

    dnslib reads a longer label or name without complaint but refuses to write one back
    (DNSLabelError), so a reply echoing such a question would raise inside the handler: the
    query is refused as malformed before anything is echoed.
    """
    for question in query.questions:
        labels = question.qname.label
        if (
            any(len(label) > MAX_LABEL_BYTES for label in labels)
            or sum(len(x) + 1 for x in labels) + 1 > MAX_NAME_BYTES
        ):
            return False
    return True


def refused_reply(data: bytes) -> bytes | None:
    """REFUSED for a query another check refused (a credential placeholder in its name)."""
    query = parse_query(data)
    return None if query is None else _rcode_reply(query, RCODE.REFUSED)


def _udp_limit(query: DNSRecord) -> int:
    for record in query.ar:
        if record.rtype == OPT_TYPE:
            return max(CLASSIC_UDP_BYTES, min(int(record.rclass), MAX_UDP_BYTES))
    return CLASSIC_UDP_BYTES


def _refused(
    query: DNSRecord, name: str, qtype: str, rcode: int, error: GatewayError, *, udp_limit: int
) -> QueryVerdict:
    """A name that is never sent upstream (unvettable, or denied by the policy): `rcode` at once,
    with the refusal's code, reason and rule for the audit line."""
    return QueryVerdict(
        name,
        qtype,
        forward=False,
        reply=_rcode_reply(query, rcode),
        code=str(error.code),
        reason=error.message,
        udp_limit=udp_limit,
        rule=error.rule,
        rule_pattern=error.rule_pattern,
    )


def parse_query(data: bytes) -> DNSRecord | None:
    try:
        return DNSRecord.parse(data)
    except (DNSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def judge_query(data: bytes, policy: Policy, principal: Principal) -> QueryVerdict:
    """The verdict on one query from `principal`; malformed input gets FORMERR (or nothing)."""
    query = parse_query(data)
    if query is None:
        return QueryVerdict(
            "", "", forward=False, reply=header_only_reply(data, RCODE.FORMERR),
            code=str(ErrorCode.INVALID_INPUT), reason="malformed DNS message",
        )  # fmt: skip
    if not _within_limits(query):
        return QueryVerdict(
            "", "", forward=False, reply=header_only_reply(data, RCODE.FORMERR), code=str(ErrorCode.INVALID_INPUT),
            reason="a label over 63 bytes or a name over 255 bytes",
        )  # fmt: skip
    denied_rcode = RCODE.NXDOMAIN if policy.transparent.dns_denied_answer == "nxdomain" else RCODE.REFUSED
    if query.header.qr or query.header.opcode != 0 or len(query.questions) != 1:
        return QueryVerdict(
            "",
            "",
            forward=False,
            reply=_rcode_reply(query, RCODE.FORMERR),
            code=str(ErrorCode.INVALID_INPUT),
            reason="not one standard query",
        )
    question = query.questions[0]
    name = str(question.qname).rstrip(".").lower()
    qtype = _qtype_name(question.qtype)
    limit = _udp_limit(query)
    if question.qclass != CLASS.IN or qtype not in policy.transparent.dns_allow_types:
        return QueryVerdict(
            name,
            qtype,
            forward=False,
            reply=_rcode_reply(query, RCODE.REFUSED),
            code=str(ErrorCode.POLICY_DENIED),
            reason=f"query type {qtype} is not in transparent.dns.allow_types",
            udp_limit=limit,
            rule="transparent.dns.allow_types",
            rule_pattern=",".join(policy.transparent.dns_allow_types),
        )
    try:
        host = vet_host(name)
        # The name rules only: any port the policy allows stands in, the port is not in question.
        decision = decide_destination(policy, principal, host, policy.defaults.ports[0])
    except GatewayError as error:
        return _refused(query, name, qtype, denied_rcode, error, udp_limit=limit)
    if not decision.allowed:
        refusal = decision.to_error()
        if policy.mode_for(principal) != "report":
            return _refused(query, name, qtype, denied_rcode, refusal, udp_limit=limit)
        return QueryVerdict(
            name,
            qtype,
            forward=True,
            udp_limit=limit,
            would_deny=refusal,
            rule=decision.rule,
            rule_pattern=decision.pattern,
        )
    return QueryVerdict(name, qtype, forward=True, udp_limit=limit, rule=decision.rule, rule_pattern=decision.pattern)


@dataclass(frozen=True, slots=True)
class AnswerVerdict:
    reply: bytes
    answers: int
    code: str | None = None
    reason: str = ""
    truncated_upstream: bool = False
    rule: str | None = None
    rule_pattern: str | None = None


def judge_answer(
    query_bytes: bytes, answer_bytes: bytes, policy: Policy, principal: Principal, guard: AddressGuard
) -> AnswerVerdict:
    """Pass an upstream answer back only when every address in it is allowed."""
    query = parse_query(query_bytes)
    answer = parse_query(answer_bytes)
    assert query is not None  # judge_query parsed it before it was forwarded
    if answer is None or answer.header.id != query.header.id or not answer.header.qr:
        return AnswerVerdict(
            _rcode_reply(query, RCODE.SERVFAIL), 0, str(ErrorCode.DNS_FAILURE), "malformed upstream answer"
        )
    name = str(query.questions[0].qname).rstrip(".").lower()
    addresses: list[IPAddress] = []
    for record in [*answer.rr, *answer.ar]:
        if record.rtype in ADDRESS_TYPES:
            addresses.append(ipaddress.ip_address(str(record.rdata)))
    if addresses:
        vetted = decide_addresses(guard, principal, name, addresses)
        if not vetted.allowed and policy.mode_for(principal) != "report":
            denied = RCODE.NXDOMAIN if policy.transparent.dns_denied_answer == "nxdomain" else RCODE.REFUSED
            assert vetted.code is not None
            return AnswerVerdict(
                _rcode_reply(query, denied),
                0,
                str(vetted.code),
                vetted.reason,
                rule=vetted.rule,
                rule_pattern=vetted.pattern,
            )
    return AnswerVerdict(bytes(answer_bytes), len(answer.rr), truncated_upstream=bool(answer.header.tc))


def fit_udp(reply: bytes, limit: int) -> bytes:
    """A reply too large for the client's UDP buffer becomes its header and question with TC set."""
    if len(reply) <= limit:
        return reply
    try:
        record = DNSRecord.parse(reply)
        header = DNSHeader(id=record.header.id, bitmap=record.header.bitmap, tc=1)
        header.rcode = record.header.rcode
        questions: list[DNSQuestion] = list(record.questions)
        return bytes(DNSRecord(header, q=questions[0] if questions else None).pack())
    except (DNSError, ValueError, IndexError, UnicodeDecodeError):
        # An upstream reply dnslib cannot read back or write again (DNSLabelError is a DNSError).
        return (header_only_reply(reply, RCODE.SERVFAIL) or b"")[:12]
