"""An inspected connection: TLS terminated for a host an `inspect` entry names, then the proxy's
own HTTP/1.1 handling of every request inside it, each judged by the rules before it goes out.

Owns the hand-over (`InspectService.take_over`) from a decided CONNECT or transparent TLS
connection, the bridge between the agent's socket and the sans-I/O `TlsTerminator` (the
ClientHello the connection already holds is fed first: never `loop.start_tls`), and the
`ClientConnection` that runs over the decrypted stream (request framing, smuggling rules,
response re-framing, deadlines and keep-alive are the forward proxy's). A request's verdict is
`inspect.request_hook.judge_inspected_request`'s, under the policy in force when its head
arrives; its upstream is a fresh TLS connection (the gateway's trust store, the name's
hostname check) to the vetted address, pooled per principal apart from plain HTTP.

Never decides a destination itself (the egress core pins it), never trusts the interception CA
upstream, never splices a host that is not inspected (those never reach this module).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Mapping
from typing import Any

from gateway.credentials.guard import OutboundGuard
from gateway.credentials.inject import Scrubber
from gateway.credentials.screen import RequestFacts as OutboundFacts
from gateway.egress.connect import TlsTrust, open_pinned_connection
from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.inspect.leaves import LeafContexts
from gateway.inspect.request_hook import InspectedRequest, judge_inspected_request
from gateway.inspect.terminator import TlsTerminator, check_offered_alpn
from gateway.inspect.tls_transport import TlsClientTransport
from gateway.memo import BoundedMemo
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.observe.verdicts import outcome_for_close
from gateway.policy.inspect_decide import RequestVerdict
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.client_connection import ClientConnection
from gateway.proxy.decision.caches import DecisionCaches, ForwardTarget
from gateway.proxy.decision.records import ClosingExchange, DecisionRecords, RequestLines
from gateway.proxy.forward.dispatch import ForwardDispatcher
from gateway.proxy.forward.exchange import ForwardExchange
from gateway.proxy.forward.pool import UpstreamPool
from gateway.proxy.forward.upstream import UpstreamConnection
from gateway.proxy.http1.heads import error_response
from gateway.proxy.http1.request_framing import UPGRADE_REFUSED, ConnectHead, RequestFraming, UpgradeHead
from gateway.proxy.inspected_upgrade import (
    RelayOutcome,
    UpgradeRelay,
    upgrade_fields,
    upstream_upgrade_head,
)
from gateway.proxy.server import ProxyServer
from gateway.proxy.tls.sni import PeekStatus, peek_client_hello
from gateway.tasks import spawn

log = logging.getLogger("egress_gateway.inspect")

KIND = "inspect"
# Hosts already logged as `tls_untrusted`: one warning per host, not one per connection.
MAX_UNTRUSTED_LOGGED = 1024
_INSPECT_LATENCY = metrics.CONNECT_SECONDS.labels("inspect")


class InspectExchange(ForwardExchange):
    """A forwarded request and the verdict the inspect rules gave it (for its audit line)."""

    __slots__ = ("verdict",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.verdict: RequestVerdict | None = None


class InspectCaches(DecisionCaches):
    """The proxy's decision caches for requests inside an inspected connection.

    The principal is the connection's (decided at its CONNECT or by its transparent port),
    carried in the exchange where a forwarded request carries its credential: the name."""

    def principal_for(
        self, loaded: LoadedPolicy, authorization: bytes | None, peer_uid: int | None = None
    ) -> Principal:
        principal = loaded.policy.principals.get((authorization or b"").decode("ascii", "replace"))
        if principal is None:
            # A reload removed the principal: the connection's credential stops working.
            raise GatewayError(ErrorCode.AUTH_REQUIRED, "this connection's principal is no longer in the policy")
        return principal

    def forward_target(self, url: bytes) -> ForwardTarget:
        """`https://host:port/path` (the dispatcher builds it): Host without :443."""
        rest = url.partition(b"://")[2]
        authority, slash, path = rest.partition(b"/")
        name, _, port_text = authority.rpartition(b":")
        host = self.vetted_host(name.strip(b"[]"))
        port = int(port_text)
        shown = b"[" + name.strip(b"[]") + b"]" if host.ip is not None and host.ip.version == 6 else name
        return ForwardTarget(host, port, slash + path, shown if port == 443 else shown + b":%d" % port)


class InspectRecords(DecisionRecords):
    """The proxy's decision records with kind `inspect`, one audit line per request."""

    def __init__(self, audit: AuditLog) -> None:
        super().__init__(audit, kind=KIND)

    def write_allow(self, lines: RequestLines, client: Mapping[str, Any] | None) -> None:
        # Counted now; written once, with the response, as the request's one line.
        lines.allow_counter.value += 1

    def record_exchange_close(self, exchange: ClosingExchange, reason: str, duration_s: float | None = None) -> None:
        lines = exchange.lines
        if lines is None:
            return
        verdict = exchange.verdict if isinstance(exchange, InspectExchange) else None
        upstream = exchange.upstream
        target = lines.target
        decision = verdict.verdict if verdict is not None and verdict.verdict != "uninspected" else "allow"
        metrics.INSPECTED_REQUESTS.labels(decision, "none").inc()
        self.audit.write(
            "close",
            kind=KIND,
            principal=lines.principal,
            host=target.name,
            port=target.port,
            address=(upstream.key[1] or None) if upstream is not None else None,
            method=lines.method,
            path=verdict.path if verdict is not None else lines.path,
            status=exchange.status or None,
            bytes_up=exchange.bytes_up,
            bytes_down=exchange.bytes_down,
            duration_s=round(time.monotonic() - exchange.started if duration_s is None else duration_s, 6),
            decision=decision,
            rule=verdict.rule if verdict is not None and verdict.rule is not None else None,
            code=str(verdict.code) if verdict is not None and verdict.code is not None else None,
            close_reason=reason,
            outcome=outcome_for_close(reason),
            generation=target.generation,
            **exchange.client.audit_fields,
        )


class InspectDispatcher(ForwardDispatcher):
    """Judges each request by the inspect rules, then sends it over TLS to the pinned address."""

    # Requests inside terminated TLS: a credential's binding (https only) can hold for them.
    outbound_scheme = "https"
    outbound_kind = KIND
    dial_seconds = _INSPECT_LATENCY

    def __init__(
        self,
        core: EgressCore,
        caches: DecisionCaches,
        records: DecisionRecords,
        pool: UpstreamPool[UpstreamConnection],
        *,
        trust: TlsTrust,
        guard: OutboundGuard | None = None,
    ) -> None:
        super().__init__(core, caches, records, pool, guard)
        self.trust = trust

    def start(self, exchange: ForwardExchange) -> None:
        client = exchange.client
        assert isinstance(client, InspectedClient)
        assert isinstance(exchange, InspectExchange)
        loaded = self.core.policy.current
        # The policy in force now, for this request: a reload changes the next request on a
        # kept-alive connection.
        try:
            principal = self.caches.principal_for(loaded, client.principal_name.encode())
        except GatewayError as error:
            self._refuse(exchange, error, loaded, principal=client.principal_name, method="", path="")
            return
        request = InspectedRequest(
            client.host,
            client.port,
            True,
            self.caches.method_name(exchange.method),
            exchange.url.decode("latin-1"),
            tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in exchange.headers),
            exchange.fields,
        )
        try:
            judgement = judge_inspected_request(loaded.policy, principal, request)
        except GatewayError as error:
            self._refuse(
                exchange,
                error,
                loaded,
                principal=principal.name,
                method=request.method,
                path=request.target.partition("?")[0],
            )
            return
        verdict = exchange.verdict = judgement.verdict
        if verdict.verdict == "deny":
            self._refuse(
                exchange, verdict.refusal(), loaded, principal=principal.name, method=request.method, path=verdict.path
            )
            return
        exchange.fields = judgement.fields
        exchange.authorization = client.principal_name.encode()
        exchange.url = b"https://%b:%d%b" % (client.host.encode("ascii"), client.port, judgement.origin_form.encode())
        super().start(exchange)

    def judge_plain(
        self, exchange: ForwardExchange, principal: Principal, forward: ForwardTarget, loaded: LoadedPolicy
    ) -> bool:
        return True  # judged in `start`, as TLS, with the Host check

    def _refuse(
        self,
        exchange: ForwardExchange,
        error: GatewayError,
        loaded: LoadedPolicy,
        *,
        principal: str,
        method: str,
        path: str,
    ) -> None:
        client = exchange.client
        assert isinstance(client, InspectedClient)
        metrics.INSPECTED_REQUESTS.labels("deny", str(error.code)).inc()
        self.records.record_deny(
            KIND,
            principal,
            client.host,
            client.port,
            error=error,
            generation=loaded.generation,
            client=client.audit_fields,
            method=method,
            path=path,
        )
        client.refuse_exchange(exchange, error)

    async def upstream_tls(self) -> ssl.SSLContext:
        return await self.trust.context()


class InspectedClient(ClientConnection):
    """The proxy's client connection over the decrypted stream of one inspected connection."""

    __slots__ = ("_relay", "host", "port", "principal_name")
    # Requests arrive inside TLS: 443 is the port a refusal's status line leaves out.
    refusal_default_port = 443

    def __init__(self, server: ProxyServer, principal_name: str, host: str, port: int) -> None:
        super().__init__(server)
        # Upgrades come out as events: judged by the rules, then relayed (`_begin_upgrade`).
        self._framing = RequestFraming(InspectExchange, server.head_memos, upgrades=True)
        self.principal_name = principal_name
        self.host = host
        self.port = port
        self._relay: UpgradeRelay | None = None

    def _begin_connect(self, head: ConnectHead) -> None:
        self._refuse(GatewayError(ErrorCode.INVALID_INPUT, "CONNECT is not accepted inside an inspected connection"))

    def _refuse(self, error: GatewayError) -> None:
        if error.message == UPGRADE_REFUSED:
            # Only an upgrade with a body gets here (a WebSocket handshake has none).
            error = GatewayError(
                ErrorCode.INSPECTION_UNSUPPORTED,
                f"{self.host} is inspected and only bodiless upgrade requests (WebSocket) are relayed",
            )
        super()._refuse(error)

    # upgrades (WebSocket) -------------------------------------------------------------------------
    def _begin_upgrade(self, head: UpgradeHead) -> None:
        """Judge the upgrade request by the rules; if allowed, relay it on a pinned TLS upstream."""
        self._framing = None  # whatever follows is the upgraded protocol's, or nothing
        server = self.server
        assert isinstance(server, InspectServer)
        loaded = server.core.policy.current
        method = head.method.decode("latin-1")
        url = head.url.decode("latin-1")
        path = url.partition("?")[0]
        try:
            if self.busy:
                raise GatewayError(
                    ErrorCode.INSPECTION_UNSUPPORTED, "an upgrade pipelined behind another request is not relayed"
                )
            principal = server.caches.principal_for(loaded, self.principal_name.encode())
            lines = head.head.split(b"\r\n")[1:]
            headers = tuple(
                (name.decode("latin-1").strip(), value.decode("latin-1").strip())
                for name, _, value in (line.partition(b":") for line in lines if line)
            )
            request = InspectedRequest(self.host, self.port, True, method, url, headers, b"")
            judgement = judge_inspected_request(loaded.policy, principal, request)
            path = judgement.verdict.path
            if judgement.verdict.verdict == "deny":
                raise judgement.verdict.refusal()
            fields, scrubber = self._guard_upgrade(head, judgement.origin_form, principal, loaded, method)
        except GatewayError as error:
            metrics.INSPECTED_REQUESTS.labels("deny", str(error.code)).inc()
            server.records.record_deny(
                KIND,
                self.principal_name,
                self.host,
                self.port,
                error=error,
                generation=loaded.generation,
                client=self.audit_fields,
                method=method,
                path=path,
            )
            self._answer_and_close(error, self.refusal_default_port)
            return
        upgrade = next((value for name, value in headers if name.lower() == "upgrade"), "")[:32].lower()
        verdict = judgement.verdict
        proxy = loaded.policy.proxy

        def closed(outcome: RelayOutcome) -> None:
            decision = verdict.verdict if verdict.verdict != "uninspected" else "allow"
            metrics.INSPECTED_REQUESTS.labels(decision, "none").inc()
            server.audit.write(
                "close",
                kind=KIND,
                principal=self.principal_name,
                host=self.host,
                port=self.port,
                address=outcome.address or None,
                method=method,
                path=path,
                status=outcome.status,
                upgrade=upgrade or None,
                bytes_up=outcome.bytes_up,
                bytes_down=outcome.bytes_down,
                duration_s=round(outcome.duration_s, 6),
                decision=decision,
                rule=verdict.rule,
                close_reason=outcome.reason,
                outcome=outcome_for_close(outcome.reason),
                generation=loaded.generation,
                **self.audit_fields,
            )
            server.activity_ended()  # wakes a drain waiting for this relay

        relay = self._relay = UpgradeRelay(
            self.transport,
            upstream_upgrade_head(head.head, judgement.origin_form.encode(), fields),
            idle_timeout_s=proxy.idle_timeout_s,
            lifetime_s=proxy.max_tunnel_lifetime_s,
            on_close=closed,
            scrubber=scrubber,
        )
        if head.rest:
            relay.from_client(head.rest)
        spawn(self._dial_upgrade(relay, principal, loaded), name="inspect-upgrade", loop=server.loop)

    def _guard_upgrade(
        self, head: UpgradeHead, origin_form: str, principal: Principal, loaded: LoadedPolicy, method: str
    ) -> tuple[bytes, Scrubber | None]:
        """The upgrade head through the outbound guard, as `InspectDispatcher` sends a request's:
        URL and fields screened (a placeholder or secret raises the refusal, its `security` line
        written), a bound credential injected, a scrubber for the answer. Nothing is sent yet."""
        fields = upgrade_fields(head.head)
        server = self.server
        assert isinstance(server, InspectServer)
        guard = server.dispatcher.guard
        if guard is None:
            return fields, None
        facts = OutboundFacts(
            KIND, principal.name, "https", self.host, self.port, method, origin_form.partition("?")[0]
        )
        url = b"https://%b:%d%b" % (self.host.encode("ascii"), self.port, origin_form.encode())
        return guard.guard_head(facts, loaded.policy, principal, url=url, fields=fields, generation=loaded.generation)

    async def _dial_upgrade(self, relay: UpgradeRelay, principal: Principal, loaded: LoadedPolicy) -> None:
        server = self.server
        assert isinstance(server, InspectServer)
        dispatcher = server.dispatcher
        assert isinstance(dispatcher, InspectDispatcher)
        try:
            forward = server.caches.forward_target(b"https://%b:%d/" % (self.host.encode("ascii"), self.port))
            target = await server.core.pin(principal, forward.host, forward.port, loaded=loaded)
            context = await dispatcher.trust.context()
            _, _, address = await open_pinned_connection(
                target, lambda: relay, timeout_s=loaded.policy.proxy.connect_timeout_s, tls=context
            )
        except GatewayError as error:
            if not self.closed and not relay.closed:
                self.transport.write(
                    error_response(
                        error,
                        keep_alive=False,
                        conn=self.audit_fields.get("conn"),
                        default_port=self.refusal_default_port,
                    )
                )
            relay.close(str(error.code))
            return
        relay.address = address
        if self.closed:
            relay.close("client_gone")

    @property
    def busy(self) -> bool:
        relay = self._relay
        return (relay is not None and not relay.closed) or super().busy

    def abort(self, reason: str) -> None:
        if self._relay is not None:
            self._relay.close(reason)  # its close line says why (`shutdown` at the drain's end)
        super().abort(reason)

    def data_received(self, data: bytes) -> None:
        if self._relay is not None:
            self._relay.from_client(data)
            return
        super().data_received(data)

    def eof_received(self) -> bool | None:
        if self._relay is not None:
            return None  # TLS has no half-close: the relay ends with the connection
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._relay is not None:
            self._relay.close("client_reset" if exc is not None else "client_closed")
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        if self._relay is not None:
            self._relay.client_paused_writing()
            return
        super().pause_writing()

    def resume_writing(self) -> None:
        if self._relay is not None:
            self._relay.client_resumed_writing()
            return
        super().resume_writing()


class InspectServer(ProxyServer):
    """What an `InspectedClient` reads from its server: the proxy's shared state, with the
    inspect decisions and dispatcher and a pool of TLS upstreams of its own."""

    def __init__(self, proxy: ProxyServer, trust: TlsTrust) -> None:
        self.proxy = proxy
        self.core = proxy.core
        self.audit = proxy.audit
        self.wheel = proxy.wheel
        self.caches = InspectCaches()
        self.records = InspectRecords(proxy.audit)
        # Apart from the plain HTTP pool: a TLS connection is never reused for plain HTTP.
        self.pool = UpstreamPool(proxy.wheel)
        self.tunnels = proxy.tunnels
        # The forward proxy's: an agent sends the same heads inside TLS as outside it.
        self.head_memos = proxy.head_memos
        self.dispatcher = InspectDispatcher(
            proxy.core, self.caches, self.records, self.pool, trust=trust, guard=proxy.dispatcher.guard
        )
        self.draining = False
        self.connections = set()
        self._server = None
        self._quiet = asyncio.Event()
        self.loop = proxy.loop
        self.inspection = None

    def activity_ended(self) -> None:
        # The proxy's drain waits for inspected connections too: an exchange or relay ending
        # here wakes it.
        self.proxy.activity_ended()


class TlsBridge(asyncio.Protocol):
    """The agent's socket until and after the handshake: holds the ClientHello, checks it, feeds
    the terminator, and hands plaintext to the `InspectedClient` once the handshake is done."""

    def __init__(
        self,
        service: InspectService,
        raw: asyncio.Transport,
        *,
        principal: str,
        host: str,
        port: int,
        audit_fields: Mapping[str, Any],
        preface: bytes = b"",
    ) -> None:
        self.service = service
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
        self._client: InspectedClient | None = None
        head_timeout_s = service.server.core.policy.current.policy.proxy.head_timeout_s
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
                context = self.service.leaves.context_for(self.host)
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
        client = self._client
        assert client is not None
        if plaintext:
            client.data_received(plaintext)
        if terminator.closed and not client.closed and not client.eof_received():
            client.transport.close()

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
        transport = TlsClientTransport(self.raw, terminator)
        client = self._client = InspectedClient(self.service.server, self.principal, self.host, self.port)
        transport.set_protocol(client)
        client.connection_made(transport)
        # The CONNECT's (or transparent connection's) id: its requests' lines name it.
        client.audit_fields = self.audit_fields

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self._client is None:
            self._fail(GatewayError(ErrorCode.TIMEOUT, "the agent did not complete the TLS handshake in time"))

    def _fail(self, error: GatewayError) -> None:
        """A connection that failed before any request: one audit line, a metric, closed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush_preface()
        self.service.handshake_failed(self.principal, self.host, self.port, error, self.audit_fields)
        self.raw.close()

    def eof_received(self) -> bool | None:
        if self._client is not None:
            return self._client.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._client is not None:
            self._client.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._client is not None:
            self._client.pause_writing()

    def resume_writing(self) -> None:
        if self._client is not None:
            self._client.resume_writing()


class InspectService:
    """The listeners' way into inspection: which connections it takes, and the hand-over."""

    def __init__(self, proxy: ProxyServer, leaves: LeafContexts, trust: TlsTrust) -> None:
        self.leaves = leaves
        self.server = InspectServer(proxy, trust)
        self._untrusted_logged: BoundedMemo[str, bool] = BoundedMemo(MAX_UNTRUSTED_LOGGED)

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
        if self.server.loop is None:
            self.server.loop = asyncio.get_running_loop()
        bridge = TlsBridge(
            self, raw, principal=principal, host=host, port=port, audit_fields=audit_fields, preface=preface
        )
        raw.set_protocol(bridge)
        if early:
            bridge.data_received(early)
        bridge.flush_preface()

    def handshake_failed(
        self, principal: str, host: str, port: int, error: GatewayError, audit_fields: Mapping[str, Any]
    ) -> None:
        metrics.INSPECT_HANDSHAKE_FAILURES.labels(str(error.code)).inc()
        if error.code == ErrorCode.TLS_UNTRUSTED and host not in self._untrusted_logged:
            self._untrusted_logged.put(host, True)
            log.warning("tls_untrusted: %s", error.message)
        self.server.records.record_deny(
            KIND,
            principal,
            host,
            port,
            error=error,
            generation=self.server.core.policy.current.generation,
            client=audit_fields,
        )

    def begin_drain(self) -> None:
        """SIGTERM: kept-alive inspected connections between requests close now; the others
        finish their request (or WebSocket relay) within the drain's grace, then close."""
        self.server.draining = True
        for conn in list(self.server.connections):
            conn.close_if_idle()

    def has_busy_connections(self) -> bool:
        return any(conn.busy for conn in self.server.connections)

    def close(self) -> None:
        """Shutdown: inspected connections end with the listener's (the drain waited for them
        up to its grace)."""
        for conn in list(self.server.connections):
            conn.abort("shutdown")
        self.server.pool.close()
        self.leaves.close()
