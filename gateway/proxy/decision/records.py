"""The audit record of the proxy's decisions: allow and deny lines, their counts, and close lines.

Owns the decision's audit line and `decisions_total` count for every proxy surface (CONNECT,
plain HTTP, a transparent connection), and the close line of a forwarded request, both kept per
decision and request as `RequestLines` so that a repeated request serializes nothing again. The
audit kind is the surface's unless the records were made for one kind (`transparent`).

Never decides anything (it records what the egress core decided), never caches what a decision
is computed from (`caches.py` does), never writes to a client.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.observe.audit_fields import client_line_end
from gateway.observe.audit_members import ConnectionFields, json_members
from gateway.observe.loop_metrics import CounterChild
from gateway.observe.verdicts import rule_for_code, verdict_of_failure
from gateway.policy.inspect_decide import RequestVerdict
from gateway.policy.model import Principal
from gateway.proxy.decision.caches import MAX_CACHED_URL_BYTES

# Requests whose lines are kept serialized (`RequestLines` per `AllowKey`); the lines of a path
# longer than the URL bound are serialized per request (its target is parsed every time) and
# live only as long as the request and its connection's kept decision.
MAX_CACHED_REQUEST_MEMBERS = 4096

# Close formats one `RequestLines` keeps (per status, address and close reason): a request is
# nearly always answered one way, and the bound keeps a full allow memo small.
MAX_CLOSES_PER_REQUEST_LINES = 8

# An allow line's: kind, target id, principal, method, path, original_dst.
AllowKey = tuple[str, int, str, str | None, str | None, str | None]
# A forwarded request's close line's, beside its `RequestLines`: status, address, close reason.
CloseKey = tuple[int, str | None, str]

_FORWARD_UP = metrics.HTTP_FORWARD_BYTES.labels("upstream")
_FORWARD_DOWN = metrics.HTTP_FORWARD_BYTES.labels("downstream")


class RequestLines:
    """The audit lines of one allowed (kind, target, principal, method, path, original_dst) but
    their client's members and their counts: the allow line's members and decision count, and
    a forwarded request's close line formats and outcome counts per `CloseKey`. `record_allow`
    returns them; a forwarded request holds them until its close line, and a keep-alive
    connection's kept decision holds them for its next request (no key built per line)."""

    __slots__ = ("allow_counter", "allow_members", "closes", "kind", "method", "path", "principal", "target")

    def __init__(
        self,
        target: PinnedTarget,
        *,
        kind: str,
        principal: str,
        method: str | None,
        path: str | None,
        allow_counter: CounterChild,
        allow_members: bytes,
    ) -> None:
        # Held, not only named by id in the memo's key: its id cannot be reused while these live.
        self.target = target
        self.kind = kind
        self.principal = principal
        self.method = method
        self.path = path
        self.allow_counter = allow_counter
        self.allow_members = allow_members
        # Per `CloseKey`: the outcome count and the close line's format (`record_exchange_close`).
        self.closes: dict[CloseKey, tuple[CounterChild, bytes]] = {}


class _PooledKey(Protocol):
    @property
    def key(self) -> tuple[str, str, str, int]: ...


class _AuditedClient(Protocol):
    @property
    def audit_fields(self) -> Mapping[str, Any]: ...


class ClosingExchange(Protocol):
    """What a forwarded request's close line is written from (`forward.exchange.ForwardExchange`):
    its decision's lines and verdict, its counts each way, its start and its client."""

    @property
    def lines(self) -> RequestLines | None: ...
    @property
    def verdict(self) -> RequestVerdict | None: ...
    @property
    def bytes_up(self) -> int: ...
    @property
    def bytes_down(self) -> int: ...
    @property
    def status(self) -> int: ...
    @property
    def upstream(self) -> _PooledKey | None: ...
    @property
    def started(self) -> float: ...
    @property
    def client(self) -> _AuditedClient: ...


class ExchangeRecords(Protocol):
    """What a listener's connections and dispatcher record through: `DecisionRecords`, or a
    listener's own lines over one (an inspected connection's: `inspected/requests.InspectRecords`)."""

    @property
    def audit(self) -> AuditLog: ...

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
    ) -> RequestLines: ...

    def write_allow(self, lines: RequestLines, client: Mapping[str, Any] | None) -> None: ...

    def record_deny(
        self,
        kind: str,
        principal: str | None,
        host: str | None,
        port: int | None,
        *,
        error: GatewayError,
        generation: int,
        client: Mapping[str, Any] | None = None,
        claimed: str | None = None,
        original_dst: str | None = None,
        **extra: Any,
    ) -> None: ...

    def record_exchange_close(
        self, exchange: ClosingExchange, reason: str, duration_s: float | None = None
    ) -> None: ...

    def count_decision(self, kind: str, decision: str, code: str) -> None: ...


class DecisionRecords:
    """The audit lines and counts of every proxy decision, kept serialized per decision and request."""

    def __init__(self, audit: AuditLog, *, kind: str | None = None) -> None:
        self.audit = audit
        # The audit kind every line and count takes instead of the caller's (`transparent` for the
        # transparent listener's plain HTTP); None keeps connect/http.
        self.kind_override = kind
        self._decision_counters: dict[tuple[str, str, str], CounterChild] = {}
        # Per `AllowKey`: its lines (`record_allow`).
        self._allow_lines: BoundedMemo[AllowKey, RequestLines] = BoundedMemo(MAX_CACHED_REQUEST_MEMBERS)

    def record_exchange_close(self, exchange: ClosingExchange, reason: str, duration_s: float | None = None) -> None:
        """The close audit line of a forwarded request (none for a request that was never
        allowed: it has no `lines`), `duration_s` since it started (read here when not given)."""
        lines = exchange.lines
        if lines is not None:
            # The counter children's own field: `inc()` would be one more call each.
            bytes_up = exchange.bytes_up
            bytes_down = exchange.bytes_down
            _FORWARD_UP.value += bytes_up
            _FORWARD_DOWN.value += bytes_down
            upstream = exchange.upstream
            key = (exchange.status, (upstream.key[1] or None) if upstream is not None else None, reason)
            close = lines.closes.get(key)
            if close is None:
                close = self._close_line(lines, key)
            close[0].value += 1
            client = exchange.client.audit_fields
            self.audit.write_close(
                close[1],
                bytes_up,
                bytes_down,
                time.monotonic() - exchange.started if duration_s is None else duration_s,
                client.line_end if type(client) is ConnectionFields else client_line_end(client, drop_none=True),
            )

    def _close_line(self, lines: RequestLines, key: CloseKey) -> tuple[CounterChild, bytes]:
        """A forwarded request's close line but its counts and client, as `AuditLog.close_format`:
        the request's `method`, `path` (when audited), `status` (when one came) and the `address`
        after the decision's members."""
        status, address, reason = key
        after: dict[str, Any] = {"method": lines.method}
        if lines.path is not None:
            after["path"] = lines.path
        if status:
            after["status"] = status
        if address is not None:
            after["address"] = address
        close = self.audit.close_format(lines.kind, lines.principal, lines.target, reason, b"," + json_members(after))
        closes = lines.closes
        if len(closes) >= MAX_CLOSES_PER_REQUEST_LINES:
            closes.clear()
        closes[key] = close
        return close

    def count_decision(self, kind: str, decision: str, code: str) -> None:
        self._decision_counter(self.kind_override or kind, decision, code).inc()

    def _decision_counter(self, kind: str, decision: str, code: str) -> CounterChild:
        key = (kind, decision, code)
        counter = self._decision_counters.get(key)
        if counter is None:
            counter = self._decision_counters[key] = metrics.DECISIONS.labels(kind, decision, code)
        return counter

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
        """The allow (or report mode's would_deny) line and count of every surface's decision:
        CONNECT, plain HTTP, and a transparent connection (which adds the `original_dst` it
        dialed). Returns the lines it wrote from, for `write_allow` and the request's close line."""
        lines = self.allow_lines(kind, principal, target, method=method, path=path, original_dst=original_dst)
        self.write_allow(lines, client)
        return lines

    def allow_lines(
        self,
        kind: str,
        principal: Principal,
        target: PinnedTarget,
        *,
        method: str | None = None,
        path: str | None = None,
        original_dst: str | None = None,
    ) -> RequestLines:
        """The lines `record_allow` writes from, not written (nor counted)."""
        kind = self.kind_override or kind
        # Every member but the client's is the same on every line of this decision and request,
        # so they are serialized once; the client's members are its connection's.
        key = (kind, id(target), principal.name, method, path, original_dst)
        lines = self._allow_lines.get(key)
        if lines is None or lines.target is not target:
            lines = self._allow_prepared(key, principal, target)
        return lines

    def write_allow(self, lines: RequestLines, client: Mapping[str, Any] | None) -> None:
        """The allow line and count of `lines` (which `record_allow` returned for the same
        decision and request) for `client`: a kept decision's next request, without a key."""
        # The counter child's own field: `inc()` would be one more call per line.
        lines.allow_counter.value += 1
        self.audit.write_line(
            lines.allow_members,
            client.line_end if type(client) is ConnectionFields else client_line_end(client, drop_none=False),
        )

    def _allow_prepared(self, key: AllowKey, principal: Principal, target: PinnedTarget) -> RequestLines:
        """An allow line's count and its members but the client's: the decision's up to
        `rule_pattern`, then `method`, `path` and `original_dst` when given."""
        kind, _, _, method, path, original_dst = key
        counter, record = self._allow_line(kind, principal, target)
        if method is not None:
            record["method"] = method
        if path is not None:
            record["path"] = path
        if original_dst is not None:
            record["original_dst"] = original_dst
        lines = RequestLines(
            target,
            kind=kind,
            principal=principal.name,
            method=method,
            path=path,
            allow_counter=counter,
            allow_members=json_members(record),
        )
        if path is None or len(path) <= MAX_CACHED_URL_BYTES:
            self._allow_lines.put(key, lines)
        return lines

    def _allow_line(self, kind: str, principal: Principal, target: PinnedTarget) -> tuple[CounterChild, dict[str, Any]]:
        """The decision count and the members of an allow line up to `rule_pattern`."""
        would = target.would_deny
        record: dict[str, Any] = {
            "event": "decision",
            "kind": kind,
            "principal": principal.name,
            "host": target.name,
            "port": target.port,
            "addresses": target.address_texts,
        }
        rule = target.rule
        if would is None:
            counter = self._decision_counter(kind, "allow", "none")
            record["decision"] = "allow"
        else:
            counter = self._decision_counter(kind, "would_deny", str(would.code))
            record["decision"] = "would_deny"
            record["code"] = str(would.code)
            record["reason"] = would.message
            # As `AuditLog.decision` does for every refusal: one without a rule names its check.
            rule = rule or rule_for_code(str(would.code))
        record["generation"] = target.generation
        if rule is not None:
            record["rule"] = rule
            if target.rule_pattern is not None:
                record["rule_pattern"] = target.rule_pattern
        return counter, record

    def record_deny(
        self,
        kind: str,
        principal: str | None,
        host: str | None,
        port: int | None,
        *,
        error: GatewayError,
        generation: int,
        client: Mapping[str, Any] | None = None,
        claimed: str | None = None,
        original_dst: str | None = None,
        **extra: Any,
    ) -> None:
        """The refusal line and count of every surface's decision; `extra` fields (a transparent
        connection's `seen`) come last."""
        kind = self.kind_override or kind
        self.count_decision(kind, verdict_of_failure(str(error.code), error.rule), str(error.code))
        if client and "original_dst" in client:
            # A transparent connection's fields carry it already (transparent/http.py): once per line.
            client = dict(client)
            original_dst = original_dst or client.pop("original_dst")
        self.audit.decision(
            kind=kind,
            principal=principal,
            host=host,
            port=port,
            decision="deny",
            code=str(error.code),
            reason=error.message,
            generation=generation,
            rule=error.rule,
            rule_pattern=error.rule_pattern,
            claimed_principal=claimed if error.code == ErrorCode.AUTH_REQUIRED else None,
            original_dst=original_dst,
            **(client or {}),
            **extra,
        )
