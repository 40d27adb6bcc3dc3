"""Opening a CONNECT tunnel: from an authority-form head to an established `Tunnel`, or a refusal.

Owns the CONNECT decision in the order the issue fixes: principal, authority, tunnel limits
(per principal and in total), policy and address vetting through the egress core, the pinned
dial (a `PinnedDial`, no task), then `200 Connection Established` and the hand-over to `Tunnel`.
It also owns the tunnel bookkeeping: the limit counts, the dials in flight, the set of open
tunnels, and the decision audit lines of CONNECT.

Never parses the client's bytes (the listener does), never splices them (the tunnel does), never
dials anything but a `PinnedTarget` through a `PinnedDial`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from gateway.egress.connect import DialOwner, PinnedDial
from gateway.egress.dial_deadline import DialDeadline
from gateway.egress.target import EgressCore, PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.policy.model import LoadedPolicy, Principal, ProxySettings
from gateway.proxy.deadlines.wheel import DeadlineWheel, LazyDeadline
from gateway.proxy.decision.caches import DecisionCaches
from gateway.proxy.decision.records import DecisionRecords
from gateway.proxy.tunnel.splice import DialedUpstream, Tunnel, UpstreamTunnelProtocol
from gateway.vet.urls import VettedHost

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
LIMIT_RETRY_AFTER_S = 1.0

_CONNECT_LATENCY = metrics.CONNECT_SECONDS.labels("connect")


class TunnelRequest(NamedTuple):
    """A CONNECT that passed principal, authority and limits (counted), with its decision when
    cached state sufficed (`target`), else None: `resolve` then asks `EgressCore.pin` and returns
    the request with its target. (A named tuple: one is made per tunnel, and a frozen dataclass
    sets each field through `object.__setattr__`.)"""

    principal: Principal
    host: VettedHost
    port: int
    target: PinnedTarget | None
    loaded: LoadedPolicy
    # The client connection's `conn`, `client_ip` and `client_port`, on each of its audit lines.
    client: Mapping[str, Any] = MappingProxyType({})


class TunnelOpener:
    """Decides and dials CONNECT requests, enforces tunnel limits, and tracks open tunnels."""

    def __init__(
        self,
        core: EgressCore,
        caches: DecisionCaches,
        records: DecisionRecords,
        audit: AuditLog,
        *,
        on_closed: Callable[[], None],
        wheel: DeadlineWheel,
    ) -> None:
        self.core = core
        # The listener's deadline wheel, which the transparent listener's connections share.
        self.wheel = wheel
        self.caches = caches
        self.records = records
        self.audit = audit
        self.tunnels: set[Tunnel] = set()
        # Dials in flight (no task holds them): each is referenced here until its outcome is told.
        self.dialing: set[PinnedDial[UpstreamTunnelProtocol]] = set()
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

    # opening ------------------------------------------------------------------------------------
    def decide(
        self,
        raw_target: bytes,
        authorization: bytes | None,
        client: Mapping[str, Any] | None = None,
        *,
        peer_uid: int | None = None,
    ) -> TunnelRequest:
        """Principal → authority → limits → decision, without awaiting when cached state suffices.

        A refusal is recorded (decision audit line and count) and raised; the caller only answers
        it, so a refused CONNECT costs no task. The decision itself is the egress core's
        (`pin_cached`, or `pin` later in `dial` when DNS must be asked), under the policy
        generation current now."""
        loaded = self.core.loaded
        caches = self.caches
        principal_name: str | None = None
        host_name: str | None = None
        port: int | None = None
        reserved = False
        try:
            principal = caches.principal_for(loaded, authorization, peer_uid)
            principal_name = principal.name
            authority = caches.connect_authority(raw_target)
            host_name, port = authority.host.name, authority.port
            self.reserve(principal_name, loaded.policy.proxy)
            reserved = True
            target = self.core.pin_cached(principal, authority.host, port, loaded)
        except GatewayError as error:
            if reserved:
                self.release(principal_name or "")
            self.records.record_deny(
                "connect",
                principal_name,
                host_name,
                port,
                error=error,
                generation=loaded.generation,
                client=client,
                claimed=caches.claimed_principal(authorization) if principal_name is None else None,
            )
            raise
        return TunnelRequest(principal, authority.host, port, target, loaded, client or {})

    async def resolve(self, request: TunnelRequest) -> TunnelRequest:
        """The decision when `decide` found no cached answer: the egress core asks DNS. A refusal
        is recorded, the reservation released, and the error raised."""
        loaded = request.loaded
        principal = request.principal
        try:
            target = await self.core.pin(principal, request.host, request.port, loaded=loaded)
        except GatewayError as error:
            self.release(principal.name)
            self.records.record_deny(
                "connect",
                principal.name,
                request.host.name,
                request.port,
                error=error,
                generation=loaded.generation,
                client=request.client,
            )
            raise
        except BaseException:
            # Cancelled (shutdown): the reservation must not leak.
            self.release(principal.name)
            raise
        return request._replace(target=target)

    def dial(
        self,
        request: TunnelRequest,
        owner: DialOwner[UpstreamTunnelProtocol],
        deadline: DialDeadline,
        loop: asyncio.AbstractEventLoop,
    ) -> PinnedDial[UpstreamTunnelProtocol]:
        """The pinned dial of a decided CONNECT, not yet started; each attempt is bounded by
        `deadline` (the client connection's own). Kept in `dialing` until `establish`, `abandon`
        or `dial_failed` is told its outcome, so that `cancel_dials` reaches it on shutdown."""
        target = request.target
        assert target is not None
        dial = PinnedDial(
            loop,
            target,
            UpstreamTunnelProtocol,
            owner,
            timeout_s=request.loaded.policy.proxy.connect_timeout_s,
            deadline=deadline,
        )
        self.dialing.add(dial)
        return dial

    def dial_failed(
        self, request: TunnelRequest, dial: PinnedDial[UpstreamTunnelProtocol], error: GatewayError | None
    ) -> None:
        """The dial failed (`error`) or was cancelled (None): the reservation released and the
        allow line and a close line with the error, or with `shutdown` when the listener's
        shutdown stopped it (the lines of a dial that connects during the drain, `abandon`)."""
        self.dialing.discard(dial)
        principal = request.principal
        self.release(principal.name)
        target = request.target
        if error is not None:
            reason = str(error.code)
        elif self._shutting_down:
            reason = "shutdown"
        else:
            return  # stopped by a defect, which the loop's exception handler reports
        if target is not None:
            self._record_never_opened(request, target, reason)

    def cancel_dials(self) -> None:
        """Shutdown: every dial in flight stops now (each owner hears `dial_failed(None)`)."""
        self._shutting_down = True
        for dial in list(self.dialing):
            dial.cancel()

    def abandon(
        self, request: TunnelRequest, dial: PinnedDial[UpstreamTunnelProtocol], dialed: DialedUpstream, reason: str
    ) -> None:
        """The client left (or the gateway began draining) while the upstream was being dialed: the
        allowed decision and a close line with `reason` still reach the audit trail."""
        _CONNECT_LATENCY.observe(time.perf_counter() - dial.started)
        self.dialing.discard(dial)
        dialed.transport.close()
        self.release(request.principal.name)
        self._record_never_opened(request, dialed.target, reason)

    def _record_never_opened(self, request: TunnelRequest, target: PinnedTarget, reason: str) -> None:
        """An allowed CONNECT that never carried a byte: its allow line, then a close line with
        `reason`, so the decision is never left without its outcome."""
        self.records.record_allow("connect", request.principal, target, client=request.client)
        self.audit.never_opened(
            kind="connect",
            principal=request.principal.name,
            host=target.name,
            port=target.port,
            reason=reason,
            target=target,
            **request.client,
        )

    def establish(
        self,
        client: asyncio.Transport,
        request: TunnelRequest,
        dial: PinnedDial[UpstreamTunnelProtocol],
        dialed: DialedUpstream,
        *,
        early: bytes,
        deadline: LazyDeadline,
    ) -> Tunnel:
        """The dial connected: record the decision, answer 200, and start splicing (with the SNI
        gate first)."""
        _CONNECT_LATENCY.observe(time.perf_counter() - dial.started)
        self.dialing.discard(dial)
        self.records.record_allow("connect", request.principal, dialed.target, client=request.client)
        conn = request.client.get("conn")
        client.write(
            CONNECT_ESTABLISHED
            if not isinstance(conn, str)
            else b"HTTP/1.1 200 Connection Established\r\nX-Egress-Id: " + conn.encode("ascii") + b"\r\n\r\n"
        )
        tunnel = Tunnel(
            self,
            self.audit,
            client,
            dialed,
            principal=request.principal,
            settings=request.loaded.policy.proxy,
            deadline=deadline,
            audit_fields=request.client,
        )
        self.tunnels.add(tunnel)
        tunnel.start(early)
        return tunnel
