"""From (principal, host, port) to a `PinnedTarget`: policy, resolution and address vetting.

This is the single decision path every outbound byte goes through, for the proxy and the tools
alike: the policy decision on the name, resolution by the gateway's own resolver, and the
address guard on every answer. The connection layer may only dial addresses of a PinnedTarget
produced here, in the same call: no second lookup can sneak a rebinding in between. `pin` and
`pin_cached` run the very same checks; `pin_cached` only refuses to wait for the resolver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.egress.resolver import Resolver
from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.policy.decide import decide_addresses, decide_form, decide_name
from gateway.policy.model import LoadedPolicy, Principal
from gateway.vet.addresses import AddressGuard, IPAddress, IPNetwork
from gateway.vet.urls import VettedHost

# Allowed cached decisions kept per policy generation; cleared when full (agents reuse few hosts).
MAX_REMEMBERED_TARGETS = 4096
# Name verdicts `pin_cached` made on a resolver miss, waiting for the `pin` that follows.
MAX_PENDING_NAMES = 4096
NameKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class NameVerdict:
    """The policy's verdict on a name: allowed (report mode may carry what enforce would deny)."""

    report: bool
    would_deny: GatewayError | None
    # The allow rule that matched the name (`allow_domains[2]`, `*.github.com`), for the audit line.
    rule: str | None = None
    rule_pattern: str | None = None


@dataclass(frozen=True, slots=True)
class PinnedTarget:
    host: VettedHost
    port: int
    addresses: tuple[IPAddress, ...]
    generation: int
    dns_s: float
    would_deny: GatewayError | None = None
    # The rule the audit line names: the allow rule of the name, or the rule report mode let pass.
    rule: str | None = None
    rule_pattern: str | None = None
    # `addresses` as text, formatted once per decision: the dialer and the audit line both need it,
    # and formatting an IP address is slow in pure Python.
    address_texts: tuple[str, ...] = field(init=False)
    # `host.name`, a field rather than a property: the pool and the audit lines read it per
    # request and per tunnel, and a property is a Python call each time.
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address_texts", tuple(str(address) for address in self.addresses))
        object.__setattr__(self, "name", self.host.name)


class PolicySource(Protocol):
    """Where the policy in force is read (`PolicyHolder`, or `FixedPolicy` for a one-shot command)."""

    @property
    def current(self) -> LoadedPolicy: ...


class EgressCore:
    """Holds the resolver and the per-generation address guard; decides and pins targets."""

    def __init__(
        self,
        resolver: Resolver,
        policy: PolicySource,
        own_addresses: tuple[IPAddress | IPNetwork, ...],
        on_dns: Callable[[float], None] | None = None,
    ) -> None:
        self.resolver = resolver
        # Read as `policy.current` on the proxy's per-request path: an attribute read, not the
        # three Python calls of a property calling a function calling a property.
        self.policy = policy
        self._own_addresses = own_addresses
        self._guard_generation = -1
        self._guard = AddressGuard()
        self._on_dns = on_dns
        self._memo_generation = -1
        self._remembered: BoundedMemo[NameKey, PinnedTarget] = BoundedMemo(MAX_REMEMBERED_TARGETS)
        self._pending_names: BoundedMemo[NameKey, NameVerdict] = BoundedMemo(MAX_PENDING_NAMES)
        # Set by the daemon to the audit log's refusal: no new egress while it cannot be written.
        self.admission: Callable[[], GatewayError | None] | None = None

    @property
    def loaded(self) -> LoadedPolicy:
        return self.policy.current

    def guard_for(self, loaded: LoadedPolicy) -> AddressGuard:
        if loaded.generation != self._guard_generation:
            defaults = loaded.policy.defaults
            self._guard = AddressGuard(defaults.allow_cidrs, defaults.deny_cidrs, self._own_addresses)
            self._guard_generation = loaded.generation
        return self._guard

    async def pin(
        self, principal: Principal, host: VettedHost, port: int, *, loaded: LoadedPolicy | None = None
    ) -> PinnedTarget:
        """Decide, resolve and vet. Raises GatewayError on denial (enforce mode).

        After a `pin_cached` miss for the same (principal, host, port) under the same generation,
        the name verdict it made is used instead of deciding again."""
        if self.admission is not None and (refusal := self.admission()) is not None:
            raise refusal
        loaded = loaded or self.loaded
        self._same_generation(loaded)
        verdict = self._pending_names.pop((principal.name, host.name, port), None)
        if verdict is None:
            verdict = self._decide_name(loaded, principal, host, port)
        dns_s = 0.0
        if host.ip is not None:
            addresses: tuple[IPAddress, ...] = (host.ip,)
        else:
            try:
                resolution = await self.resolver.resolve(host.name)
            except GatewayError as error:
                # The policy allowed the name; the line of the failure names the rule that did.
                if error.rule is None and error.code == ErrorCode.DNS_FAILURE:
                    error.rule, error.rule_pattern = verdict.rule, verdict.rule_pattern
                # One lookup's error is raised to every request waiting on it, whatever its port:
                # each names its own destination as it raises.
                error.destination = (host.name, port)
                raise
            dns_s = resolution.duration_s
            # Only real lookups are timed: a cache hit would pile zeros into the DNS histogram.
            if self._on_dns and not resolution.cached:
                self._on_dns(dns_s)
            addresses = resolution.addresses
        return self._vet_addresses(loaded, principal, host, port, addresses=addresses, verdict=verdict, dns_s=dns_s)

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
        if loaded.generation != self._memo_generation:  # checked here: no call per CONNECT
            self._same_generation(loaded)
        key = (principal.name, host.name, port)
        # Both checks are pure functions of (policy generation, principal, host, port, addresses):
        # an allowed outcome for the same inputs is the same outcome, so it is remembered; a
        # denial is never remembered and is decided afresh (and audited) every time. Keyed
        # without the addresses (hashing an IPv4Address runs Python code).
        if host.ip is not None:
            addresses: tuple[IPAddress, ...] = (host.ip,)
            target = self._remembered.get(key)
            # A literal's tuple is built here on every call: compared by value.
            if target is not None and target.addresses == addresses:
                return target
        else:
            cached = self.resolver.cached_addresses(host.name)
            if cached is None:
                # Judge the name anyway: a denied name is refused without waiting for DNS, and an
                # allowed one is not judged a second time by the `pin` that follows.
                self._pending_names.put(key, self._decide_name(loaded, principal, host, port))
                return None
            target = self._remembered.get(key)
            # The resolver keeps one tuple per stored answer, so the same tuple is the same answer.
            # Any other tuple is a stored answer since the target was remembered (one of several
            # lookups that were in flight together, a refresh after the TTL, a changed answer):
            # it is vetted afresh, never compared, and the target remembered with it holds again
            # from the next CONNECT on.
            if target is not None and target.addresses is cached:
                return target
            addresses = cached
        verdict = self._decide_name(loaded, principal, host, port)
        return self._remembered.put(
            key, self._vet_addresses(loaded, principal, host, port, addresses=addresses, verdict=verdict, dns_s=0.0)
        )

    def still_pinned(self, target: PinnedTarget, loaded: LoadedPolicy) -> bool:
        """Whether `target`, which `pin_cached` or `pin` returned for some (principal, host, port),
        is what `pin_cached` would return for them now: the same policy generation (so the same
        name verdict and address guard) and, for a name, the resolver's cached answer still the
        very tuple it was vetted with (not expired, not replaced). False: ask `pin_cached` again.

        Raises the admission refusal exactly as `pin_cached` does. Lets a keep-alive connection
        that repeats its request reuse its decision without widening it."""
        if self.admission is not None and (refusal := self.admission()) is not None:
            raise refusal
        if target.generation != loaded.generation:
            return False
        host = target.host
        return host.ip is not None or self.resolver.cached_addresses(host.name) is target.addresses

    def _same_generation(self, loaded: LoadedPolicy) -> None:
        """Remembered outcomes belong to one policy generation: a reload forgets them all."""
        if loaded.generation != self._memo_generation:
            self._remembered.clear()
            self._pending_names.clear()
            self._memo_generation = loaded.generation

    def _decide_name(self, loaded: LoadedPolicy, principal: Principal, host: VettedHost, port: int) -> NameVerdict:
        """The policy's `ports`/`literal_ips` (refused in every mode), then the name (report mode
        marks a denial instead of raising)."""
        policy = loaded.policy
        form = decide_form(policy, principal, host, port)
        if not form.allowed:
            raise _about(form.to_error(), host, port)
        report = policy.mode_for(principal) == "report"
        decision = decide_name(policy, principal, host)
        if decision.allowed:
            return NameVerdict(report, None, decision.rule, decision.pattern)
        if not report:
            raise _about(decision.to_error(), host, port)
        return NameVerdict(report, decision.to_error(), decision.rule, decision.pattern)

    def _vet_addresses(
        self,
        loaded: LoadedPolicy,
        principal: Principal,
        host: VettedHost,
        port: int,
        *,
        addresses: tuple[IPAddress, ...],
        verdict: NameVerdict,
        dns_s: float,
    ) -> PinnedTarget:
        would_deny = verdict.would_deny
        rule, rule_pattern = verdict.rule, verdict.rule_pattern
        vetted = decide_addresses(self.guard_for(loaded), principal, host.name, addresses)
        if not vetted.allowed and would_deny is None:
            if vetted.code == ErrorCode.DNS_FAILURE:
                # The name was allowed; it only has no usable address (the line keeps its rule).
                raise _about(GatewayError(vetted.code, vetted.reason, rule=rule, rule_pattern=rule_pattern), host, port)
            # A name with no usable address cannot be "allowed anyway", even in report mode.
            refusal = _about(vetted.to_error(), host, port)
            refusal.addresses = tuple(str(address) for address in addresses)
            if not verdict.report:
                raise refusal
            would_deny = refusal
            rule, rule_pattern = vetted.rule, vetted.pattern
        return PinnedTarget(host, port, addresses, loaded.generation, dns_s, would_deny, rule, rule_pattern)


def _about(error: GatewayError, host: VettedHost, port: int) -> GatewayError:
    """`error`, naming the destination it refuses (a refusal's status line carries it)."""
    if error.destination is None:
        error.destination = (host.name, port)
    return error
