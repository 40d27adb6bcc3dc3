"""The transparent listener's `TunnelSurface`: what makes a tunnel attempt a redirected connection's.

Owns what a transparent connection's attempt does differently from a CONNECT's: the principal is
the listener port's (found as the connection was accepted, in its `ClientContext`), the name is
the ClientHello's SNI (vetted behind a bounded cache), or the original address itself when the
ClientHello names none and `defaults.literal_ips` allows it, the port is the one the agent
dialed, `destination: strict` narrows the decision to the original address
(`destination.pin_destination`), a raw TCP exception is decided on the original address alone
(`raw_target`), the tunnel is reserved only once a splice is chosen (an inspected connection is
limited per request), the SNI gate is off (the name *is* the SNI: nothing is left to compare),
and the client is told nothing (it reads the server's bytes, or the close). Decision lines carry
`original_dst` (the context's).

Never dials, never writes to the client or the audit log itself (the attempt does).
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple, Protocol

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.observe import metrics
from gateway.policy.model import SniMode
from gateway.proxy.decision.context import ClientContext
from gateway.proxy.tunnel.attempt import Inspection, TunnelAttempt
from gateway.proxy.tunnel.opener import TunnelOpener
from gateway.transparent.destination import pin_destination, raw_rules_for_port
from gateway.vet.addresses import IPAddress
from gateway.vet.urls import VettedHost, vet_host

KIND = "transparent"
MAX_CACHED_HOSTS = 4096

# The ask of a transparent attempt: the ClientHello's server name, None when it names none.
ServerName = str | None


class RawRefusal(NamedTuple):
    """A raw TCP rule named the connection, but the address guard refuses its address."""

    error: GatewayError
    host: str  # the rule's, for the deny line


class TransparentSide(Protocol):
    """What the surface reads from its listener (`listener.TransparentListener`) when needed."""

    @property
    def inspection(self) -> Inspection | None: ...


class TransparentSurface:
    """`TunnelSurface` of the transparent listener's TLS connections, one per listener."""

    __slots__ = ("_hosts", "latency", "listener", "loop", "opener")

    kind: str = KIND
    reserve_first: bool = False
    sni: SniMode | None = "off"  # the name is the SNI (or a raw rule's): nothing left to compare

    def __init__(self, listener: TransparentSide, opener: TunnelOpener) -> None:
        self.listener = listener
        self.opener = opener
        self.latency = metrics.CONNECT_SECONDS.labels(KIND)
        self._hosts: BoundedMemo[str, VettedHost] = BoundedMemo(MAX_CACHED_HOSTS)
        self.loop: asyncio.AbstractEventLoop | None = None  # the listener's, set as it starts

    @property
    def inspection(self) -> Inspection | None:
        return self.listener.inspection

    def vetted_host(self, name: str) -> VettedHost:
        """`vet_host` behind a bounded cache: IDNA canonicalisation per connection costs more than
        the rest of a cached decision, and agents reach the same few names again and again."""
        host = self._hosts.get(name)
        return host if host is not None else self._hosts.put(name, vet_host(name))

    def identify(self, attempt: TunnelAttempt[ServerName]) -> None:
        """The port's principal is the context's already; the name is the SNI's, or the literal."""
        original = attempt.context.original
        assert original is not None  # every connection of this listener was redirected
        address, attempt.port = original
        server_name = attempt.host_name = attempt.ask
        if server_name is None:
            if attempt.loaded.policy.defaults.literal_ips != "allow":
                raise GatewayError(
                    ErrorCode.POLICY_DENIED,
                    "the TLS ClientHello names no server (SNI) and literal_ips is deny",
                    rule="defaults.literal_ips",
                    rule_pattern="deny",
                )
            host = VettedHost(str(address), address)
        else:
            host = self.vetted_host(server_name)
        attempt.host, attempt.host_name = host, host.name

    async def raw_target(self, context: ClientContext) -> PinnedTarget | RawRefusal | None:
        """A raw TCP exception, decided on the original address alone, before any first flight
        (a server-speaks-first protocol such as SMTP sends nothing until greeted): the address
        must be a rule's (or among its name's vetted addresses) and pass the address guard; the
        target is that very address. None: no rule of this port names it."""
        original, loaded = context.original, context.loaded
        assert original is not None
        assert loaded is not None
        address, port = original
        core = self.opener.core
        for rule in raw_rules_for_port(loaded.policy.transparent, port):
            try:
                if rule.ip is not None:
                    if rule.ip != address:
                        continue
                    addresses: tuple[IPAddress, ...] = (rule.ip,)
                else:
                    addresses = (await core.resolver.resolve(rule.host)).addresses
                    if address not in addresses:
                        continue
                verdict = core.guard_for(loaded).vet(address)
                if not verdict.allowed:
                    raise GatewayError(
                        ErrorCode.BLOCKED_DESTINATION,
                        f"raw TCP to {verdict.reason}",
                        rule=verdict.rule,
                        rule_pattern=verdict.pattern,
                    )
            except GatewayError as error:
                return RawRefusal(error, rule.host)
            return PinnedTarget(
                VettedHost(rule.host, rule.ip),
                port,
                (address,),
                loaded.generation,
                0.0,
                rule="transparent.raw_tcp",
                rule_pattern=f"{rule.host}:{rule.port}",
            )
        return None

    def claimed_principal(self, attempt: TunnelAttempt[ServerName]) -> str | None:
        return None  # the port names the principal: there is always one

    def destination(self, attempt: TunnelAttempt[ServerName], target: PinnedTarget) -> PinnedTarget:
        original = attempt.context.original
        assert original is not None
        return pin_destination(attempt.loaded.policy.transparent, target, original[0])

    def established(self, conn: object) -> bytes:
        return b""  # the client already thinks it is connected

    def refusal(self, error: GatewayError, conn: object) -> bytes:
        return b""  # a refusal is the close (the deny line says why)
