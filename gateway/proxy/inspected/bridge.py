"""The agent's socket of one inspected connection: TLS terminated, then the proxy's client connection.

Owns `TlsBridge`, the protocol of the agent's real socket from the hand-over on: it holds the
ClientHello the connection already read (fed first: never `loop.start_tls`), checks it (a TLS
ClientHello naming the decided host or none, an ALPN list inspection can serve), feeds the
sans-I/O `inspect/terminator.TlsTerminator` under the head deadline, and once the handshake is
done makes the connection's `client_connection.ClientConnection` (the forward proxy's request
framing, smuggling rules, response re-framing, deadlines and keep-alive) over a
`inspect/tls_transport.TlsClientTransport`, with the connection's own dispatcher (its
`requests.InspectedRequests` surface) and upgrades (`upgrades.InspectedUpgrades`). Decrypted
bytes go to whatever protocol that transport belongs to: the client connection, or a WebSocket
relay it handed the transport to.

Never parses HTTP itself, never decides (the listener's records write a failed handshake's line),
never splices a host that is not inspected (those never reach this module).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from gateway.errors import ErrorCode, GatewayError
from gateway.inspect.leaves import LeafContexts
from gateway.inspect.terminator import TlsTerminator, check_offered_alpn
from gateway.inspect.tls_transport import TlsClientTransport
from gateway.proxy.client_connection import ClientConnection
from gateway.proxy.inspected.listener import InspectListener
from gateway.proxy.inspected.requests import TLS_DEFAULT_PORT
from gateway.proxy.inspected.upgrades import InspectedUpgrades
from gateway.proxy.tls.sni import PeekStatus, peek_client_hello


class TlsBridge(asyncio.Protocol):
    """The agent's socket until and after the handshake: holds the ClientHello, checks it, feeds
    the terminator, and hands plaintext to the connection's protocol once the handshake is done."""

    def __init__(
        self,
        listener: InspectListener,
        leaves: LeafContexts,
        raw: asyncio.Transport,
        *,
        principal: str,
        host: str,
        port: int,
        audit_fields: Mapping[str, Any],
        preface: bytes = b"",
    ) -> None:
        self.listener = listener
        self.leaves = leaves
        self.raw = raw
        # The CONNECT's 200, sent with the server's first flight when the ClientHello came with
        # the CONNECT head (one write instead of two).
        self._preface = preface
        self.principal = principal
        self.host = host
        self.port = port
        self.audit_fields = dict(audit_fields)
        self._held = b""
        self._terminator: TlsTerminator | None = None
        # The decrypted stream, once the handshake is done; its protocol is the client connection
        # (or the relay it handed it to).
        self._plain: TlsClientTransport | None = None
        head_timeout_s = listener.core.policy.current.policy.proxy.head_timeout_s
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            head_timeout_s, self._handshake_timed_out
        )

    def data_received(self, data: bytes) -> None:
        if self._terminator is None:
            self._held += data
            peek = peek_client_hello(self._held)
            if peek.status is PeekStatus.NEED_MORE:
                return
            try:
                if peek.status is not PeekStatus.COMPLETE:
                    raise GatewayError(ErrorCode.INVALID_INPUT, f"not a TLS ClientHello: {peek.reason}")
                if peek.server_name is not None and peek.server_name != self.host:
                    raise GatewayError(
                        ErrorCode.HOST_MISMATCH, f"the TLS server name {peek.server_name} is not {self.host}"
                    )
                check_offered_alpn(self.host, peek.alpn)
                context = self.leaves.context_for(self.host)
            except GatewayError as error:
                self._fail(error)
                return
            self._terminator = TlsTerminator(context, self.host)
            data, self._held = self._held, b""
        self._feed(self._terminator, data)

    def _feed(self, terminator: TlsTerminator, data: bytes) -> None:
        terminator.feed(data)
        try:
            if not terminator.handshake_done:
                done = terminator.handshake()
                self._send(terminator.outgoing())
                if not done:
                    return
                self._start_client(terminator)
            plaintext = terminator.read()
        except GatewayError as error:
            self._send(terminator.outgoing())  # our alert, when OpenSSL made one
            self._fail(error)
            return
        self._send(terminator.outgoing())
        plain = self._plain
        assert plain is not None
        protocol = self._protocol(plain)
        if plaintext:
            protocol.data_received(plaintext)
        if terminator.closed and not plain.is_closing() and not protocol.eof_received():
            plain.close()

    def _send(self, records: bytes) -> None:
        if self._preface:
            records, self._preface = self._preface + records, b""
        if records and not self.raw.is_closing():
            self.raw.write(records)

    def flush_preface(self) -> None:
        self._send(b"")

    def _start_client(self, terminator: TlsTerminator) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        listener = self.listener
        surface = listener.surface_for(self.principal, self.host, self.port)
        client = ClientConnection(
            listener,
            listener.dispatcher_for(surface),
            upgrades=InspectedUpgrades(listener, surface),
            refusal_default_port=TLS_DEFAULT_PORT,
        )
        transport = self._plain = TlsClientTransport(self.raw, terminator)
        transport.set_protocol(client)
        client.connection_made(transport)
        # The CONNECT's (or transparent connection's) id: its requests' lines name it.
        client.audit_fields = self.audit_fields

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self._plain is None:
            self._fail(GatewayError(ErrorCode.TIMEOUT, "the agent did not complete the TLS handshake in time"))

    def _fail(self, error: GatewayError) -> None:
        """A connection that failed before any request: one audit line, a metric, closed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush_preface()
        self.listener.handshake_failed(self.principal, self.host, self.port, error, self.audit_fields)
        self.raw.close()

    @staticmethod
    def _protocol(plain: TlsClientTransport) -> asyncio.Protocol:
        return cast(asyncio.Protocol, plain.get_protocol())

    def eof_received(self) -> bool | None:
        if self._plain is not None:
            return self._protocol(self._plain).eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._plain is not None:
            self._protocol(self._plain).connection_lost(exc)

    def pause_writing(self) -> None:
        if self._plain is not None:
            self._protocol(self._plain).pause_writing()

    def resume_writing(self) -> None:
        if self._plain is not None:
            self._protocol(self._plain).resume_writing()
