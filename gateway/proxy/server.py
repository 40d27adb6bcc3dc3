"""The forward-proxy listener: accepting client connections, live permission after a reload, drain.

Owns the listening socket and the state its connections share: the one `deadlines/wheel.DeadlineWheel`,
the decision caches, the upstream pool, the tunnel opener and the forward dispatcher. Each
accepted connection is a `client_connection.ClientConnection`; on a policy reload the listener
closes the tunnels, requests in flight and pooled connections the new policy denies
(`decision/live_permission.py`), and on shutdown it stops accepting and lets in-flight work finish within
the grace period before closing it.

Never resolves a name or dials a socket itself (the egress core decides; a tunnel attempt's
`PinnedDial` and the forward dispatcher's `open_pinned_connection` dial), never parses bytes
itself, never forwards or echoes the proxy credential.
"""

from __future__ import annotations

import asyncio
import functools
import time

from gateway.credentials.guard import OutboundGuard
from gateway.egress.target import EgressCore
from gateway.observe.audit import AuditLog
from gateway.proxy.client_connection import ClientConnection
from gateway.proxy.deadlines.wheel import DeadlineWheel
from gateway.proxy.decision.caches import DecisionCaches
from gateway.proxy.decision.live_permission import REVOKED_REASON, revocation
from gateway.proxy.decision.records import DecisionRecords
from gateway.proxy.forward.dispatch import ForwardDispatcher
from gateway.proxy.forward.pool import UpstreamPool
from gateway.proxy.forward.upstream import UpstreamConnection
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.tunnel.attempt import Inspection
from gateway.proxy.tunnel.connect_surface import ConnectSurface
from gateway.proxy.tunnel.opener import TunnelOpener

LISTEN_BACKLOG = 4096
DRAIN_POLL_S = 0.05


class ProxyServer:
    """The listener and the state shared by its connections: decisions, pool, tunnels."""

    # `ListenerState.connect_refusal`: the forward proxy serves CONNECT.
    connect_refusal: str | None = None

    def __init__(self, core: EgressCore, audit: AuditLog, guard: OutboundGuard | None = None) -> None:
        self.core = core
        self.audit = audit
        # One timer for the deadlines of every connection, tunnel and upstream of this listener.
        self.wheel = DeadlineWheel()
        self.caches = DecisionCaches()
        self.head_memos = HeadMemos()
        self.records = DecisionRecords(audit)
        self.pool: UpstreamPool[UpstreamConnection] = UpstreamPool(self.wheel)
        self.tunnels = TunnelOpener(core, self.records, audit, on_closed=self.activity_ended, wheel=self.wheel)
        # What a CONNECT's attempt does on this listener (`tunnel/attempt.TunnelAttempt`).
        self.connect_surface = ConnectSurface(self, self.tunnels, self.caches)
        self.dispatcher = ForwardDispatcher(core, self.caches, self.records, self.pool, guard)
        self.draining = False
        self.connections: set[ClientConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._quiet = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        # TLS interception for the hosts an `inspect` entry names (issue 25); None without a CA.
        self.inspection: Inspection | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        sockets = self._server.sockets  # type: ignore[attr-defined]  # asyncio.Server and uvloop's both have it
        port: int = sockets[0].getsockname()[1]
        return port

    async def start(self, host: str, port: int) -> None:
        loop = self.loop = self.connect_surface.loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            functools.partial(ClientConnection, self, self.dispatcher),
            host,
            port,
            backlog=LISTEN_BACKLOG,
            reuse_address=True,
        )

    async def drain(self, grace_s: float) -> None:
        """Stop accepting, let tunnels and in-flight requests finish up to `grace_s`, then close them."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_if_idle()
        inspection = self.inspection
        if inspection is not None:
            # Inspected connections (requests in flight, WebSocket relays) are waited for like
            # tunnels; idle kept-alive ones close now.
            inspection.begin_drain()
        deadline = time.monotonic() + grace_s
        while any(c.busy for c in self.connections) or (inspection is not None and inspection.has_busy_connections()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._quiet.clear()
            try:
                # Woken whenever a tunnel or exchange ends; bounded by the grace period.
                await asyncio.wait_for(self._quiet.wait(), min(remaining, DRAIN_POLL_S * 20))
            except TimeoutError:
                continue
        await self.close()

    def policy_reloaded(self) -> None:
        """Live permission: close tunnels, requests in flight and pooled connections that the
        policy now in force denies (audited with close reason `policy_revoked`)."""
        core = self.core
        loaded = core.loaded
        for tunnel in list(self.tunnels.tunnels):
            if tunnel.kind != "connect":
                continue  # the transparent listener re-decides its own (raw rules, port principals)
            if revocation(core, loaded, tunnel.principal, tunnel.target, tunnel.address) is not None:
                tunnel.close(REVOKED_REASON)
        for conn in list(self.connections):
            conn.revoke_if_denied()

        def revoked(upstream: UpstreamConnection) -> bool:
            rule, target = upstream.principal_rule, upstream.target
            return (
                rule is not None
                and target is not None
                and revocation(core, loaded, rule, target, upstream.key[1]) is not None
            )

        self.pool.close_where(revoked)

    def activity_ended(self) -> None:
        if self.draining:
            self._quiet.set()

    async def close(self) -> None:
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort("shutdown")
        # No task holds a CONNECT's dial for the loop's shutdown to cancel: stopped here, each
        # releases its tunnel reservation on the next iteration (its waiter's done callback, run
        # before this coroutine resumes).
        self.tunnels.cancel_dials()
        await asyncio.sleep(0)
        self.pool.close()
        if self.inspection is not None:
            self.inspection.close()
        self.wheel.close()
