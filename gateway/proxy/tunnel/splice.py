"""The CONNECT splice: bytes both ways between a client and a pinned upstream, bounded.

Owns an established tunnel: the SNI gate on the client's handshake (`tls/hello_gate.HelloGate`: the
first ClientHello, and the second after a HelloRetryRequest, held, peeked, then forwarded
unchanged), backpressure (a side whose write buffer passes the high-water mark pauses
reading on the other side, so memory per tunnel stays bounded by the watermarks), byte counts,
the close audit line, and carrying out what its `deadlines/limits.TunnelLimits` decides: the
idle timeout and maximum lifetime (on the client connection's entry in the deadline wheel) and
the guarded half-closes.

Never parses or alters the payload beyond the ClientHello peek; never dials anything (the
listener hands it a connected upstream transport).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from gateway.egress.target import PinnedTarget
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.policy.model import LoadedPolicy, Principal, SniMode
from gateway.proxy.deadlines.limits import AfterFin, TunnelLimits
from gateway.proxy.deadlines.wheel import LazyDeadline
from gateway.proxy.decision.context import ClientContext
from gateway.proxy.tls.hello_gate import HelloGate
from gateway.proxy.tls.sni import MAX_PEEK_BYTES, ClientHelloPeek, PeekStatus

# Per direction, the most a tunnel buffers before it stops reading the other side: large enough
# that a bulk transfer rarely pauses (each pause/resume is a wake-up and epoll change), small
# enough to bound memory per busy tunnel. Idle tunnels hold nothing.
WRITE_HIGH_WATER_BYTES = 1024 * 1024
WRITE_LOW_WATER_BYTES = 256 * 1024
# uvloop's own read size for data_received.
READ_BUFFER_BYTES = 256 * 1024
TLS_PORTS = frozenset({443})

_UP = metrics.TUNNEL_BYTES.labels("upstream")
_DOWN = metrics.TUNNEL_BYTES.labels("downstream")
_SNI_DENIED = metrics.DECISIONS.labels("connect", "deny", "policy_denied")


def sni_verdict(mode: SniMode, port: int, connect_host: str, host_is_ip: bool, peek: ClientHelloPeek) -> str | None:
    """None when the first flight may pass; else why the tunnel is refused.

    `require` applies in full on TLS ports (443): the first flight must be a ClientHello naming
    the CONNECT host. On other ports, and under `match-if-present`, only a ClientHello that names
    a different host is refused (domain fronting at the TLS layer); plain protocols pass.
    """
    if mode == "off":
        return None
    strict = mode == "require" and port in TLS_PORTS
    if peek.status == PeekStatus.MALFORMED:
        return f"malformed TLS ClientHello: {peek.reason}"
    if peek.status == PeekStatus.NOT_TLS:
        return "the first bytes are not a TLS ClientHello (sni: require on a TLS port)" if strict else None
    name = peek.server_name
    if name is None:
        if strict and not host_is_ip:
            return "the TLS ClientHello carries no SNI (sni: require)"
        return None
    if name != connect_host:
        return f"TLS SNI {name!r} differs from the CONNECT host {connect_host!r}"
    return None


class TunnelOwner(Protocol):
    """The listener's bookkeeping (`opener.TunnelOpener`): its audit log, told once when a tunnel ends."""

    @property
    def audit(self) -> AuditLog: ...

    def tunnel_closed(self, tunnel: Tunnel) -> None: ...


class TunnelKind(Protocol):
    """What a tunnel's listener makes it: its audit kind (`connect`, `transparent`) and the SNI
    mode that overrides the policy's (None: the policy's; a redirected connection has no CONNECT
    name to match)."""

    @property
    def kind(self) -> str: ...
    @property
    def sni(self) -> SniMode | None: ...


class TunnelOrigin(Protocol):
    """The attempt a tunnel is opened from (`attempt.TunnelAttempt`): the tunnel reads its
    listener, client connection, decision and wheel entry from it, rather than from a dozen
    arguments (keywords to a class cost Python 3.11 a dict, about 0.5 k instructions each)."""

    @property
    def opener(self) -> TunnelOwner: ...
    @property
    def surface(self) -> TunnelKind: ...
    @property
    def context(self) -> ClientContext: ...
    @property
    def principal(self) -> Principal | None: ...
    @property
    def loaded(self) -> LoadedPolicy: ...
    @property
    def deadline(self) -> LazyDeadline: ...


class SharedReadBuffer:
    """One read buffer for the upstream side of every tunnel of a listener (`TunnelOpener` owns it).

    Reads happen one at a time on the loop's thread, and a read is written on to the client before
    the next one starts, so one buffer serves every tunnel: an idle tunnel holds none, and a busy
    one reads without allocating and copying a bytes object per read. When the client transport
    keeps a view of the buffer (its kernel buffer was full, so part of the write waits), the
    buffer is handed to it and a fresh one is made for the next read.
    """

    __slots__ = ("buffer",)

    def __init__(self) -> None:
        self.buffer: bytearray | None = None

    def get(self) -> bytearray:
        buffer = self.buffer
        if buffer is None:
            buffer = self.buffer = bytearray(READ_BUFFER_BYTES)
        return buffer


class UpstreamTunnelProtocol(asyncio.BufferedProtocol):
    """The upstream side of a tunnel; everything is delegated to the `Tunnel`."""

    __slots__ = ("early", "read_buffer", "transport", "tunnel")

    def __init__(self, read_buffer: SharedReadBuffer) -> None:
        self.read_buffer = read_buffer
        self.tunnel: Tunnel | None = None
        self.transport: asyncio.Transport | None = None
        # Bytes that arrive before the tunnel object exists (server speaks first); a list only
        # once there are some.
        self.early: list[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it (no typing.cast:
        # it is a Python call on every tunnel).
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES, WRITE_LOW_WATER_BYTES)  # type: ignore[attr-defined]

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.read_buffer.get()

    def buffer_updated(self, nbytes: int) -> None:
        read_buffer = self.read_buffer
        buffer = read_buffer.buffer
        assert buffer is not None  # get_buffer() ran just before, on the same read
        if self.tunnel is not None:
            self.tunnel.from_upstream(read_buffer, buffer, nbytes)
            return
        if self.early is None:
            self.early = []
        self.early.append(bytes(buffer[:nbytes]))
        assert self.transport is not None
        self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        if self.tunnel is not None:
            return self.tunnel.upstream_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        # Let go of the tunnel (it holds this protocol): no cycle left for the garbage collector.
        tunnel, self.tunnel = self.tunnel, None
        if tunnel is not None and not tunnel.closed:  # usually closed already (by the client's side)
            tunnel.upstream_lost(exc)

    def pause_writing(self) -> None:
        if self.tunnel is not None:
            self.tunnel.client.pause_reading()

    def resume_writing(self) -> None:
        if self.tunnel is not None:
            self.tunnel.client.resume_reading()


class Tunnel:
    """An established CONNECT tunnel. The listener forwards client events to it."""

    __slots__ = (
        "address",
        "audit",
        "audit_fields",
        "bytes_down",
        "bytes_up",
        "client",
        "closed",
        "deadline",
        "gate",
        "kind",
        "limits",
        "owner",
        "principal",
        "settings",
        "sni",
        "started",
        "target",
        "upstream",
        "upstream_proto",
    )

    def __init__(
        self,
        origin: TunnelOrigin,
        upstream: asyncio.Transport,
        upstream_proto: UpstreamTunnelProtocol,
        address: str,
        target: PinnedTarget,
    ) -> None:
        """The tunnel of `origin`'s client connection to `upstream`, dialed at `address` for
        `target` (the decision)."""
        owner = self.owner = origin.opener
        self.audit = owner.audit
        context = origin.context
        self.client = client = context.transport
        # The client connection's `conn`, `client_ip` and `client_port`, on the tunnel's own lines.
        self.audit_fields = context.audit_fields
        surface = origin.surface
        # The audit kind: "connect" here, "transparent" for a redirected connection.
        self.kind = surface.kind
        self.upstream = upstream
        self.upstream_proto = upstream_proto
        self.address = address
        self.target = target
        principal = origin.principal
        assert principal is not None  # decided before any dial
        self.principal = principal
        self.settings = settings = origin.loaded.policy.proxy
        self.bytes_up = 0
        self.bytes_down = 0
        self.closed = False
        self.started = time.monotonic()
        self.limits = TunnelLimits(self.started, settings.idle_timeout_s, settings.max_tunnel_lifetime_s)
        # None: the handshake has been checked (or needs no check) and bytes flow freely.
        # The surface's mode overrides the policy's (the transparent listener has no CONNECT name to match).
        sni = surface.sni
        self.sni: SniMode = settings.sni if sni is None else sni
        self.gate: HelloGate | None = HelloGate(self._sni_refusal) if self.sni != "off" else None
        # The client connection's wheel entry serves both limits: filed at accept for the head
        # deadline, its slot comes first and files it again for the time left, so a tunnel setup
        # files nothing of its own. The owner routes its expiry to `deadline_check`.
        self.deadline = deadline = origin.deadline
        deadline.set_at(self.limits.at)
        client.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES, WRITE_LOW_WATER_BYTES)

    @property
    def connect_host(self) -> str:
        return self.target.name

    @property
    def port(self) -> int:
        return self.target.port

    def _sni_refusal(self, peek: ClientHelloPeek) -> str | None:
        return sni_verdict(self.sni, self.port, self.connect_host, self.target.host.ip is not None, peek)

    def start(self, early: bytes, client_eof: bool) -> None:
        """Attach to the upstream protocol, deliver anything that arrived early from either side
        (`early`: what the client sent while the tunnel was being opened), start reading, and
        pass on a half-close the client made meanwhile (`client_eof`)."""
        proto = self.upstream_proto
        proto.tunnel = self
        held = proto.early
        if held is not None:
            proto.early = None
            for chunk in held:
                self.from_upstream_bytes(chunk)
            if not self.closed:
                self.upstream.resume_reading()
        if early:
            self.from_client(early)
        if proto.transport is None and not self.closed:
            self.upstream_lost(None)
        if self.closed:
            return
        if len(early) > MAX_PEEK_BYTES:
            # The client's connection stopped reading once it held more than one peek's worth.
            self.client.resume_reading()
        if client_eof:
            self.client_eof()

    # client → upstream -------------------------------------------------------------------------
    def from_client(self, data: bytes) -> None:
        if self.closed:
            return  # nothing more goes upstream (and the gate is gone)
        self.limits.last_activity = time.monotonic()
        gate = self.gate
        if gate is not None:
            step = gate.from_client(data)
            if step.refusal is not None:
                self._refuse_sni(step.refusal)
                return
            if gate.open:
                self.gate = None
            elif step.hold:
                self.client.pause_reading()  # resumed when the server's first flight releases it
            data = step.to_upstream
            if not data:
                return
        self.bytes_up += len(data)
        self.upstream.write(data)

    def _refuse_sni(self, refusal: str) -> None:
        _SNI_DENIED.inc()
        self.audit.decision(
            kind=self.kind,
            principal=self.principal.name,
            host=self.connect_host,
            port=self.port,
            addresses=(self.address,),
            decision="deny",
            code="policy_denied",
            reason=refusal,
            generation=self.target.generation,
            rule="proxy.sni",
            rule_pattern=self.sni,
            stage="sni",
            **self.audit_fields,
        )
        self.close("sni_denied", abort=True)

    def _server_flight(self, data: bytes | bytearray | memoryview) -> None:
        """The server's bytes while the gate waits for its first flight (relayed as usual)."""
        gate = self.gate
        assert gate is not None
        step = gate.from_server(data)
        if step.refusal is not None:
            self._refuse_sni(step.refusal)
            return
        if gate.open:
            self.gate = None
            self.client.resume_reading()
        if step.to_upstream:
            self.bytes_up += len(step.to_upstream)
            self.upstream.write(step.to_upstream)

    def client_eof(self) -> bool:
        """Half-close toward the upstream; keep the tunnel open for the other direction."""
        if self.closed:
            return False
        checked = self.gate is None
        # Before the handshake is checked the FIN closes the tunnel whatever the upstream can do.
        end = self.limits.client_eof(
            handshake_checked=checked, upstream_can_half_close=checked and _can_half_close(self.upstream)
        )
        if end is AfterFin.CLOSE:
            self.close("client_closed")
            return False
        self.upstream.write_eof()
        return True

    def client_lost(self, exc: Exception | None) -> None:
        if not self.closed:  # usually closed already: the client's FIN or the upstream's ended it
            self.close("client_reset" if exc is not None else "client_closed")

    # upstream → client -------------------------------------------------------------------------
    def from_upstream(self, read_buffer: SharedReadBuffer, buffer: bytearray, nbytes: int) -> None:
        """The first `nbytes` of `buffer`, `read_buffer`'s, go to the client."""
        if self.gate is not None:
            self._server_flight(memoryview(buffer)[:nbytes])
            if self.closed:
                return
        client = self.client
        if client.get_write_buffer_size():
            # Queued behind earlier bytes: the transport keeps what it is given, so give it a copy.
            self.from_upstream_bytes(buffer[:nbytes])
            return
        self.limits.last_activity = time.monotonic()
        self.bytes_down += nbytes
        client.write(memoryview(buffer)[:nbytes])
        if client.get_write_buffer_size():
            # Part of it waits in the transport, which holds a view of the shared buffer.
            read_buffer.buffer = None

    def from_upstream_bytes(self, data: bytes | bytearray) -> None:
        """Bytes the transport may keep as they are (early bytes, or a copy of the read buffer)."""
        self.limits.last_activity = time.monotonic()
        self.bytes_down += len(data)
        self.client.write(data)

    def upstream_eof(self) -> bool:
        if self.limits.upstream_eof(client_can_half_close=_can_half_close(self.client)) is AfterFin.CLOSE:
            self.close("upstream_closed")
            return False
        self.client.write_eof()
        return True

    def upstream_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.close("upstream_reset" if exc is not None else "upstream_closed")

    # lifecycle ---------------------------------------------------------------------------------
    def deadline_check(self) -> None:
        """The deadline passed: close on lifetime or idle time, else set it for the time left."""
        if self.closed:
            return
        reason = self.limits.expired(time.monotonic())
        if reason is not None:
            self.close(reason)
            return
        self.deadline.set_at(self.limits.at)

    def close(self, reason: str, *, abort: bool = False) -> None:
        """Close both sides once (flushing what is buffered unless aborting) and write the audit line."""
        if self.closed:
            return
        self.closed = True
        # Nothing is due on the connection's entry once its tunnel is closed: released, its
        # owner's callback goes with it (no cycle left, and the owner releases it no second time).
        self.deadline.release()
        for transport in (self.client, self.upstream):
            if not transport.is_closing():
                if abort:
                    transport.abort()
                else:
                    transport.close()
            elif abort:
                transport.abort()
        duration = time.monotonic() - self.started
        metrics.TUNNEL_SECONDS.observe(duration)
        if self.bytes_up:
            _UP.inc(self.bytes_up)
        if self.bytes_down:
            _DOWN.inc(self.bytes_down)
        self.audit.tunnel_closed(
            self.kind,
            self.principal.name,
            self.target,
            address=self.address,
            client=self.audit_fields,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            duration_s=duration,
            reason=reason,
        )
        self.owner.tunnel_closed(self)
        # The gate holds a bound method of this tunnel: dropped, nothing is left for the garbage
        # collector (`from_client` forwards nothing once closed).
        self.gate = None


def _can_half_close(transport: asyncio.Transport) -> bool:
    # uvloop 0.23 freed a buffer twice when write_eof() met a transport whose peer had already
    # gone: only half-close a transport that is open and says it can.
    return not transport.is_closing() and transport.can_write_eof()
