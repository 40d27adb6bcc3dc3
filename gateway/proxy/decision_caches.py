"""The proxy's decision step: from a parsed request head to a principal, a vetted target, a record.

Owns what every proxy request pays before a byte goes upstream: the credential cache (per policy
generation), the parsed-target and vetted-host caches, and the decision's audit line and
`decisions_total` count, with the close line of a forwarded request (both kept per decision and
request as `RequestLines`). A keep-alive request whose name is in the DNS cache is decided here
without a task, through `EgressCore.pin_cached`; the listener falls back to `EgressCore.pin`
on a miss. The checks are the egress core's, never re-implemented here.

Never dials, never writes to a client, never logs or caches a credential that failed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.observe.audit_fields import client_line_end
from gateway.observe.audit_members import ConnectionFields, json_members
from gateway.observe.loop_metrics import CounterChild
from gateway.observe.verdicts import rule_for_code, verdict_of_failure
from gateway.policy.decide import authenticate_bound
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.exchange import ForwardExchange
from gateway.proxy.heads import (
    Authority,
    host_authority,
    parse_connect_authority,
    parse_proxy_authorization,
    split_absolute_target,
)
from gateway.vet.urls import VettedHost, vet_host

MAX_CACHED_CREDENTIALS = 1024
MAX_CACHED_HOSTS = 4096
MAX_CACHED_TARGETS = 4096
# Longer request targets are parsed every time: the cache must stay small (4096 entries of at most 512 B).
MAX_CACHED_URL_BYTES = 512
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


@dataclass(frozen=True, slots=True)
class ForwardTarget:
    """An absolute-form request target, parsed and canonicalised once for every request naming it."""

    host: VettedHost
    port: int
    origin_form: bytes
    authority: bytes


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


class ProxyDecisions:
    """Caches in front of authentication and host vetting, and the record of each decision."""

    # The audit kind every line and count of these decisions takes instead of the caller's
    # (`transparent` for the transparent listener's plain HTTP); None keeps connect/http.
    kind_override: str | None = None

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit
        self._credentials: BoundedMemo[tuple[int, bytes | None, int | None], Principal] = BoundedMemo(
            MAX_CACHED_CREDENTIALS
        )
        self._hosts: BoundedMemo[bytes | str, VettedHost] = BoundedMemo(MAX_CACHED_HOSTS)
        self._targets: BoundedMemo[bytes, ForwardTarget] = BoundedMemo(MAX_CACHED_TARGETS)
        self._authorities: BoundedMemo[bytes, Authority] = BoundedMemo(MAX_CACHED_TARGETS)
        self._decision_counters: dict[tuple[str, str, str], CounterChild] = {}
        self._method_names: dict[bytes, str] = {}
        # Per `AllowKey`: its lines (`record_allow`).
        self._allow_lines: BoundedMemo[AllowKey, RequestLines] = BoundedMemo(MAX_CACHED_REQUEST_MEMBERS)

    def principal_for(
        self, loaded: LoadedPolicy, authorization: bytes | None, peer_uid: int | None = None
    ) -> Principal:
        """Authenticate, caching successes per policy generation (hashing every token per request
        would be the single largest cost on a keep-alive connection). `peer_uid`: the uid behind a
        loopback client when the policy binds uids (`authenticate_bound`), else None."""
        key = (loaded.generation, authorization, peer_uid)
        principal = self._credentials.get(key)
        if principal is None:
            credential = parse_proxy_authorization(authorization)
            bound = authenticate_bound(loaded.policy, credential.user, credential.token, peer_uid)
            principal = self._credentials.put(key, bound)
        return principal

    @staticmethod
    def claimed_principal(authorization: bytes | None) -> str | None:
        """The user part of a Basic credential that failed, for the audit line (a burst of failures
        for one name is an attack on that principal); never the token, None for Bearer or garbage."""
        try:
            return parse_proxy_authorization(authorization).user
        except GatewayError:
            return None

    def vetted_host(self, raw: bytes | str) -> VettedHost:
        """`vet_host` behind a bounded cache: IDNA canonicalisation costs more than the rest of a
        cached decision, and agents ask for the same few hosts over and over."""
        host = self._hosts.get(raw)
        if host is None:
            if isinstance(raw, bytes):
                try:
                    text = raw.decode("ascii")
                except UnicodeDecodeError:
                    raise GatewayError(ErrorCode.UNSAFE_URL, "the host is not ASCII") from None
            else:
                text = raw
            host = self._hosts.put(raw, vet_host(text, keep_internal=True))
        return host

    def forward_target(self, url: bytes) -> ForwardTarget:
        """Split and vet an absolute URI once; later requests for the same URI reuse the result.

        Only successes are cached, and the result depends on nothing but the URI's bytes (the
        policy decision is made per request by the egress core)."""
        target = self._targets.get(url)
        if target is None:
            split = split_absolute_target(url)
            host = self.vetted_host(split.raw_host)
            target = ForwardTarget(host, split.port, split.origin_form, host_authority(host, split.port))
            if len(url) <= MAX_CACHED_URL_BYTES:
                self._targets.put(url, target)
        return target

    def connect_authority(self, raw: bytes) -> Authority:
        """`parse_connect_authority` once per distinct CONNECT target; only successes are cached,
        and the result depends on nothing but the target's bytes."""
        authority = self._authorities.get(raw)
        if authority is None:
            authority = parse_connect_authority(raw, self.vetted_host)
            if len(raw) <= MAX_CACHED_URL_BYTES:
                self._authorities.put(raw, authority)
        return authority

    def method_name(self, method: bytes) -> str:
        """The method as audit text (llhttp only accepts known methods, so this stays small)."""
        name = self._method_names.get(method)
        if name is None:
            name = self._method_names[method] = method.decode("ascii", "replace")
        return name

    def record_exchange_close(self, exchange: ForwardExchange, reason: str, duration_s: float | None = None) -> None:
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
        kind = self.kind_override or kind
        # Every member but the client's is the same on every line of this decision and request,
        # so they are serialized once; the client's members are its connection's.
        key = (kind, id(target), principal.name, method, path, original_dst)
        lines = self._allow_lines.get(key)
        if lines is None or lines.target is not target:
            lines = self._allow_prepared(key, principal, target)
        self.write_allow(lines, client)
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
