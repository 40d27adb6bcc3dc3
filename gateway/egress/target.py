"""From (principal, host, port) to a `PinnedTarget`: policy, resolution and address vetting.

This is the single decision path every outbound byte goes through, for the proxy and the tools
alike: the policy decision on the name, resolution by the gateway's own resolver, and the
address guard on every answer. The connection layer may only dial addresses of a PinnedTarget
produced here, in the same call: no second lookup can sneak a rebinding in between.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.egress.addresses import AddressGuard, IPAddress
from gateway.egress.resolver import Resolver
from gateway.egress.urls import VettedHost
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import decide_addresses, decide_destination
from gateway.policy.load import LoadedPolicy
from gateway.policy.model import Principal
from gateway.settings import ListenAddress


@dataclass(frozen=True, slots=True)
class PinnedTarget:
    host: VettedHost
    port: int
    addresses: tuple[IPAddress, ...]
    generation: int
    dns_s: float
    would_deny: GatewayError | None = None

    @property
    def name(self) -> str:
        return self.host.name


def self_addresses(listeners: tuple[ListenAddress, ...]) -> tuple[IPAddress, ...]:
    """The gateway's own listening addresses: never a destination (no connecting back to itself)."""
    out: list[IPAddress] = []
    for listener in listeners:
        ip = ipaddress.ip_address(listener.host)
        if ip.is_unspecified:
            out.extend([ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")])
        else:
            out.append(ip)
    return tuple(out)


class EgressCore:
    """Holds the resolver and the per-generation address guard; decides and pins targets."""

    def __init__(
        self,
        resolver: Resolver,
        policy_source: Callable[[], LoadedPolicy],
        listeners: tuple[ListenAddress, ...],
        on_dns: Callable[[float, bool], None] | None = None,
    ) -> None:
        self.resolver = resolver
        self._policy_source = policy_source
        self._self_addresses = self_addresses(listeners)
        self._guard_generation = -1
        self._guard = AddressGuard()
        self._on_dns = on_dns

    @property
    def loaded(self) -> LoadedPolicy:
        return self._policy_source()

    def guard_for(self, loaded: LoadedPolicy) -> AddressGuard:
        if loaded.generation != self._guard_generation:
            defaults = loaded.policy.defaults
            self._guard = AddressGuard(defaults.allow_cidrs, defaults.deny_cidrs, self._self_addresses)
            self._guard_generation = loaded.generation
        return self._guard

    async def pin(
        self, principal: Principal, host: VettedHost, port: int, *, loaded: LoadedPolicy | None = None
    ) -> PinnedTarget:
        """Decide, resolve and vet. Raises GatewayError on denial (enforce mode)."""
        loaded = loaded or self.loaded
        policy = loaded.policy
        report = policy.mode_for(principal) == "report"
        would_deny: GatewayError | None = None

        decision = decide_destination(policy, principal, host, port)
        if not decision.allowed:
            if not report:
                raise decision.to_error()
            would_deny = decision.to_error()

        dns_s = 0.0
        if host.ip is not None:
            addresses: tuple[IPAddress, ...] = (host.ip,)
        else:
            started = time.perf_counter()
            try:
                resolution = await self.resolver.resolve(host.name)
            finally:
                dns_s = time.perf_counter() - started
            if self._on_dns:
                self._on_dns(dns_s, True)
            addresses = resolution.addresses

        vetted = decide_addresses(self.guard_for(loaded), principal, host.name, addresses)
        if not vetted.allowed and would_deny is None:
            if not report or vetted.code == ErrorCode.DNS_FAILURE:
                raise vetted.to_error()
            would_deny = vetted.to_error()
        return PinnedTarget(host, port, addresses, loaded.generation, dns_s, would_deny)
