"""How an inspected connection's requests differ from the forward proxy's: its surface and its records.

Owns `InspectedRequests`, the `forward/dispatch.ForwardSurface` of one inspected connection: the
principal is the connection's (decided at its CONNECT or by its transparent port), the host and
port are its TLS name's, each request is judged by the request hook
(`inspect/request_hook.judge_inspected_request`: the Host check, then
`policy/inspect_decide.decide_request`) under the policy in force when its head arrived, and a
fresh upstream is wrapped in TLS verified by the gateway's trust store. It also owns
`InspectRecords`, the audit of kind `inspect`: one line per request, written with its response,
naming the rule that judged it.

Never decides a destination (the egress core pins it), never trusts the interception CA
upstream, never writes to a client (a refusal goes back through the dispatcher's `ClientSide`).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping
from typing import Any

from gateway.egress.connect import TlsTrust
from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.inspect.request_hook import InspectedRequest, judge_inspected_request
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.observe.verdicts import outcome_for_close
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.decision.caches import DecisionCaches, ForwardTarget
from gateway.proxy.decision.records import ClosingExchange, DecisionRecords, ExchangeRecords, RequestLines
from gateway.proxy.forward.exchange import ForwardExchange

KIND = "inspect"
# Inside TLS: the port a request's Host and a refusal's status line leave out.
TLS_DEFAULT_PORT = 443


class InspectedRequests:
    """`ForwardSurface` of one inspected connection: its principal and host, its request rules,
    its upstream TLS."""

    # Requests inside terminated TLS: a credential's binding (https only) can hold for them.
    outbound_scheme = "https"
    outbound_kind = KIND
    dial_kind = KIND

    def __init__(
        self,
        records: ExchangeRecords,
        caches: DecisionCaches,
        trust: TlsTrust,
        *,
        principal: str,
        host: str,
        port: int,
    ) -> None:
        self.records = records
        self.caches = caches
        self.trust = trust
        self.principal = principal  # the connection's principal, by name (a reload may remove it)
        self.host = host
        self.port = port

    def principal_for(self, loaded: LoadedPolicy) -> Principal:
        principal = loaded.policy.principals.get(self.principal)
        if principal is None:
            # A reload removed the principal: the connection's credential stops working.
            raise GatewayError(ErrorCode.AUTH_REQUIRED, "this connection's principal is no longer in the policy")
        return principal

    def request_url(self, exchange: ForwardExchange, loaded: LoadedPolicy) -> bytes:
        """The request judged by the rules (the policy in force now: a reload changes the next
        request on a kept-alive connection), then `https://host:port/origin-form`."""
        try:
            principal = self.principal_for(loaded)
        except GatewayError as error:
            self._refuse(exchange, error, loaded, principal=self.principal, method="", path="")
            raise
        parsed = exchange.request
        request = InspectedRequest(
            self.host,
            self.port,
            True,
            self.caches.method_name(parsed.method),
            parsed.url.decode("latin-1"),
            tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in parsed.headers),
            parsed.fields,
        )
        try:
            judgement = judge_inspected_request(loaded.policy, principal, request)
        except GatewayError as error:
            path = request.target.partition("?")[0]
            self._refuse(exchange, error, loaded, principal=principal.name, method=request.method, path=path)
            raise
        verdict = exchange.verdict = judgement.verdict
        if verdict.verdict == "deny":
            refusal = verdict.refusal()
            self._refuse(exchange, refusal, loaded, principal=principal.name, method=request.method, path=verdict.path)
            raise refusal
        exchange.fields = judgement.fields
        return b"https://%b:%d%b" % (self.host.encode("ascii"), self.port, judgement.origin_form.encode())

    def forward_target(self, url: bytes) -> ForwardTarget:
        """`https://host:port/path` (`request_url`'s): Host without :443."""
        rest = url.partition(b"://")[2]
        authority, slash, path = rest.partition(b"/")
        name, _, port_text = authority.rpartition(b":")
        host = self.caches.vetted_host(name.strip(b"[]"))
        port = int(port_text)
        shown = b"[" + name.strip(b"[]") + b"]" if host.ip is not None and host.ip.version == 6 else name
        return ForwardTarget(host, port, slash + path, shown if port == TLS_DEFAULT_PORT else shown + b":%d" % port)

    def destination(self, loaded: LoadedPolicy, target: PinnedTarget, exchange: ForwardExchange) -> PinnedTarget:
        return target  # the name's own vetted addresses (the TLS name was decided as a CONNECT)

    async def upstream_tls(self) -> ssl.SSLContext:
        return await self.trust.context()

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
        """A refusal's line (what it names: the request's method and path) and its count."""
        metrics.INSPECTED_REQUESTS.labels("deny", str(error.code)).inc()
        self.records.record_deny(
            KIND,
            principal,
            self.host,
            self.port,
            error=error,
            generation=loaded.generation,
            client=exchange.client.audit_fields,
            method=method,
            path=path,
        )


class InspectRecords:
    """`ExchangeRecords` of kind `inspect`, over the proxy's `DecisionRecords`: an allowed
    request's one audit line is its close line (with its verdict's rule), not an allow line and
    a close line; refusals and counts are the proxy's."""

    def __init__(self, audit: AuditLog) -> None:
        self.records = DecisionRecords(audit, kind=KIND)
        self.audit = audit
        # Refusals and counts are the proxy's own, unchanged: its methods, not wrappers of them.
        self.record_deny = self.records.record_deny
        self.count_decision = self.records.count_decision

    def record_allow(
        self,
        kind: str,
        principal: Principal,
        target: PinnedTarget,
        *,
        method: str | None = None,
        path: str | None = None,
        client: Mapping[str, Any] | None = None,
        original_dst: str | None = None,
    ) -> RequestLines:
        lines = self.records.allow_lines(kind, principal, target, method=method, path=path, original_dst=original_dst)
        self.write_allow(lines, client)
        return lines

    def write_allow(self, lines: RequestLines, client: Mapping[str, Any] | None) -> None:
        # Counted now; written once, with the response, as the request's one line.
        lines.allow_counter.value += 1

    def record_exchange_close(self, exchange: ClosingExchange, reason: str, duration_s: float | None = None) -> None:
        lines = exchange.lines
        if lines is None:
            return
        verdict = exchange.verdict
        upstream = exchange.upstream
        target = lines.target
        write_inspected_close(
            self.audit,
            principal=lines.principal,
            host=target.name,
            port=target.port,
            address=(upstream.key[1] or None) if upstream is not None else None,
            method=lines.method,
            path=verdict.path if verdict is not None else lines.path,
            status=exchange.status or None,
            bytes_up=exchange.bytes_up,
            bytes_down=exchange.bytes_down,
            duration_s=time.monotonic() - exchange.started if duration_s is None else duration_s,
            verdict=verdict.verdict if verdict is not None else "allow",
            rule=verdict.rule if verdict is not None else None,
            code=str(verdict.code) if verdict is not None and verdict.code is not None else None,
            reason=reason,
            generation=target.generation,
            audit_fields=exchange.client.audit_fields,
        )


def write_inspected_close(
    audit: AuditLog,
    *,
    principal: str,
    host: str,
    port: int,
    address: str | None,
    method: str | None,
    path: str | None,
    status: int | None,
    bytes_up: int,
    bytes_down: int,
    duration_s: float,
    verdict: str,
    rule: str | None,
    reason: str,
    generation: int,
    audit_fields: Mapping[str, Any],
    upgrade: str | None = None,
    code: str | None = None,
) -> None:
    """The close line of one inspected request or WebSocket upgrade, and its count: the one
    place both are written, so the two kinds of inspected traffic read the same in the audit."""
    decision = verdict if verdict != "uninspected" else "allow"
    metrics.INSPECTED_REQUESTS.labels(decision, "none").inc()
    audit.write(
        "close",
        kind=KIND,
        principal=principal,
        host=host,
        port=port,
        address=address,
        method=method,
        path=path,
        status=status,
        upgrade=upgrade,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        duration_s=round(duration_s, 6),
        decision=decision,
        rule=rule,
        code=code,
        close_reason=reason,
        outcome=outcome_for_close(reason),
        generation=generation,
        **audit_fields,
    )
