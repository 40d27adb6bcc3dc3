"""Transparent verdicts that outlive one connection: the principal of a listener port, and
whether the policy in force still allows an open transparent tunnel after a reload.

Pure decisions over a `LoadedPolicy`; never touches a socket or writes an audit line.
"""

from __future__ import annotations

import ipaddress

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import decide_destination, internal_exceptions
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.tunnel.splice import Tunnel
from gateway.transparent.destination import raw_rules_for_port
from gateway.vet.addresses import AddressGuard, IPAddress


def principal_for_port(loaded: LoadedPolicy, uid: int | None) -> Principal:
    """The principal of a listener port: the uid's as the current policy names it, else the default."""
    name = loaded.policy.transparent.principal_for_uid(uid)
    principal = loaded.policy.principals.get(name)
    if principal is None:
        raise GatewayError(ErrorCode.POLICY_DENIED, f"transparent principal {name!r} is not in the policy")
    return principal


def still_allowed(
    loaded: LoadedPolicy, guard: AddressGuard, tunnel: Tunnel, uid: int | None, *, raw: bool
) -> GatewayError | None:
    """Why the current policy refuses an open tunnel, or None while it still allows it (report
    mode never closes one)."""
    try:
        principal = principal_for_port(loaded, uid)
    except GatewayError as error:
        return error
    if loaded.policy.mode_for(principal) == "report":
        return None
    address = ipaddress.ip_address(tunnel.address)
    if raw:
        rules = raw_rules_for_port(loaded.policy.transparent, tunnel.port)
        if not any(rule.host == tunnel.connect_host and rule.ip in (None, address) for rule in rules):
            return GatewayError(
                ErrorCode.POLICY_DENIED,
                f"{tunnel.connect_host}:{tunnel.port} is no longer in raw_tcp",
                rule="transparent.raw_tcp",
            )
    else:
        host = tunnel.target.host
        decision = decide_destination(loaded.policy, principal, host, tunnel.port)
        if not decision.allowed:
            return decision.to_error()
    verdict = guard.vet(address, extra_allow=internal_exceptions(principal, tunnel.connect_host))
    if not verdict.allowed:
        return GatewayError(
            ErrorCode.BLOCKED_DESTINATION,
            f"{tunnel.connect_host} is now denied: {verdict.reason}",
            rule=verdict.rule,
            rule_pattern=verdict.pattern,
        )
    return None


def format_original(original: tuple[IPAddress, int]) -> str:
    """`address:port`, the IPv6 address in brackets."""
    address, port = original
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
