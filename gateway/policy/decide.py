"""The pure policy decision: who is asking, and may they reach this host, port and address.

Takes a `Policy` and values; returns a `Decision`. No I/O, no clock, no asyncio, so every rule
here is table-tested without a loop. The egress core calls these in order: authenticate, then
`decide_destination` before resolving, then `decide_addresses` on every resolved answer.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.model import Policy, Principal
from gateway.vet.addresses import AddressGuard, IPAddress, IPNetwork
from gateway.vet.urls import VettedHost, VettedUrl, port_or_literal_refusal, vet_url


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    code: ErrorCode | None
    reason: str
    # The rule that decided, for the audit line: `allow_domains[2]` and its pattern `*.github.com`
    # (docs/reference/audit-log.md lists every rule name).
    rule: str | None = None
    pattern: str | None = None

    @classmethod
    def allow(cls, reason: str, rule: str | None = None, pattern: str | None = None) -> Decision:
        return cls(True, None, reason, rule, pattern)

    @classmethod
    def deny(cls, code: ErrorCode, reason: str, rule: str | None = None, pattern: str | None = None) -> Decision:
        return cls(False, code, reason, rule, pattern)

    def to_error(self) -> GatewayError:
        assert self.code is not None
        return GatewayError(self.code, self.reason, rule=self.rule, rule_pattern=self.pattern)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def authenticate(policy: Policy, user: str | None, token: str | None) -> Principal:
    """The principal a credential names, or the default principal when there is none.

    Every stored hash is compared (constant time each) so the time taken does not reveal which
    principal, if any, a token belongs to.
    """
    if token is None:
        default = policy.default_principal
        if default is None:
            raise GatewayError(ErrorCode.AUTH_REQUIRED, "a credential is required (no default principal)")
        return default
    digest = token_digest(token)
    match: Principal | None = None
    for principal in policy.principals.values():
        if principal.token_sha256 is not None and hmac.compare_digest(principal.token_sha256, digest):
            match = principal
    if match is None or (user is not None and user != match.name):
        raise GatewayError(ErrorCode.AUTH_REQUIRED, "the credential is not valid")
    return match


def authenticate_bound(policy: Policy, user: str | None, token: str | None, peer_uid: int | None) -> Principal:
    """`authenticate`, with the identity of a uid the policy binds (`transparent.principals`).

    A listed uid is its principal on every listener (docs/guides/enforced-sidecar.md, identity):
    without a credential it is that principal, not the default one, and a credential naming
    another principal is refused, so an agent cannot borrow one through the gateway's own
    loopback listeners. Any other uid (or a peer whose uid is unknown) authenticates as before.
    """
    bound = next((name for uid, name in policy.transparent.principals if uid == peer_uid), None)
    if bound is None or bound not in policy.principals:
        return authenticate(policy, user, token)
    if token is None:
        return policy.principals[bound]
    principal = authenticate(policy, user, token)
    if principal.name != bound:
        raise GatewayError(
            ErrorCode.POLICY_DENIED,
            f"uid {peer_uid} is bound to principal {bound!r}; a credential of {principal.name!r} is refused",
            rule="transparent.principals",
            rule_pattern=str(peer_uid),
        )
    return principal


def glob_matches(glob: str, name: str) -> bool:
    """`*` matches every name; `*.example.com` subdomains only (not the apex); else exact."""
    if glob == "*":
        return True
    if glob.startswith("*."):
        return name.endswith(glob[1:]) and len(name) > len(glob) - 1
    return name == glob


def vet_url_for(policy: Policy, raw: str, *, refuse_secrets: bool = True) -> VettedUrl:
    """`vet_url` under the policy in force: its ports and literal-IP rule, secrets refused unless
    the caller sends its own credential on purpose (an engine or reader key)."""
    defaults = policy.defaults
    return vet_url(
        raw,
        allowed_ports=defaults.ports,
        literal_ips_allowed=defaults.literal_ips == "allow",
        refuse_secrets=refuse_secrets,
        # In-cluster names reach the decision, which allows them only through internal_hosts.
        keep_internal=True,
    )


def decide_form(policy: Policy, principal: Principal, host: VettedHost, port: int) -> Decision:
    """The policy's `ports` and `literal_ips` rules (the same check `vet_url_for` makes), and an
    in-cluster name only for a principal whose `internal_hosts` names it exactly."""
    if host.internal is not None and not any(rule.host == host.name for rule in principal.egress.internal_hosts):
        return Decision.deny(
            ErrorCode.UNSAFE_URL,
            f"{host.internal}; only an exact internal_hosts entry of the principal opens it",
            "builtin_names",
        )
    defaults = policy.defaults
    refusal = port_or_literal_refusal(
        host, port, allowed_ports=defaults.ports, literal_ips_allowed=defaults.literal_ips == "allow"
    )
    if refusal is not None:
        if host.ip is not None and defaults.literal_ips != "allow":
            return Decision.deny(ErrorCode.UNSAFE_URL, refusal, "defaults.literal_ips", defaults.literal_ips)
        return Decision.deny(ErrorCode.UNSAFE_URL, refusal, "defaults.ports", ",".join(map(str, defaults.ports)))
    return Decision.allow(f"port {port} and host form allowed")


def decide_name(policy: Policy, principal: Principal, host: VettedHost) -> Decision:
    """May `principal` reach the name `host` (its deny_domains, allow_domains, internal_hosts)?"""
    rule = principal.egress
    for index, glob in enumerate(rule.deny_domains):
        if glob_matches(glob, host.name):
            return Decision.deny(
                ErrorCode.POLICY_DENIED,
                f"{host.name} matches deny_domains {glob!r} for {principal.name}",
                f"deny_domains[{index}]",
                glob,
            )
    for index, glob in enumerate(rule.allow_domains):
        if glob_matches(glob, host.name):
            return Decision.allow(f"{host.name} matches allow_domains {glob!r}", f"allow_domains[{index}]", glob)
    for index, internal in enumerate(rule.internal_hosts):
        if internal.host == host.name:
            return Decision.allow(
                f"{host.name} is an internal host named by {principal.name}", f"internal_hosts[{index}]", internal.host
            )
    return Decision.deny(
        ErrorCode.POLICY_DENIED, f"{host.name} is not in {principal.name}'s allow_domains", "default_deny"
    )


def decide_destination(policy: Policy, principal: Principal, host: VettedHost, port: int) -> Decision:
    """May `principal` reach `host:port` at all (before any DNS)? The form first, then the name."""
    form = decide_form(policy, principal, host, port)
    return form if not form.allowed else decide_name(policy, principal, host)


def internal_exceptions(principal: Principal, host_name: str) -> tuple[IPNetwork, ...]:
    """Ranges this principal lets `host_name` (and only it) resolve into."""
    nets: list[IPNetwork] = []
    for rule in principal.egress.internal_hosts:
        if rule.host == host_name:
            nets.extend(rule.cidrs)
    return tuple(nets)


def decide_addresses(
    guard: AddressGuard,
    principal: Principal,
    host_name: str,
    addresses: Sequence[IPAddress],
) -> Decision:
    """Every answer must pass: a name that answers both public and private is an attack."""
    if not addresses:
        return Decision.deny(ErrorCode.DNS_FAILURE, f"{host_name} has no usable address")
    extra = internal_exceptions(principal, host_name)
    for address in addresses:
        verdict = guard.vet(address, extra_allow=extra)
        if not verdict.allowed:
            return Decision.deny(
                ErrorCode.BLOCKED_DESTINATION,
                # "NAME resolves to a denied address: 169.254.169.254 is in 169.254.0.0/16 (...)"
                f"{host_name} resolves to a denied address: {verdict.reason}",
                verdict.rule,
                verdict.pattern,
            )
    return Decision.allow(f"{host_name} resolves only to allowed addresses")
