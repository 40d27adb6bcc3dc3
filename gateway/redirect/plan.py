"""From Settings and the policy file to a `RedirectPlan`: which ports, which uids, what is excluded.

The listener ports come from `transparent.ports.assign_ports`, the same function the listeners
bind with, so the rules and the listeners cannot disagree. Never runs a command.
"""

from __future__ import annotations

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.model import Policy
from gateway.redirect.rules import RedirectPlan
from gateway.settings import Settings
from gateway.transparent.ports import assign_ports


def build_plan(settings: Settings, policy: Policy) -> RedirectPlan:
    if not settings.transparent_listen:
        raise GatewayError(ErrorCode.INVALID_INPUT, "EGRESS_TRANSPARENT_LISTEN is not set: nothing to redirect to")
    ports = {listen.port for listen in settings.transparent_listen}
    dns_ports = {listen.port for listen in settings.dns_listen}
    if len(ports) != 1 or len(dns_ports) > 1:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, "the IPv4 and IPv6 listeners of one kind must share one port (REDIRECT keeps it)"
        )
    uids = [uid for uid, _ in policy.transparent.principals]
    if settings.gateway_uid in uids:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"uid {settings.gateway_uid} is the gateway's own and cannot be an agent's"
        )
    return RedirectPlan(
        gateway_uid=settings.gateway_uid,
        tcp_ports=assign_ports(ports.pop(), uids),
        dns_ports=assign_ports(dns_ports.pop(), uids) if dns_ports else (),
        exclude_cidrs=settings.redirect_exclude_cidrs,
        exclude_ports=settings.redirect_exclude_ports,
    )
