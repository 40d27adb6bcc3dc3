"""The policy-aware DNS listener: the pod's queries over UDP and TCP, one port per agent uid.

Owns the sockets and the flow of one query: principal of the port; for a plain A or AAAA question
(`wire.read_question`) the answer decided from the gateway's own resolver (`answers.py`); for
anything else `judge_query`, the forward to the gateway's own upstreams (only for an allowed
name), `judge_answer` and truncation for UDP; and one audit line (`event: "dns"`) and one count
per query. Queries in flight are bounded; past the bound a UDP query is dropped (the client
retries) and a TCP connection waits. A query that cannot be read gets FORMERR (or nothing, without
even a header) and its audit line, never a traceback.

Never forwards a query the verdict refused, never answers but from the upstream's reply or the
gateway's own vetted resolution of the asked name.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections.abc import Callable
from typing import Any, cast

from gateway.credentials.guard import OutboundGuard
from gateway.credentials.screen import RequestFacts
from gateway.dnsguard.answers import AddressAnswer, AddressAnswers
from gateway.dnsguard.upstream import Upstream
from gateway.dnsguard.verdict import fit_udp, judge_answer, judge_query, refused_reply
from gateway.dnsguard.wire import TYPE_A, TYPE_AAAA, Question, QuestionMemo, txid_of
from gateway.egress.target import EgressCore
from gateway.errors import GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.observe.audit_fields import client_fields, new_connection_id
from gateway.observe.loop_metrics import CounterChild
from gateway.policy.model import LoadedPolicy, Principal
from gateway.policy.transparent import KNOWN_QUERY_TYPES
from gateway.settings import ListenAddress
from gateway.tasks import spawn
from gateway.transparent.ports import assign_ports
from gateway.transparent.verdicts import principal_for_port

MAX_IN_FLIGHT = 1024
TCP_IDLE_S = 10.0
MAX_TCP_MESSAGE_BYTES = 65535


class DnsListener:
    def __init__(
        self, core: EgressCore, audit: AuditLog, upstream: Upstream, guard: OutboundGuard | None = None
    ) -> None:
        self.core = core
        self.audit = audit
        self.upstream = upstream
        self.guard = guard  # a credential placeholder in a name is refused (issue 26)
        self.answers = AddressAnswers(core)
        self.questions = QuestionMemo()
        self._query_counts: dict[tuple[str, str], CounterChild] = {}
        self.in_flight = 0
        self._transports: list[asyncio.BaseTransport] = []
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self, addresses: tuple[ListenAddress, ...], uids: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for listen in addresses:
            for assignment in assign_ports(listen.port, uids):
                transport, _ = await loop.create_datagram_endpoint(
                    functools.partial(_UdpQueries, self, assignment.uid), local_addr=(listen.host, assignment.port)
                )
                self._transports.append(transport)
                server = await loop.create_server(
                    functools.partial(_TcpQueries, self, assignment.uid),
                    listen.host,
                    assignment.port,
                    reuse_address=True,
                )
                self._servers.append(server)

    def close(self) -> None:
        for transport in self._transports:
            transport.close()
        for server in self._servers:
            server.close()
        self.upstream.close()

    def answer_remembered(self, data: bytes, uid: int | None, *, tcp: bool, peer: object = None) -> bytes | None:
        """The reply at once, without a task, when the query is a plain address question whose answer
        is already decided for the port's principal; None sends it to `answer`."""
        question = self.questions.read(data)
        if question is None or question.qtype not in (TYPE_A, TYPE_AAAA):
            return None
        loaded = self.core.loaded
        qtype = "A" if question.qtype == TYPE_A else "AAAA"
        if qtype not in loaded.policy.transparent.dns_allow_types:
            return None
        try:
            principal = principal_for_port(loaded, uid)
        except GatewayError:
            return None
        remembered = self.answers.remembered(principal, question, loaded.generation)
        if remembered is None or self._screened_out(principal, question.name, loaded):
            return None
        started = time.perf_counter()
        client = {"conn": new_connection_id(), **client_fields(peer)}
        self._record_answer(
            principal.name, question, qtype=qtype, answer=remembered, generation=loaded.generation,
            started=started, client=client,
        )  # fmt: skip
        return remembered.reply(txid_of(data), question, tcp=tcp, now=self.answers.clock())

    async def answer(self, data: bytes, uid: int | None, *, tcp: bool, peer: object = None) -> bytes | None:
        """The reply to one query (None: nothing can be answered, e.g. not even a header)."""
        loaded = self.core.loaded
        policy = loaded.policy
        started = time.perf_counter()
        # One id per query, and the client's address: what every audit line carries.
        client = {"conn": new_connection_id(), **client_fields(peer)}
        try:
            principal = principal_for_port(loaded, uid)
        except GatewayError as error:
            self._record(
                None, "", "", decision="deny", code=str(error.code), reason=error.message, answers=0,
                generation=loaded.generation, started=started, client=client,
            )  # fmt: skip
            return None
        question = self.questions.read(data)
        if question is not None and question.qtype in (TYPE_A, TYPE_AAAA):
            qtype = "A" if question.qtype == TYPE_A else "AAAA"
            if qtype in policy.transparent.dns_allow_types and not self._screened_out(principal, question.name, loaded):
                answer = self.answers.remembered(principal, question, loaded.generation)
                if answer is None:
                    answer = await self.answers.decide(principal, question, loaded)
                if answer is not None:
                    self._record_answer(
                        principal.name, question, qtype=qtype, answer=answer, generation=loaded.generation,
                        started=started, client=client,
                    )  # fmt: skip
                    return answer.reply(txid_of(data), question, tcp=tcp, now=self.answers.clock())
        verdict = judge_query(data, policy, principal)
        if verdict.name and self.guard is not None:
            facts = RequestFacts("dns", principal.name, "", verdict.name, None)
            misuse = self.guard.screen_dns_name(facts, policy, principal)
            if misuse is not None:
                self._record(
                    principal.name, verdict.name, verdict.qtype, decision="deny", code=str(misuse.code),
                    reason=misuse.message, answers=0, generation=loaded.generation, started=started,
                    rule=misuse.rule, client=client,
                )  # fmt: skip
                return refused_reply(data)
        if not verdict.forward:
            self._record(
                principal.name, verdict.name, verdict.qtype, decision="deny", code=verdict.code,
                reason=verdict.reason, answers=0, generation=loaded.generation, started=started,
                rule=verdict.rule, rule_pattern=verdict.rule_pattern, client=client,
            )  # fmt: skip
            return verdict.reply
        try:
            raw = await self.upstream.forward(data, tcp=tcp)
        except GatewayError as error:
            self._record(
                principal.name, verdict.name, verdict.qtype, decision="error", code=str(error.code),
                reason=error.message, answers=0, generation=loaded.generation, started=started,
                rule=verdict.rule, rule_pattern=verdict.rule_pattern, client=client,
            )  # fmt: skip
            return None
        judged = judge_answer(data, raw, policy, principal, self.core.guard_for(loaded))
        would = verdict.would_deny
        decision = "deny" if judged.code else ("would_deny" if would is not None else "allow")
        self._record(
            principal.name,
            verdict.name,
            verdict.qtype,
            decision=decision,
            code=judged.code or (str(would.code) if would is not None else None),
            reason=judged.reason or (would.message if would is not None else ""),
            answers=judged.answers,
            generation=loaded.generation,
            started=started,
            rule=judged.rule or verdict.rule,
            rule_pattern=judged.rule_pattern if judged.rule else verdict.rule_pattern,
            client=client,
        )
        return judged.reply if tcp else fit_udp(judged.reply, verdict.udp_limit)

    def _screened_out(self, principal: Principal, name: str, loaded: LoadedPolicy) -> bool:
        """Whether the credential guard refuses the name: the general path then refuses and says why."""
        if self.guard is None:
            return False
        facts = RequestFacts("dns", principal.name, "", name, None)
        return self.guard.screen_dns_name(facts, loaded.policy, principal) is not None

    def _record_answer(
        self,
        principal: str,
        question: Question,
        *,
        qtype: str,
        answer: AddressAnswer,
        generation: int,
        started: float,
        client: dict[str, Any],
    ) -> None:
        self._record(
            principal, question.name, qtype, decision="deny" if answer.rcode else "allow", code=answer.code,
            reason=answer.reason, answers=answer.count(question.qtype), generation=generation, started=started,
            rule=answer.rule, rule_pattern=answer.rule_pattern, client=client,
        )  # fmt: skip

    def _record(
        self,
        principal: str | None,
        name: str,
        qtype: str,
        *,
        decision: str,
        code: str | None,
        reason: str,
        answers: int,
        generation: int,
        started: float,
        rule: str | None = None,
        rule_pattern: str | None = None,
        client: dict[str, Any] | None = None,
    ) -> None:
        labels = (decision, qtype if qtype in KNOWN_QUERY_TYPES else "OTHER")
        count = self._query_counts.get(labels)
        if count is None:
            # A child per label pair, remembered: `labels()` per query builds a key and looks it up.
            count = self._query_counts[labels] = metrics.DNS_QUERIES.labels(*labels)
        count.value += 1
        # A query the upstream failed is the policy's allow with the failure as the outcome.
        self.audit.decision(
            kind="dns",
            principal=principal,
            host=name or None,
            port=None,
            decision="deny" if decision == "error" else decision,
            code=code,
            reason=reason or None,
            generation=generation,
            rule=rule,
            rule_pattern=rule_pattern,
            qtype=qtype or None,
            answers=answers,
            duration_s=round((time.perf_counter() - started) * 1e6) / 1e6,
            **(client or {}),
        )


class _UdpQueries(asyncio.DatagramProtocol):
    def __init__(self, listener: DnsListener, uid: int | None) -> None:
        self.listener = listener
        self.uid = uid
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        listener = self.listener
        reply = listener.answer_remembered(data, self.uid, tcp=False, peer=addr)
        if reply is not None:
            if self.transport is not None:
                self.transport.sendto(reply, addr)
            return
        if listener.in_flight >= MAX_IN_FLIGHT:
            return
        listener.in_flight += 1
        spawn(self._answer(data, addr), name="dns-udp")

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            reply = await self.listener.answer(data, self.uid, tcp=False, peer=addr)
        finally:
            self.listener.in_flight -= 1
        if reply is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply, addr)


class _TcpQueries(asyncio.Protocol):
    """RFC 7766: two-byte length-prefixed messages; several may come on one connection."""

    def __init__(self, listener: DnsListener, uid: int | None) -> None:
        self.listener = listener
        self.uid = uid
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.idle: asyncio.TimerHandle | None = None
        self.pending = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._arm(self.transport.close)

    def _arm(self, callback: Callable[[], object]) -> None:
        if self.idle is not None:
            self.idle.cancel()
        self.idle = asyncio.get_running_loop().call_later(TCP_IDLE_S, callback)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        self._arm(self.transport.close)
        while len(self.buffer) >= 2:
            (length,) = struct.unpack_from("!H", self.buffer)
            if len(self.buffer) < 2 + length:
                return
            message = bytes(self.buffer[2 : 2 + length])
            del self.buffer[: 2 + length]
            self.pending += 1
            spawn(self._answer(message), name="dns-tcp")

    async def _answer(self, message: bytes) -> None:
        try:
            peer = self.transport.get_extra_info("peername") if self.transport is not None else None
            reply = await self.listener.answer(message, self.uid, tcp=True, peer=peer)
        finally:
            self.pending -= 1
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if reply is None:
            transport.close()
            return
        transport.write(struct.pack("!H", len(reply)) + reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.idle is not None:
            self.idle.cancel()
