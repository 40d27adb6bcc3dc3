"""The listeners' way into inspection: hand-over, drain and shutdown of inspected connections.

Owns `InspectService`, the `tunnel/attempt.Inspection` the forward proxy (a decided CONNECT)
and the transparent listener (a decided TLS connection) hand a connection to
(`InspectService.take_over`): its socket becomes a `bridge.TlsBridge` over the state every
inspected connection shares (`listener.InspectListener`); on SIGTERM it closes idle inspected
connections and lets the others (and WebSocket relays) finish within the drain's grace; at
shutdown it closes them, their upstream pool and the leaf certificates.

Never decides which host is inspected (`policy/inspect_decide.inspects_host` does, before the
hand-over), never decides a destination, never trusts the interception CA upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gateway.egress.connect import TlsTrust
from gateway.inspect.leaves import LeafContexts
from gateway.proxy.inspected.bridge import TlsBridge
from gateway.proxy.inspected.listener import InspectListener
from gateway.proxy.server import ProxyServer


class InspectService:
    """Which connections inspection takes, and the hand-over."""

    def __init__(self, proxy: ProxyServer, leaves: LeafContexts, trust: TlsTrust) -> None:
        self.leaves = leaves
        self.listener = InspectListener(proxy, trust)

    def take_over(
        self,
        raw: asyncio.Transport,
        *,
        principal: str,
        host: str,
        port: int,
        early: bytes,
        audit_fields: Mapping[str, Any],
        preface: bytes = b"",
    ) -> None:
        """Terminate TLS on `raw` (whose bytes so far, after the CONNECT head, are `early`);
        `preface` (a CONNECT's 200) goes out first, with the handshake's first flight if it can."""
        listener = self.listener
        if listener.loop is None:
            listener.loop = asyncio.get_running_loop()
        bridge = TlsBridge(
            listener,
            self.leaves,
            raw,
            principal=principal,
            host=host,
            port=port,
            audit_fields=audit_fields,
            preface=preface,
        )
        raw.set_protocol(bridge)
        if early:
            bridge.data_received(early)
        bridge.flush_preface()

    def begin_drain(self) -> None:
        """SIGTERM: kept-alive inspected connections between requests close now; the others
        finish their request (or WebSocket relay) within the drain's grace, then close."""
        self.listener.draining = True
        for conn in list(self.listener.connections):
            conn.close_if_idle()

    def has_busy_connections(self) -> bool:
        return self.listener.busy

    def close(self) -> None:
        """Shutdown: inspected connections end with the listener's (the drain waited for them
        up to its grace)."""
        listener = self.listener
        for conn in list(listener.connections):
            conn.abort("shutdown")
        for relay in list(listener.relays):
            relay.close("shutdown")  # its close line says why
        listener.pool.close()
        self.leaves.close()
