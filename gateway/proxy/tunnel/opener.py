"""The tunnels of a listener: their limits, the dials in flight, and the open tunnels.

Owns the bookkeeping every tunnel attempt (`attempt.TunnelAttempt`, CONNECT and transparent
alike) and every open `Tunnel` shares: the reservation counts against
`proxy.max_tunnels_per_principal` and `proxy.max_tunnels_total` (`reserve`, `release`), the
pinned dials in flight (`dialing`, which the listener's shutdown cancels), the set of open
tunnels (for live permission and the gauge), the upstream protocol and its shared read buffer,
and the egress core, records and audit log the attempts write through.

Never decides, dials or splices itself (the attempt and the tunnel do), never parses bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.egress.connect import PinnedDial
from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.policy.model import ProxySettings
from gateway.proxy.deadlines.wheel import DeadlineWheel
from gateway.proxy.decision.records import DecisionRecords
from gateway.proxy.tunnel.splice import SharedReadBuffer, Tunnel, UpstreamTunnelProtocol

LIMIT_RETRY_AFTER_S = 1.0


class TunnelOpener:
    """Tunnel limits, dials in flight and open tunnels, shared by a listener's attempts."""

    def __init__(
        self,
        core: EgressCore,
        records: DecisionRecords,
        audit: AuditLog,
        *,
        on_closed: Callable[[], None],
        wheel: DeadlineWheel,
    ) -> None:
        self.core = core
        # The listener's deadline wheel, which the transparent listener's connections share.
        self.wheel = wheel
        self.records = records
        self.audit = audit
        self.tunnels: set[Tunnel] = set()
        # Dials in flight (no task holds them): each is referenced here until its outcome is told.
        self.dialing: set[PinnedDial[UpstreamTunnelProtocol]] = set()
        # The one read buffer the upstream sides of this listener's tunnels share.
        self.read_buffer = SharedReadBuffer()
        # Read at scrape time: no gauge update per tunnel.
        metrics.ACTIVE_TUNNELS.set_function(self.tunnels.__len__)
        self._on_closed = on_closed
        self._by_principal: dict[str, int] = {}
        self._reserved_total = 0
        self._shutting_down = False

    # limits -------------------------------------------------------------------------------------
    def reserve(self, principal: str, settings: ProxySettings) -> None:
        """Count a tunnel against the limits before dialing, so a burst cannot overshoot them."""
        if self._reserved_total >= settings.max_tunnels_total:
            metrics.TUNNEL_LIMIT_HITS.labels(scope="gateway").inc()
            raise GatewayError(
                ErrorCode.CONCURRENCY_LIMITED,
                "the gateway's tunnel limit is reached",
                retry_after_s=LIMIT_RETRY_AFTER_S,
                rule="proxy.max_tunnels_total",
                rule_pattern=str(settings.max_tunnels_total),
            )
        count = self._by_principal.get(principal, 0)
        if count >= settings.max_tunnels_per_principal:
            metrics.TUNNEL_LIMIT_HITS.labels(scope="principal").inc()
            raise GatewayError(
                ErrorCode.CONCURRENCY_LIMITED,
                f"{principal} has reached its tunnel limit",
                retry_after_s=LIMIT_RETRY_AFTER_S,
                rule="proxy.max_tunnels_per_principal",
                rule_pattern=str(settings.max_tunnels_per_principal),
            )
        self._by_principal[principal] = count + 1
        self._reserved_total += 1

    @property
    def shutting_down(self) -> bool:
        """`cancel_dials` ran: the listener is closing."""
        return self._shutting_down

    @property
    def reserved(self) -> int:
        """Tunnels counted against the limits: open, or being dialed."""
        return self._reserved_total

    def release(self, principal: str) -> None:
        self._reserved_total -= 1
        remaining = self._by_principal.get(principal, 1) - 1
        if remaining <= 0:
            self._by_principal.pop(principal, None)
        else:
            self._by_principal[principal] = remaining

    def tunnel_closed(self, tunnel: Tunnel) -> None:
        """`TunnelOwner`: called once when an established tunnel ends."""
        if tunnel in self.tunnels:
            self.tunnels.discard(tunnel)
            self.release(tunnel.principal.name)
        self._on_closed()

    # dialing ------------------------------------------------------------------------------------
    def upstream_protocol(self) -> UpstreamTunnelProtocol:
        """The upstream side of one of this listener's tunnels, reading into its shared buffer."""
        return UpstreamTunnelProtocol(self.read_buffer)

    def cancel_dials(self) -> None:
        """Shutdown: every dial in flight stops now (each owner hears `dial_failed(None)`), and
        an attempt whose DNS answers later stops the dial it makes (`shutting_down`)."""
        self._shutting_down = True
        for dial in list(self.dialing):
            dial.cancel()
