"""The forward proxy's `TunnelSurface`: what makes a tunnel attempt a CONNECT.

Owns what a CONNECT's attempt does differently from a transparent connection's: the principal
comes from the head's Proxy-Authorization (and, when the policy binds uids, the loopback peer's
uid), the name and port from its authority-form target (both through the decision caches),
the tunnel is reserved before the decision (a burst of CONNECTs cannot overshoot the limits),
the SNI gate runs in the policy's mode, and the client reads `200 Connection Established` (with
its connection's `X-Egress-Id`) or an error response.

Never dials, never writes to the client or the audit log itself (the attempt does).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from gateway.errors import GatewayError
from gateway.observe import metrics
from gateway.policy.model import SniMode
from gateway.proxy.decision.caches import DecisionCaches
from gateway.proxy.http1.heads import error_response
from gateway.proxy.http1.request_framing import ConnectHead
from gateway.proxy.tunnel.attempt import Inspection, TunnelAttempt
from gateway.proxy.tunnel.opener import TunnelOpener

KIND = "connect"
CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
# A refusal's status line names the port only when it is not the request's default.
CONNECT_DEFAULT_PORT = 443


class ConnectListener(Protocol):
    """What the surface reads from its listener (`server.ProxyServer`) when an attempt needs it."""

    @property
    def inspection(self) -> Inspection | None: ...


class ConnectSurface:
    """`TunnelSurface` of the forward proxy's CONNECT, one per listener; the ask is the head."""

    __slots__ = ("caches", "latency", "listener", "loop", "opener")

    kind: str = KIND
    reserve_first: bool = True  # before the decision: a burst of CONNECTs cannot overshoot the limits
    sni: SniMode | None = None  # the policy's mode
    destination: None = None  # the egress core's decision is dialed as it is

    def __init__(self, listener: ConnectListener, opener: TunnelOpener, caches: DecisionCaches) -> None:
        self.listener = listener
        self.opener = opener
        self.caches = caches
        self.latency = metrics.CONNECT_SECONDS.labels(KIND)
        self.loop: asyncio.AbstractEventLoop | None = None  # the listener's, set as it starts

    @property
    def inspection(self) -> Inspection | None:
        return self.listener.inspection

    def identify(self, attempt: TunnelAttempt[ConnectHead]) -> None:
        """Principal, then authority: the order the refusals are checked in."""
        loaded, head, caches = attempt.loaded, attempt.ask, self.caches
        attempt.principal = caches.principal_for(loaded, head.authorization, attempt.context.peer_uid(loaded))
        authority = caches.connect_authority(head.authority)
        attempt.host, attempt.host_name, attempt.port = authority.host, authority.host.name, authority.port

    def claimed_principal(self, attempt: TunnelAttempt[ConnectHead]) -> str | None:
        return self.caches.claimed_principal(attempt.ask.authorization)

    def established(self, conn: object) -> bytes:
        if not isinstance(conn, str):
            return CONNECT_ESTABLISHED
        return b"HTTP/1.1 200 Connection Established\r\nX-Egress-Id: " + conn.encode("ascii") + b"\r\n\r\n"

    def refusal(self, error: GatewayError, conn: object) -> bytes:
        return error_response(error, keep_alive=False, conn=conn, default_port=CONNECT_DEFAULT_PORT)
