"""The DNS listener's answers to address queries, decided once and remembered while they hold.

An A or AAAA query for a name is answered from the gateway's own resolver (`EgressCore.resolver`,
its cache and its kept-open c-ares sockets), vetted exactly as a connection to that name would be
(`decide_destination` on the name, `decide_addresses` on every address it resolved to, both
families: the answer is what the gateway itself would dial, or the denied answer). The outcome is
remembered per (principal, name, type, policy generation) until the resolver's TTL runs out (a
name the policy refuses: until the generation changes, within a bound), so a repeated query costs
a dictionary lookup and a few `struct.pack`s instead of two dnslib parses, a vet and a forward.

Never forwards a raw query (server.py's general path does, for every other shape and type) and
never answers for a principal other than the one it is asked for.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.dnsguard.wire import (
    RCODE_NXDOMAIN,
    RCODE_REFUSED,
    TYPE_A,
    Question,
    address_reply,
    answer_records,
    rcode_reply,
)
from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import decide_addresses, decide_destination
from gateway.policy.model import LoadedPolicy, Principal
from gateway.vet.addresses import IPAddress
from gateway.vet.urls import vet_host

MAX_REMEMBERED = 4096
# A name the policy refuses stays refused until a reload (the generation is in the key); the bound
# only keeps an idle entry from living forever.
NAME_VERDICT_S = 300.0


@dataclass(frozen=True, slots=True)
class AddressAnswer:
    """One decided answer: the addresses to give (allowed), or the rcode to give (denied)."""

    expires: float
    addresses: tuple[IPAddress, ...] = ()
    rcode: int = 0
    code: str | None = None
    reason: str = ""
    rule: str | None = None
    rule_pattern: str | None = None
    # The answer section per (type, whole seconds of TTL left): built once per second, not per query.
    _sections: dict[tuple[int, int], tuple[int, bytes]] = field(default_factory=dict, compare=False)
    _counts: dict[int, int] = field(default_factory=dict, compare=False)

    def reply(self, txid: int, query: Question, *, tcp: bool, now: float) -> bytes:
        if self.rcode:
            return rcode_reply(txid, query, self.rcode)
        key = (query.qtype, int(self.expires - now))
        section = self._sections.get(key)
        if section is None:
            self._sections.clear()  # the seconds before are gone for good
            section = self._sections[key] = answer_records(query.qtype, self.addresses, key[1])
        return address_reply(txid, query, section, tcp=tcp)

    def count(self, qtype: int) -> int:
        """How many records of the asked family the answer carries."""
        if self.rcode:
            return 0
        v4 = self._counts.get(qtype)
        if v4 is None:
            family = 4 if qtype == TYPE_A else 6
            v4 = self._counts[qtype] = sum(1 for address in self.addresses if address.version == family)
        return v4


class AddressAnswers:
    def __init__(self, core: EgressCore, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = core
        self.clock = clock
        self._remembered: OrderedDict[tuple[str, str, int, int], AddressAnswer] = OrderedDict()

    def remembered(self, principal: Principal, query: Question, generation: int) -> AddressAnswer | None:
        key = (principal.name, query.name, query.qtype, generation)
        entry = self._remembered.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            del self._remembered[key]
            return None
        self._remembered.move_to_end(key)
        return entry

    async def decide(self, principal: Principal, query: Question, loaded: LoadedPolicy) -> AddressAnswer | None:
        """Decide and remember; None when the general path must answer (report mode, where the
        answer is passed with a would-deny note, or a lookup failure, whose exact rcode the
        upstream gives)."""
        policy = loaded.policy
        if policy.mode_for(principal) != "enforce":
            return None
        denied = RCODE_NXDOMAIN if policy.transparent.dns_denied_answer == "nxdomain" else RCODE_REFUSED
        now = self.clock()
        try:
            host = vet_host(query.name)
            # The name rules only: any port the policy allows stands in, the port is not in question.
            decision = decide_destination(policy, principal, host, policy.defaults.ports[0])
            if not decision.allowed:
                raise decision.to_error()
        except GatewayError as error:
            return self._remember(principal, query, loaded, _denied(now + NAME_VERDICT_S, denied, error))
        try:
            resolution = await self.core.resolver.resolve(host.name)
        except GatewayError as error:
            if error.code != ErrorCode.BLOCKED_DESTINATION:
                return None
            # An alias of a refused name (`*.internal`...): as the proxy refuses it, so does DNS.
            return self._remember(principal, query, loaded, _denied(now + NAME_VERDICT_S, denied, error))
        expires = now + resolution.ttl_s
        vetted = decide_addresses(self.core.guard_for(loaded), principal, query.name, resolution.addresses)
        if not vetted.allowed:
            answer = AddressAnswer(
                expires, rcode=denied, code=str(vetted.code), reason=vetted.reason,
                rule=vetted.rule, rule_pattern=vetted.pattern,
            )  # fmt: skip
        else:
            answer = AddressAnswer(expires, resolution.addresses, rule=decision.rule, rule_pattern=decision.pattern)
        return self._remember(principal, query, loaded, answer)

    def _remember(
        self, principal: Principal, query: Question, loaded: LoadedPolicy, answer: AddressAnswer
    ) -> AddressAnswer:
        self._remembered[(principal.name, query.name, query.qtype, loaded.generation)] = answer
        while len(self._remembered) > MAX_REMEMBERED:
            self._remembered.popitem(last=False)
        return answer


def _denied(expires: float, rcode: int, error: GatewayError) -> AddressAnswer:
    return AddressAnswer(
        expires, rcode=rcode, code=str(error.code), reason=error.message,
        rule=error.rule, rule_pattern=error.rule_pattern,
    )  # fmt: skip
