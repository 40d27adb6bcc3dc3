"""Plain HTTP dispatch: decide one absolute-URI request and put it on an upstream connection.

Owns the step between a parsed request head and `UpstreamConnection.start`, writing the
exchange's decision fields (`ForwardExchange`: `url`, `fields`, `principal`, `target`, ... and
nothing else of it): the listener's `ForwardSurface` asked
first when it has one (the transparent port's, an inspected connection's), the outbound screen
(`credentials.guard`: URL, header fields and a held body window scanned, a bound credential
injected inside inspected TLS, issue 26), the decision through
`DecisionCaches` and the egress core (synchronous when `EgressCore.pin_cached` can decide, so a
keep-alive request costs no task; an owned task awaiting `EgressCore.pin` on a DNS cache miss),
the decision record, the rewritten upstream head, a pooled connection or a fresh pinned dial,
and the one retry of a request a stale pooled connection dropped.

Never writes to the client itself: refusals and failures go back through the exchange's
`ClientSide`, which owns the client connection's framing and keep-alive. Never knows which
listener it serves but through its surface.
"""

from __future__ import annotations

import ssl
import time
from functools import partial
from typing import Protocol

from gateway.credentials.guard import OutboundGuard, content_encoding
from gateway.credentials.screen import RequestFacts as OutboundFacts
from gateway.egress.connect import open_pinned_connection
from gateway.egress.target import EgressCore, PinnedTarget
from gateway.errors import GatewayError
from gateway.memo import BoundedMemo
from gateway.observe import metrics
from gateway.policy.inspect_decide import RequestFacts, decide_request
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.decision.caches import (
    MAX_CACHED_TARGETS,
    MAX_CACHED_URL_BYTES,
    DecisionCaches,
    ForwardTarget,
)
from gateway.proxy.decision.records import ExchangeRecords
from gateway.proxy.forward.exchange import ForwardExchange, build_request_head
from gateway.proxy.forward.kept_decision import KeptDecision
from gateway.proxy.forward.pool import UpstreamPool
from gateway.proxy.forward.upstream import UpstreamConnection
from gateway.tasks import spawn

_HTTP_LATENCY = metrics.CONNECT_SECONDS.labels("http")


def _upstream_head(exchange: ForwardExchange, forward: ForwardTarget) -> bytes:
    """The request's upstream head: the one its connection's kept decision last built when the
    request repeats the fields it was built from, else built (and kept) now."""
    method, fields, chunked = exchange.request.method, exchange.fields, exchange.request.chunked
    kept = exchange.client.kept_decision
    if kept is None or kept.forward is not forward:
        return build_request_head(method, forward.origin_form, forward.authority, fields, chunked)
    if kept.head_fields == fields and kept.head_method == method and kept.head_chunked == chunked:
        return kept.head
    kept.head_method, kept.head_fields, kept.head_chunked = method, fields, chunked
    kept.head = build_request_head(method, forward.origin_form, forward.authority, fields, chunked)
    return kept.head


class ForwardSurface(Protocol):
    """How a listener's requests differ from the forward proxy's, as Smokescreen's `Decider`
    keeps its callers apart: who is asking (a transparent port's principal, an inspected
    connection's, never a Proxy-Authorization), what the request names (an origin-form target
    made absolute from its Host; inside terminated TLS, the connection's host once the request
    rules judged the request), what destination means (`destination: strict`), and how a fresh
    upstream is wrapped (TLS for an inspected host). The forward proxy has none
    (`ForwardDispatcher(surface=None)`): credentials, absolute URIs, the egress core's decision
    as it is, plain TCP."""

    # What the outbound guard is told about these requests (`http`; `https` and `inspect` inside
    # terminated TLS, where a credential's binding can hold), and the label a fresh upstream's
    # dial time is counted under (`connect_seconds`).
    outbound_scheme: str
    outbound_kind: str
    dial_kind: str

    def principal_for(self, loaded: LoadedPolicy) -> Principal: ...

    def request_url(self, exchange: ForwardExchange, loaded: LoadedPolicy) -> bytes:
        """The absolute URI to decide (the surface may set the decision's `fields` and `verdict`
        as it judges the request); raises a `GatewayError` (already recorded) to refuse."""
        ...

    def forward_target(self, url: bytes) -> ForwardTarget:
        """`url` (from `request_url`) split and vetted."""
        ...

    def destination(self, loaded: LoadedPolicy, target: PinnedTarget, exchange: ForwardExchange) -> PinnedTarget:
        """The target to send to for the egress core's decision; raises a `GatewayError` to refuse."""
        ...

    async def upstream_tls(self) -> ssl.SSLContext | None:
        """The TLS a fresh upstream connection is wrapped in, or None (plain HTTP)."""
        ...


class ForwardDispatcher:
    """The decision and the upstream choice for the client connections of a listener (or of one
    inspected connection: its surface is the connection's)."""

    def __init__(
        self,
        core: EgressCore,
        caches: DecisionCaches,
        records: ExchangeRecords,
        pool: UpstreamPool[UpstreamConnection],
        guard: OutboundGuard | None = None,
        *,
        surface: ForwardSurface | None = None,
    ) -> None:
        self.core = core
        self.surface = surface
        # What the outbound guard is told: plain HTTP unless the surface says otherwise (a
        # credential's binding never holds for plain HTTP).
        self.outbound_scheme = "http" if surface is None else surface.outbound_scheme
        self.outbound_kind = "http" if surface is None else surface.outbound_kind
        # Where a fresh upstream connection's dial time is counted.
        self.dial_seconds = _HTTP_LATENCY if surface is None else metrics.CONNECT_SECONDS.labels(surface.dial_kind)
        self.caches = caches
        self.records = records
        self.pool = pool
        # The outbound secret scan and placeholder check (issue 26); None: nothing to look for.
        self.guard = guard
        # The audit lines' `path` of each origin-form target, as `DecisionCaches` remembers the
        # targets themselves (the same bound): decoding and splitting it costs 4 k instructions.
        self._audit_paths: BoundedMemo[bytes, str] = BoundedMemo(MAX_CACHED_TARGETS)

    def start(self, exchange: ForwardExchange) -> None:
        """Decide and send: synchronously when no DNS query is needed, else in an owned task."""
        surface = self.surface
        loaded = self.core.policy.current
        if surface is not None:
            try:
                exchange.url = surface.request_url(exchange, loaded)
            except GatewayError as error:
                exchange.client.refuse_exchange(exchange, error)
                return
        authorization, url, client = exchange.request.authorization, exchange.url, exchange.client
        kept = client.kept_decision
        # A keep-alive connection repeating its request: its last decision, if it still holds.
        if kept is not None and kept.url == url and kept.authorization == authorization:
            try:
                holds = self.core.still_pinned(kept.target, loaded)
            except GatewayError as error:
                self._deny(exchange, error, loaded, kept.principal, kept.forward)
                return
            if holds:
                if self.guard is None or self._screen_head(exchange, kept.principal, kept.forward, loaded):
                    self._send(exchange, kept.principal, kept.forward, kept.target, loaded)
                return
        principal: Principal | None = None
        forward: ForwardTarget | None = None
        try:
            principal = (
                self.caches.principal_for(loaded, authorization, client.peer_uid(loaded))
                if surface is None
                else surface.principal_for(loaded)
            )
            forward = self.caches.forward_target(url) if surface is None else surface.forward_target(url)
            target = self.core.pin_cached(principal, forward.host, forward.port, loaded)
        except GatewayError as error:
            claimed = self.caches.claimed_principal(authorization) if principal is None else None
            self._deny(exchange, error, loaded, principal, forward, claimed=claimed)
            return
        if self.guard is not None and not self._screen_head(exchange, principal, forward, loaded):
            return
        if target is None:
            spawn(self._pin_then_send(exchange, principal, forward, loaded), name="proxy-forward")
            return
        keys = self.pool.keys_for(principal.name, target)
        client.kept_decision = KeptDecision(authorization, url, principal, forward, target, pool_keys=keys)
        self._send(exchange, principal, forward, target, loaded)

    def retry(self, exchange: ForwardExchange) -> None:
        """Send a request again on a fresh connection (a pooled one died before answering it)."""
        timeout_s = self.core.policy.current.policy.proxy.connect_timeout_s
        spawn(self._send_on_fresh_connection(exchange, exchange.upstream_head, timeout_s), name="proxy-retry")

    async def _pin_then_send(
        self, exchange: ForwardExchange, principal: Principal, forward: ForwardTarget, loaded: LoadedPolicy
    ) -> None:
        try:
            target = await self.core.pin(principal, forward.host, forward.port, loaded=loaded)
        except GatewayError as error:
            self._deny(exchange, error, loaded, principal, forward)
            return
        client = exchange.client
        if client.closed:
            return  # the client left while we resolved; its connection_lost already cleaned up
        keys = self.pool.keys_for(principal.name, target)
        client.kept_decision = KeptDecision(
            exchange.request.authorization, exchange.url, principal, forward, target, pool_keys=keys
        )
        self._send(exchange, principal, forward, target, loaded)

    def _screen_head(
        self, exchange: ForwardExchange, principal: Principal, forward: ForwardTarget, loaded: LoadedPolicy
    ) -> bool:
        """The URL and header fields scanned before anything is sent, and the body's scan set up
        (it reads the body as it arrives; `_send` waits for its verdict). False: refused."""
        guard = self.guard
        assert guard is not None
        policy = loaded.policy
        if guard.settings_for(policy, principal) is None:
            return True  # no credential held, no `scan:`: nothing to look for (the common case)
        path = forward.origin_form.partition(b"?")[0].decode("latin-1")
        method = self.caches.method_name(exchange.request.method)
        facts = OutboundFacts(
            self.outbound_kind, principal.name, self.outbound_scheme, forward.host.name, forward.port, method, path
        )
        try:
            # Inside a binding (https): the placeholder becomes the real value, and the response
            # is scrubbed of it on its way back (`forward.UpstreamConnection.data_received`).
            exchange.fields, exchange.scrubber = guard.guard_head(
                facts, policy, principal, url=exchange.url, fields=exchange.fields, generation=loaded.generation
            )
        except GatewayError as refusal:
            self._deny(exchange, refusal, loaded, principal, forward)
            return False
        if not exchange.body_done:
            exchange.body_guard = guard.body(facts, policy, principal, content_encoding(exchange.fields))
        return True

    def _send(
        self,
        exchange: ForwardExchange,
        principal: Principal,
        forward: ForwardTarget,
        target: PinnedTarget,
        loaded: LoadedPolicy,
    ) -> None:
        surface = self.surface
        if surface is not None:
            try:
                target = surface.destination(loaded, target, exchange)
            except GatewayError as error:
                self._deny(exchange, error, loaded, principal, forward)
                return
        # A request its surface judged already (inside terminated TLS) is not judged again.
        if (
            (principal.inspect or loaded.policy.defaults.inspect)
            and exchange.verdict is None
            and not self.judge_plain(exchange, principal, forward, loaded)
        ):
            return
        body_guard = exchange.body_guard
        if body_guard is not None:
            if not body_guard.settled:
                # Held until the scan window is read or the body ends (`ForwardExchange._body_read`).
                # A partial, not a lambda: a closure here would make this method's arguments
                # cells on every request, screened or not (about 0.5 k instructions per request).
                exchange.body_screened = partial(self._send_screened, exchange, principal, forward, target, loaded)
                return
            self._send_screened(exchange, principal, forward, target, loaded)
            return
        self._send_now(exchange, principal, forward, target, loaded)

    def _send_screened(
        self,
        exchange: ForwardExchange,
        principal: Principal,
        forward: ForwardTarget,
        target: PinnedTarget,
        loaded: LoadedPolicy,
    ) -> None:
        body_guard = exchange.body_guard
        exchange.body_guard = None
        if exchange.client.closed or body_guard is None:
            return
        refusal = body_guard.verdict(loaded.generation)
        if refusal is not None:
            self._deny(exchange, refusal, loaded, principal, forward)
            return
        self._send_now(exchange, principal, forward, target, loaded)

    def _send_now(
        self,
        exchange: ForwardExchange,
        principal: Principal,
        forward: ForwardTarget,
        target: PinnedTarget,
        loaded: LoadedPolicy,
    ) -> None:
        exchange.principal = principal
        exchange.target = target
        method = exchange.request.method
        client = exchange.client
        # The decision `start` just kept for this request (or reused): its last lines are this
        # request's when the method and target are the same.
        kept = client.kept_decision
        lines = kept.lines if kept is not None else None
        if kept is not None and lines is not None and lines.target is target and kept.lines_method == method:
            self.records.write_allow(lines, client.audit_fields)
        else:
            audit_path = self._audit_paths.get(forward.origin_form)
            if audit_path is None:
                audit_path = self._audit_path(forward.origin_form)
            lines = self.records.record_allow(
                "http",
                principal,
                target,
                method=self.caches.method_name(method),
                path=audit_path,
                client=client.audit_fields,
            )
            if kept is not None:
                kept.lines, kept.lines_method = lines, method
        exchange.lines = lines
        settings = exchange.settings = loaded.policy.proxy
        head = exchange.upstream_head = _upstream_head(exchange, forward)
        # The kept decision's pool keys, unless this request is pinned to another target (a
        # transparent connection's destination).
        keys = (
            kept.pool_keys if kept is not None and kept.target is target else self.pool.keys_for(principal.name, target)
        )
        upstream = self.pool.acquire(keys)
        if upstream is None:
            spawn(self._send_on_fresh_connection(exchange, head, settings.connect_timeout_s), name="proxy-dial")
            return
        upstream.start(exchange, head)

    def judge_plain(
        self, exchange: ForwardExchange, principal: Principal, forward: ForwardTarget, loaded: LoadedPolicy
    ) -> bool:
        """The inspect rules on a plain HTTP request to a host an entry names (issue 25): the
        same decision as inside terminated TLS. False when it is refused (answered here)."""
        facts = RequestFacts(
            forward.host.name,
            forward.port,
            False,
            self.caches.method_name(exchange.request.method),
            forward.origin_form.decode("latin-1"),
            tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in exchange.request.headers),
        )
        verdict = decide_request(loaded.policy, principal, facts)
        if not verdict.inspected:
            return True
        exchange.verdict = verdict
        metrics.INSPECTED_REQUESTS.labels(verdict.verdict, str(verdict.code or "none")).inc()
        if verdict.verdict != "deny":
            return True
        error = verdict.refusal()
        self.records.record_deny(
            "http",
            principal.name,
            forward.host.name,
            forward.port,
            error=error,
            generation=loaded.generation,
            client=exchange.client.audit_fields,
            method=facts.method,
            path=verdict.path,
        )
        exchange.client.refuse_exchange(exchange, error)
        return False

    def _audit_path(self, origin_form: bytes) -> str | None:
        path = self.records.audit.http_path(origin_form)
        if path is not None and len(origin_form) <= MAX_CACHED_URL_BYTES:
            self._audit_paths.put(origin_form, path)
        return path

    async def _send_on_fresh_connection(self, exchange: ForwardExchange, head: bytes, timeout_s: float) -> None:
        target, principal = exchange.target, exchange.principal
        assert target is not None
        assert principal is not None
        pool = self.pool
        surface = self.surface
        started = time.perf_counter()
        try:
            # The surface's TLS (an inspected host's: the gateway's trust store, never the
            # interception CA), else plain TCP.
            tls = None if surface is None else await surface.upstream_tls()
            _, upstream, address = await open_pinned_connection(
                target, lambda: UpstreamConnection(pool, ("", "", "", 0)), timeout_s=timeout_s, tls=tls
            )
        except GatewayError as error:
            exchange.client.fail_exchange(exchange, str(error.code), error.message)
            return
        self.dial_seconds.observe(time.perf_counter() - started)
        upstream.key = (principal.name, address, target.name, target.port)
        if exchange.client.closed:
            upstream.close()
            return
        upstream.start(exchange, head)

    def _deny(
        self,
        exchange: ForwardExchange,
        error: GatewayError,
        loaded: LoadedPolicy,
        principal: Principal | None,
        forward: ForwardTarget | None,
        *,
        claimed: str | None = None,
    ) -> None:
        self.records.record_deny(
            "http",
            principal.name if principal else None,
            forward.host.name if forward else None,
            forward.port if forward else None,
            error=error,
            generation=loaded.generation,
            client=exchange.client.audit_fields,
            claimed=claimed,
        )
        exchange.client.refuse_exchange(exchange, error)
