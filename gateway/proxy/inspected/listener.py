"""What every inspected connection shares: the state its client connection reads as its listener's.

Owns `InspectListener`, the `client_connection.ListenerState` of inspected connections (as
`transparent/http.PortListener` is a transparent port's): the forward proxy's egress core, timer
wheel, head memos and decision caches, with records of kind `inspect`
(`requests.InspectRecords`), a pool of TLS upstreams apart from plain HTTP's, the upgrade relays
open, and the record of a TLS handshake that failed before any request. It makes each
connection's dispatcher (`dispatcher_for`: the connection's own surface over this shared state).

Never listens on a socket (connections arrive from a CONNECT or the transparent listener), never
serves a CONNECT, never decides anything itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gateway.egress.connect import TlsTrust
from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.observe import metrics
from gateway.proxy.client_connection import ClientConnection
from gateway.proxy.forward.dispatch import ForwardDispatcher
from gateway.proxy.forward.pool import UpstreamPool
from gateway.proxy.forward.upstream import UpstreamConnection
from gateway.proxy.inspected.relay import UpgradeRelay
from gateway.proxy.inspected.requests import KIND, InspectedRequests, InspectRecords
from gateway.proxy.server import ProxyServer
from gateway.proxy.tunnel.attempt import Inspection

log = logging.getLogger("egress_gateway.inspect")

# Hosts already logged as `tls_untrusted`: one warning per host, not one per connection.
MAX_UNTRUSTED_LOGGED = 1024


class InspectListener:
    """`ListenerState` of the inspected connections: the proxy's shared state, with the inspect
    records, a pool of TLS upstreams of its own and the upgrade relays open."""

    connect_refusal = "CONNECT is not accepted inside an inspected connection"
    connect_surface = None
    # Inspected connections are not themselves inspected again.
    inspection: Inspection | None = None

    def __init__(self, proxy: ProxyServer, trust: TlsTrust) -> None:
        self.proxy = proxy
        self.trust = trust
        self.core = proxy.core
        self.audit = proxy.audit
        self.wheel = proxy.wheel
        # The forward proxy's: an agent sends the same heads and names inside TLS as outside it.
        self.head_memos = proxy.head_memos
        self.caches = proxy.caches
        self.records = InspectRecords(proxy.audit)
        # Apart from the plain HTTP pool: a TLS connection is never reused for plain HTTP.
        self.pool: UpstreamPool[UpstreamConnection] = UpstreamPool(proxy.wheel)
        self.connections: set[ClientConnection] = set()
        # WebSocket relays, which outlive their client connection (the drain waits for them).
        self.relays: set[UpgradeRelay] = set()
        self.draining = False
        # Set at the first hand-over when the proxy was not started before this was made.
        self.loop: asyncio.AbstractEventLoop | None = proxy.loop
        self._untrusted_logged: BoundedMemo[str, bool] = BoundedMemo(MAX_UNTRUSTED_LOGGED)

    def dispatcher_for(self, surface: InspectedRequests) -> ForwardDispatcher:
        """One connection's dispatcher: this listener's caches, records and pool, its surface."""
        return ForwardDispatcher(
            self.core, self.caches, self.records, self.pool, self.proxy.dispatcher.guard, surface=surface
        )

    def surface_for(self, principal: str, host: str, port: int) -> InspectedRequests:
        return InspectedRequests(self.records, self.caches, self.trust, principal=principal, host=host, port=port)

    def handshake_failed(
        self, principal: str, host: str, port: int, error: GatewayError, audit_fields: Mapping[str, Any]
    ) -> None:
        """A connection that failed before any request: its deny line and count, and one log
        warning per host whose agent refused the interception CA."""
        metrics.INSPECT_HANDSHAKE_FAILURES.labels(str(error.code)).inc()
        if error.code == ErrorCode.TLS_UNTRUSTED and host not in self._untrusted_logged:
            self._untrusted_logged.put(host, True)
            log.warning("tls_untrusted: %s", error.message)
        self.records.record_deny(
            KIND,
            principal,
            host,
            port,
            error=error,
            generation=self.core.policy.current.generation,
            client=audit_fields,
        )

    @property
    def busy(self) -> bool:
        return any(conn.busy for conn in self.connections) or any(not relay.closed for relay in self.relays)

    def activity_ended(self) -> None:
        # The proxy's drain waits for inspected connections too: an exchange or relay ending
        # here wakes it.
        self.proxy.activity_ended()
