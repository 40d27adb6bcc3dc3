"""From (principal, host, port) to a `PinnedTarget`: policy, resolution and address vetting.

This is the single decision path every outbound byte goes through, for the proxy and the tools
alike: the policy decision on the name, resolution by the gateway's own resolver, and the
address guard on every answer. The connection layer may only dial addresses of a PinnedTarget
produced here, in the same call: no second lookup can sneak a rebinding in between. `pin` and
`pin_cached` run the very same checks; `pin_cached` only refuses to wait for the resolver.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.egress.resolver import Resolver
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import decide_addresses, decide_destination
from gateway.policy.model import LoadedPolicy, Principal
from gateway.settings import ListenAddress
from gateway.vet.addresses import AddressGuard, IPAddress
from gateway.vet.urls import VettedHost

# Allowed cached decisions kept per policy generation; cleared when full (agents reuse few hosts).
MAX_REMEMBERED_TARGETS = 4096


@dataclass(frozen=True, slots=True)
class PinnedTarget:
    host: VettedHost
    port: int
    addresses: tuple[IPAddress, ...]
    generation: int
    dns_s: float
    would_deny: GatewayError | None = None
    # `addresses` as text, formatted once per decision: the dialer and the audit line both need it,
    # and formatting an IP address is slow in pure Python.
    address_texts: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address_texts", tuple(str(address) for address in self.addresses))

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
        on_dns: Callable[[float], None] | None = None,
    ) -> None:
        self.resolver = resolver
        self._policy_source = policy_source
        self._self_addresses = self_addresses(listeners)
        self._guard_generation = -1
        self._guard = AddressGuard()
        self._on_dns = on_dns
        self._remembered_generation = -1
        self._remembered: dict[tuple[str, str, int], PinnedTarget] = {}
        # Set by the daemon to the audit log's refusal: no new egress while it cannot be written.
        self.admission: Callable[[], GatewayError | None] | None = None

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
        if self.admission is not None and (refusal := self.admission()) is not None:
            raise refusal
        loaded = loaded or self.loaded
        report, would_deny = self._decide_name(loaded, principal, host, port)
        dns_s = 0.0
        if host.ip is not None:
            addresses: tuple[IPAddress, ...] = (host.ip,)
        else:
            resolution = await self.resolver.resolve(host.name)
            dns_s = resolution.duration_s
            # Only real lookups are timed: a cache hit would pile zeros into the DNS histogram.
            if self._on_dns and not resolution.cached:
                self._on_dns(dns_s)
            addresses = resolution.addresses
        return self._vet_addresses(
            loaded, principal, host, port, addresses=addresses, report=report, would_deny=would_deny, dns_s=dns_s
        )

    def pin_cached(
        self, principal: Principal, host: VettedHost, port: int, loaded: LoadedPolicy
    ) -> PinnedTarget | None:
        """`pin` without awaiting: the same decision when no lookup is needed (an IP literal, or the
        resolver's cache answers), None when it would have to query (call `pin` then).

        Raises GatewayError on denial exactly as `pin` does: the name is judged by the policy, every
        cached answer is vetted against this generation's guard (the gateway's own addresses
        included), and report mode marks rather than refuses.
        """
        if self.admission is not None and (refusal := self.admission()) is not None:
            raise refusal
        if host.ip is not None:
            addresses: tuple[IPAddress, ...] = (host.ip,)
        else:
            cached = self.resolver.cached_addresses(host.name)
            if cached is None:
                # Judge the name anyway: a denied name is refused without waiting for DNS.
                self._decide_name(loaded, principal, host, port)
                return None
            addresses = cached
        # Both checks are pure functions of (policy generation, principal, host, port, addresses):
        # an allowed outcome for the same inputs is the same outcome, so it is remembered; a
        # denial is never remembered and is decided afresh (and audited) every time.
        if loaded.generation != self._remembered_generation:
            self._remembered.clear()
            self._remembered_generation = loaded.generation
        # Keyed without the addresses (hashing an IPv4Address runs Python code): the remembered
        # target is reused only when its addresses are the ones answered now.
        key = (principal.name, host.name, port)
        target = self._remembered.get(key)
        if target is None or (target.addresses is not addresses and target.addresses != addresses):
            report, would_deny = self._decide_name(loaded, principal, host, port)
            target = self._vet_addresses(
                loaded, principal, host, port, addresses=addresses, report=report, would_deny=would_deny, dns_s=0.0
            )
            if len(self._remembered) >= MAX_REMEMBERED_TARGETS:
                self._remembered.clear()
            self._remembered[key] = target
        return target

    def _decide_name(
        self, loaded: LoadedPolicy, principal: Principal, host: VettedHost, port: int
    ) -> tuple[bool, GatewayError | None]:
        """The policy decision on the name: raises in enforce mode, returns (report, would_deny)."""
        policy = loaded.policy
        report = policy.mode_for(principal) == "report"
        decision = decide_destination(policy, principal, host, port)
        if decision.allowed:
            return report, None
        if not report:
            raise decision.to_error()
        return report, decision.to_error()

    def _vet_addresses(
        self,
        loaded: LoadedPolicy,
        principal: Principal,
        host: VettedHost,
        port: int,
        *,
        addresses: tuple[IPAddress, ...],
        report: bool,
        would_deny: GatewayError | None,
        dns_s: float,
    ) -> PinnedTarget:
        vetted = decide_addresses(self.guard_for(loaded), principal, host.name, addresses)
        if not vetted.allowed and would_deny is None:
            # A name with no usable address cannot be "allowed anyway", even in report mode.
            if not report or vetted.code == ErrorCode.DNS_FAILURE:
                raise vetted.to_error()
            would_deny = vetted.to_error()
        return PinnedTarget(host, port, addresses, loaded.generation, dns_s, would_deny)
