"""The transparent TCP listener: connections the pod's rules redirected, decided like CONNECT.

Owns a redirected connection from accept until something else owns it: the original destination
(`SO_ORIGINAL_DST`), the principal of the listener port (one port per agent uid), both in the
connection's `ClientContext`, the raw TCP allow-list (decided on the original address alone),
and the first flight held and classified (TLS ClientHello SNI, plain HTTP, or anything else).
A TLS connection (or a raw TCP exception) is then a `TunnelAttempt`, exactly as a CONNECT is,
through this listener's `tunnel_surface.TransparentSurface` (the decision on the *name*: the
agent's own DNS answer and chosen address are never trusted; the destination rule); plain HTTP
goes to the proxy's own request handling (`transparent.http`).

Never parses TLS or HTTP itself (`proxy/tls/sni.py`, the proxy do), never decides or dials a
tunnel itself (the attempt does).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import socket
from collections.abc import Mapping
from typing import Any, cast

from gateway.egress.target import EgressCore, PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.observe.audit import AuditLog
from gateway.observe.audit_fields import client_fields, new_connection_id
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.deadlines.wheel import LazyDeadline
from gateway.proxy.decision.context import ClientContext
from gateway.proxy.tls.sni import MAX_PEEK_BYTES
from gateway.proxy.tunnel.attempt import Inspection, TunnelAttempt
from gateway.proxy.tunnel.opener import TunnelOpener
from gateway.proxy.tunnel.splice import Tunnel
from gateway.settings import ListenAddress
from gateway.tasks import spawn
from gateway.transparent.destination import raw_rules_for_port
from gateway.transparent.identify import FlightKind, classify_first_flight, describe_seen
from gateway.transparent.original_dst import original_destination
from gateway.transparent.ports import assign_ports
from gateway.transparent.tunnel_surface import KIND, RawRefusal, ServerName, TransparentSurface
from gateway.transparent.verdicts import format_original, principal_for_port, still_allowed
from gateway.vet.addresses import IPAddress

LISTEN_BACKLOG = 4096


class TransparentListener:
    """Every transparent listening socket (one per address and uid) and the state they share."""

    def __init__(self, core: EgressCore, audit: AuditLog, tunnels: TunnelOpener, http: HttpHandOver | None) -> None:
        self.core = core
        self.audit = audit
        self.tunnels = tunnels
        self.http = http
        self.loop: asyncio.AbstractEventLoop | None = None
        self.connections: set[TransparentConnection] = set()
        # Open transparent tunnels with their port's uid and whether they are raw TCP exceptions,
        # for `revalidate` (closed ones are pruned as they are met).
        self.open: dict[Tunnel, tuple[int | None, bool]] = {}
        self._servers: list[asyncio.AbstractServer] = []
        # TLS interception for the hosts an `inspect` entry names (issue 25), shared with the proxy.
        self.inspection: Inspection | None = None
        # What this listener's tunnel attempts do differently from a CONNECT's.
        self.surface = TransparentSurface(self, tunnels)

    async def start(self, addresses: tuple[ListenAddress, ...], uids: list[int]) -> None:
        loop = self.loop = self.surface.loop = asyncio.get_running_loop()
        for listen in addresses:
            for assignment in assign_ports(listen.port, uids):
                server = await loop.create_server(
                    functools.partial(TransparentConnection, self, assignment.uid),
                    listen.host,
                    assignment.port,
                    backlog=LISTEN_BACKLOG,
                    reuse_address=True,
                )
                self._servers.append(server)

    def close(self) -> None:
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.abort("shutdown")
        if self.http is not None:
            self.http.close()

    def revalidate(self, loaded: LoadedPolicy) -> None:
        """After a reload: close every open tunnel the new policy would not allow now."""
        guard = self.core.guard_for(loaded)
        for tunnel, (uid, raw) in list(self.open.items()):
            if tunnel.closed:
                del self.open[tunnel]
                continue
            refusal = still_allowed(loaded, guard, tunnel, uid, raw=raw)
            if refusal is None:
                continue
            del self.open[tunnel]
            address = ipaddress.ip_address(tunnel.address)
            self.record_deny(
                tunnel.principal.name,
                tunnel.connect_host,
                (address, tunnel.port),
                refusal,
                loaded.generation,
                client=tunnel.audit_fields,
            )
            tunnel.close("policy_changed")

    def record_deny(
        self,
        principal: str | None,
        host: str | None,
        original: tuple[IPAddress, int] | None,
        error: GatewayError,
        generation: int,
        *,
        client: Mapping[str, Any] | None = None,
        **extra: str,
    ) -> None:
        """The proxy's refusal record, with the destination the agent dialed."""
        self.tunnels.records.record_deny(
            KIND,
            principal,
            host,
            original[1] if original else None,
            error=error,
            generation=generation,
            client=client,
            original_dst=format_original(original) if original else None,
            **extra,
        )


class HttpHandOver:
    """Implemented by `transparent.http`: takes over a connection whose first flight is HTTP."""

    def take_over(
        self, transport: asyncio.Transport, uid: int | None, original: tuple[IPAddress, int], first: bytes
    ) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TransparentConnection(asyncio.Protocol):
    """One redirected connection until it becomes a tunnel, an HTTP connection, or is refused."""

    def __init__(self, listener: TransparentListener, uid: int | None) -> None:
        self.listener = listener
        self.uid = uid
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self.original: tuple[IPAddress, int] | None = None
        self.loaded = listener.core.loaded
        self.principal: Principal | None = None
        # Made once the original destination and the principal are known (`connection_made`).
        self.context: ClientContext | None = None
        self.held = bytearray()
        self.tunnel: Tunnel | None = None
        # A TLS connection (or raw TCP exception) on its way to a tunnel, which it owns until then.
        self.attempt: TunnelAttempt[ServerName] | None = None
        self.deciding = False
        self.raw = False
        self.closed = False
        self.eof = False
        self.audit_fields: dict[str, Any] = {}
        self.deadline = LazyDeadline(self._timeout, listener.tunnels.wheel)

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        # `conn`, `client_ip`, `client_port`: every audit line of this connection carries them.
        self.audit_fields = {"conn": new_connection_id(), **client_fields(transport.get_extra_info("peername"))}
        self.listener.connections.add(self)
        sock = transport.get_extra_info("socket")
        # uvloop hands out a pseudo-socket: read the option on a duplicate of the real descriptor.
        with socket.socket(sock.family, sock.type, fileno=os.dup(sock.fileno())) as real:
            self.original = original_destination(real)
        if self.original is None:
            self._deny(GatewayError(ErrorCode.POLICY_DENIED, "not a redirected connection (no original destination)"))
            return
        try:
            self.principal = principal_for_port(self.loaded, self.uid)
        except GatewayError as error:
            self._deny(error)
            return
        self.context = ClientContext(
            self.transport,
            self.audit_fields,
            original=self.original,
            original_dst=format_original(self.original),
            principal=self.principal,
            loaded=self.loaded,
        )
        self.deadline.set(self.loaded.policy.proxy.head_timeout_s)
        if raw_rules_for_port(self.loaded.policy.transparent, self.original[1]):
            # A raw TCP exception: decided on the address alone, before the client says anything
            # (a server-speaks-first protocol such as SMTP sends nothing until greeted).
            self.deciding = True
            spawn(self._decide_raw(), name="transparent-raw", loop=self.listener.loop)

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel.from_client(data)
            return
        if self.closed:
            return
        self.held += data
        if len(self.held) > MAX_PEEK_BYTES:
            self.transport.pause_reading()
        if not self.deciding:
            self._identify()

    def eof_received(self) -> bool | None:
        if self.tunnel is not None:
            return self.tunnel.client_eof()
        self.eof = True
        if not self.deciding and not self.closed:
            self._identify(final=True)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener.connections.discard(self)
        if self.attempt is None:
            self.deadline.cancel()  # while an attempt runs, the entry still bounds its dial
        if self.tunnel is not None:
            self.tunnel.client_lost(exc)

    def pause_writing(self) -> None:
        if self.tunnel is not None:
            self.tunnel.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.tunnel is not None and not self.tunnel.closed:
            self.tunnel.upstream.resume_reading()

    # identification ---------------------------------------------------------------------------
    def _identify(self, *, final: bool = False) -> None:
        flight = classify_first_flight(bytes(self.held))
        if flight.kind == FlightKind.NEED_MORE:
            if final:
                self._deny(
                    GatewayError(ErrorCode.PROTOCOL_UNKNOWN, "the client closed before a complete first flight"),
                    seen=describe_seen(self.held),
                )
            return
        if flight.kind == FlightKind.UNKNOWN:
            self._deny(GatewayError(ErrorCode.PROTOCOL_UNKNOWN, flight.reason), seen=describe_seen(self.held))
            return
        if flight.kind == FlightKind.HTTP:
            self._hand_over_http()
            return
        self._start_attempt(flight.server_name)

    def _hand_over_http(self) -> None:
        http = self.listener.http
        assert self.original is not None
        if http is None:
            self._deny(GatewayError(ErrorCode.PROTOCOL_UNKNOWN, "plain HTTP is not served on this listener"))
            return
        http.take_over(self.transport, self.uid, self.original, self._give_away())

    async def _decide_raw(self) -> None:
        """A raw TCP exception of this port (`TransparentSurface.raw_target`): refused, spliced to
        the original address, or not an exception after all."""
        assert self.context is not None
        decided = await self.listener.surface.raw_target(self.context)
        if isinstance(decided, RawRefusal):
            self._deny(decided.error, host=decided.host)
            return
        if decided is None:
            # Not an exception after all: judge the first flight like any other connection.
            self.deciding = False
            if self.held or self.eof:
                self._identify(final=self.eof)
            return
        self.raw = True
        self._start_attempt(None, decided=decided)

    # the tunnel attempt ---------------------------------------------------------------------
    def _start_attempt(self, server_name: ServerName, *, decided: PinnedTarget | None = None) -> None:
        context = self.context
        assert context is not None  # the connection was redirected and has its principal
        self.deciding = True
        attempt = self.attempt = TunnelAttempt(self.listener.surface, context, self, self.deadline, server_name)
        if decided is None:
            attempt.start()
        else:
            attempt.start_decided(decided)

    # TunnelClient (proxy/tunnel/attempt.py): the attempt gives the transport away, or ends.
    def gone_reason(self) -> str | None:
        return "client_closed" if self.closed else None

    def splice(self, tunnel: Tunnel) -> None:
        self.attempt = None
        self.tunnel = tunnel
        self.listener.open[tunnel] = (self.uid, self.raw)
        held, self.held = bytes(self.held), bytearray()
        tunnel.start(held, self.eof)

    def detach(self) -> bytes:
        self.attempt = None
        held = self._give_away()  # to the inspected connection
        if len(held) > MAX_PEEK_BYTES:
            self.transport.resume_reading()
        return held

    def attempt_ended(self, answer: bytes) -> None:
        self.attempt = None
        if answer and not self.closed:
            self.transport.write(answer)
        self._close()

    # closing ----------------------------------------------------------------------------------
    def _give_away(self) -> bytes:
        """This protocol is done: another (plain HTTP's, inspection's) owns the transport from
        now on. Returns the bytes held for it."""
        self.closed = True
        self.listener.connections.discard(self)
        self.deadline.cancel()
        held, self.held = bytes(self.held), bytearray()
        return held

    def _deny(self, error: GatewayError, *, host: str | None = None, **extra: str) -> None:
        if self.closed:
            return
        self.listener.record_deny(
            self.principal.name if self.principal else None,
            host,
            self.original,
            error,
            self.loaded.generation,
            client=self.audit_fields,
            **extra,
        )
        self._close()

    def _close(self) -> None:
        self.closed = True
        self.deadline.cancel()
        if not self.transport.is_closing():
            self.transport.close()

    def abort(self, reason: str) -> None:
        if self.tunnel is not None:
            self.tunnel.close(reason, abort=True)
            return
        self.closed = True
        self.transport.abort()

    def _timeout(self) -> None:
        if self.tunnel is not None:
            self.tunnel.deadline_check()
            return
        if self.attempt is not None:
            self.attempt.deadline_passed()  # it bounds the attempt's dial
            return
        if not self.deciding and not self.closed:
            self._deny(
                GatewayError(ErrorCode.PROTOCOL_UNKNOWN, "no complete first flight within the head timeout"),
                seen=describe_seen(self.held),
            )
