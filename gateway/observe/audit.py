"""The JSON audit log: the line schema (version `audit_fields.SCHEMA_VERSION`), its builders, and fail-closed writing.

Every line starts with `time` (RFC 3339 UTC with microseconds), `schema` and `event`; the fields
are listed in docs/reference/audit-log.md and in `audit.schema.json` beside this module. Fields
are chosen for security review: who, what kind, which host and port, which addresses, the policy
verdict (`decision`) apart from what then happened (`outcome`), the policy generation, durations
and byte counts. Never a query string, never a search query, never a credential or key.

Lines are buffered and leave in one write() at most `FLUSH_INTERVAL_S` after the first of them
(or as soon as `MAX_PENDING_LINES` are waiting): at thousands of tunnels per second a write() per
line was the largest single cost of a tunnel after the kernel's own. `flush()` writes at once
(the tools API calls it before answering) and `close()` flushes at shutdown. On the proxy's hot
path a line's members that repeat from line to line are serialized once: an allow line is the
line start, the members kept per decision and request, and the connection's members
(`write_line`); a close line is the line start, one `%` format of its counts and duration kept
per decision, request and outcome (`close_format`), and the connection's members (`write_close`,
`tunnel_closed`): the same bytes as the line built from a dict, without the dict.

When the destination cannot be written, no partial line is left (the sink cuts it back), the
failure is logged once and counted, lines are held (bounded) and retried, and, unless
`on_failure` is `allow`, `refusal()` tells the egress core to refuse new egress until a write
succeeds again. Repeated identical denials within `aggregate_s` are written once and then
summarised by one `repeated` line with a count (`audit_repeats`), so an agent cannot fill the
disk by retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.observe import metrics
from gateway.observe.audit_fields import CLOCK, client_line_end
from gateway.observe.audit_members import (
    ConnectionFields,
    DecidedTarget,
    TunnelTarget,
    close_format,
    json_members,
)
from gateway.observe.audit_repeats import DEFAULT_AGGREGATE_S, DenialAggregator
from gateway.observe.audit_sink import AuditSink
from gateway.observe.loop_metrics import CounterChild, LoopCounter
from gateway.observe.verdicts import outcome_for_close, outcome_for_code, rule_for_code, verdict_of_failure

log = logging.getLogger("egress_gateway.audit")

# The response header that carries a line's `conn` to the client (proxy and tools API).
CONNECTION_ID_HEADER = "X-Egress-Id"
FLUSH_INTERVAL_S = 0.01
MAX_PENDING_LINES = 1024
# Held in memory while the destination fails; newer lines beyond this are counted, not kept.
MAX_RETAINED_LINES = 10_000
RETRY_INTERVAL_S = 1.0
# Tunnel close formats kept per (kind, decision, principal, reason, address); cleared when full.
MAX_PREPARED_CLOSES = 4096
# (kind, close reason) pairs whose close-line members are kept serialized.
MAX_PREPARED_CLOSINGS = 256
# Every line leaves with its newline: the flush joins without a separator or a copy to end it.
_NEWLINE = orjson.OPT_APPEND_NEWLINE
_dumps = orjson.dumps


class AuditLog:
    """Writes audit lines to stdout, a file, or nowhere (`off`)."""

    def __init__(
        self,
        destination: str,
        *,
        on_failure: str = "deny",
        max_bytes: int = 0,
        keep_files: int = 1,
        aggregate_s: float = DEFAULT_AGGREGATE_S,
        http_paths: bool = True,
    ) -> None:
        # Raises OSError for an unwritable destination: the daemon refuses to start without it.
        self._sink = (
            None if destination == "off" else AuditSink(destination, max_bytes=max_bytes, keep_files=keep_files)
        )
        self.destination = destination
        self.on_failure = on_failure
        self.http_paths = http_paths
        self._pending: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        self._failure: str | None = None
        self._failed_at = 0.0
        self._refusal: GatewayError | None = None
        self._dropped = 0
        self._repeats = DenialAggregator(aggregate_s, self.write)
        # Per (kind, close reason): the outcome, its counter, and the close line's `close_reason`
        # and `outcome` members, serialized with a leading comma (`_closing`).
        self._closings: BoundedMemo[tuple[str, str], tuple[str, CounterChild, bytes]] = BoundedMemo(
            MAX_PREPARED_CLOSINGS
        )
        self._counters: dict[tuple[str, tuple[str, ...]], CounterChild] = {}
        # Per (kind, target id, principal, close reason, address): the target, the outcome's
        # counter and the close line's format (`tunnel_closed`).
        self._close_formats: BoundedMemo[
            tuple[str, int, str, str, str | None], tuple[TunnelTarget, CounterChild, bytes]
        ] = BoundedMemo(MAX_PREPARED_CLOSES)
        metrics.AUDIT_WRITABLE.set(1)

    # state ------------------------------------------------------------------------------------
    @property
    def failure(self) -> str | None:
        """Why the destination cannot be written now, or None."""
        return self._failure

    def refusal(self) -> GatewayError | None:
        """The error new egress gets while the audit log cannot be written (`on_failure: deny`)."""
        return self._refusal

    # writing ----------------------------------------------------------------------------------
    def write(self, event: str, **fields: Any) -> None:
        if self._sink is None:
            return
        self._write_fields(event, fields)

    def _write_fields(self, event: str, fields: dict[str, Any]) -> None:
        record: dict[str, Any] = {"event": event}
        for key, value in fields.items():
            if value is not None:
                record[key] = value
        self._append_record(record, time.time())

    def write_record(self, record: dict[str, Any]) -> None:
        """A line already built by the caller: `event` first, no None values (the proxy builds
        its lines as dict literals on its hot path). A caller's `ts` is replaced by `time`."""
        if self._sink is None:
            return
        now = record.pop("ts", None)
        self._append_record(record, now if isinstance(now, float) else time.time())

    def write_line(self, members: bytes, end: bytes, now: float | None = None) -> None:
        """A line from its members serialized beforehand (`event` first) and its `end` (the
        client's members, the closing brace and the newline: `audit_fields.client_line_end`),
        written at `now` (`time.time()` when not given): the bytes `write_record` writes for the
        same fields. Every line comes through here: its start and its buffering are these."""
        if self._sink is None:
            return
        # The line start: the clock's second formatted once, its microseconds per line.
        if now is None:
            now = time.time()
        clock = CLOCK
        fraction = now - clock.start
        if not 0.0 <= fraction < 1.0:
            clock.tick(int(now))
            fraction = now - clock.start
        # `%06d` truncates the float as `int()` would.
        line = clock.line_format % (fraction * 1_000_000) + members + end
        pending = self._pending
        if self._failure is not None:
            # The retry timer writes them; beyond the bound, newer lines are counted, not kept.
            if len(pending) >= MAX_RETAINED_LINES:
                self._dropped += 1
            else:
                pending.append(line)
            return
        pending.append(line)
        waiting = len(pending)
        if waiting == 1:
            self._schedule_flush()
        elif waiting >= MAX_PENDING_LINES:
            self.flush()

    def write_close(self, close_format: bytes, bytes_up: int, bytes_down: int, duration_s: float, end: bytes) -> None:
        """A close line from its `audit_members.close_format` (everything but the counts and the
        client's members) and its `end` (`audit_fields.client_line_end`): the bytes
        `connection_closed` writes for the same fields. The outcome is counted by the caller,
        with the format."""
        if self._sink is None:
            return
        # Microseconds; round(x, 6) would format and parse a decimal string for the same value.
        # orjson's text of the float, not `%r`'s: the same where both are plain decimals, and
        # orjson's shortest-digits search is the cheaper of the two.
        self.write_line(close_format % (bytes_up, bytes_down, _dumps(round(duration_s * 1e6) / 1e6)), end)

    def _append_record(self, record: dict[str, Any], now: float) -> None:
        # orjson's output, without the opening brace the shared start has, is the line's members
        # and its end.
        self.write_line(orjson.dumps(record, default=str, option=_NEWLINE)[1:], b"", now)

    def _schedule_flush(self) -> None:
        try:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self._flush_due)
        except RuntimeError:
            self.flush()

    def _flush_due(self) -> None:
        # The timer has fired: nothing to cancel.
        self._timer = None
        self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._sink is None or not self._pending:
            return
        data = b"".join(self._pending)
        try:
            self._sink.write(data)
        except OSError as exc:
            self._failed(exc)
            return
        self._pending.clear()
        if self._failure is not None:
            self._recovered()

    def _failed(self, exc: OSError) -> None:
        metrics.AUDIT_WRITE_FAILURES.inc()
        if self._failure is None:
            self._failure = f"cannot write {self.destination}: {exc.strerror or exc}"
            self._failed_at = time.monotonic()
            metrics.AUDIT_WRITABLE.set(0)
            if self.on_failure == "deny":
                self._refusal = GatewayError(
                    ErrorCode.AUDIT_UNAVAILABLE,
                    f"the audit log cannot be written ({self._failure}); new egress is refused until it can",
                )
            log.error("audit %s (%s)", self._failure, "egress refused" if self._refusal else "egress continues")
        # Without a loop (a one-shot command) the next write retries.
        with contextlib.suppress(RuntimeError):
            self._timer = asyncio.get_running_loop().call_later(RETRY_INTERVAL_S, self.flush)

    def _recovered(self) -> None:
        failed_for_s = time.monotonic() - self._failed_at
        log.warning("audit log writable again after %.1f s (%d line(s) dropped)", failed_for_s, self._dropped)
        self._failure = None
        self._refusal = None
        metrics.AUDIT_WRITABLE.set(1)
        dropped, self._dropped = self._dropped, 0
        self.write("audit_resumed", dropped=dropped, failed_for_s=round(failed_for_s, 3))
        self.flush()

    def started(self, generation: int) -> None:
        """The daemon's first line, written through at once: the proof that the destination takes
        writes before anything is served (a failure is recorded as any failed write is)."""
        self.write("audit_started", generation=generation)
        self.flush()

    def reopen(self) -> None:
        """Reopen the file (SIGHUP/SIGUSR1, after logrotate moved it) and write what is held."""
        if self._sink is None:
            return
        try:
            self._sink.reopen()
        except OSError as exc:
            self._failed(exc)
            return
        self.flush()

    # line builders ----------------------------------------------------------------------------
    def http_path(self, target: bytes | str) -> str | None:
        """A plain HTTP line's `path`: the request target's path without its query (a query can
        carry a secret), or None when EGRESS_AUDIT_HTTP_PATHS is off."""
        if not self.http_paths:
            return None
        text = target.decode("ascii", "replace") if isinstance(target, bytes) else target
        if "://" in text:
            text = "/" + text.split("://", 1)[1].partition("/")[2]
        return text.partition("?")[0].partition("#")[0] or "/"

    def decision(
        self,
        *,
        kind: str,
        principal: str | None,
        host: str | None,
        port: int | None,
        addresses: Sequence[str] = (),
        decision: str,
        code: str | None,
        reason: str | None = None,
        generation: int | None = None,
        outcome: str | None = None,
        rule: str | None = None,
        rule_pattern: str | None = None,
        **extra: Any,
    ) -> None:
        """One decision line. A `deny` with a code that is not the policy's (a DNS failure, a 404)
        is recorded as the policy's `allow` with the failure as `outcome`. A refusal whose caller
        names no rule names the check its code comes from (`rule_for_code`)."""
        if decision == "deny" and code is not None:
            decision = verdict_of_failure(code, rule)
            outcome = outcome or outcome_for_code(code)
            # A forged or contradicted run token is a wrong credential too: guessing run tokens
            # must show on the same counter (and alert) as guessing bearer tokens.
            if code in (ErrorCode.AUTH_REQUIRED, ErrorCode.INVALID_RUN_TOKEN):
                self._counter(metrics.AUTH_FAILURES, (kind,)).value += 1
        if rule is None and code is not None and decision in ("deny", "would_deny"):
            rule = rule_for_code(code)
        if outcome is not None:
            self._counter(metrics.OUTCOMES, (kind, outcome)).value += 1
        if self._sink is None:
            return
        if decision == "deny":
            # An agent retrying a refused request comes here in a loop: a repeat is counted from
            # its key alone, before a line's dict is built (`DenialAggregator` names the fields).
            repeat = (kind, principal, host, port, code, extra.get("client_ip"), extra.get("method"))
            if self._repeats.counted(repeat):
                return
        fields = {
            "kind": kind,
            "principal": principal,
            "host": host,
            "port": port,
            "addresses": list(addresses) or None,
            "decision": decision,
            "outcome": outcome,
            "code": code,
            "reason": reason,
            "generation": generation,
            "rule": rule,
            "rule_pattern": rule_pattern,
            **extra,
        }
        if decision == "deny":
            self._repeats.first(repeat, fields)
        # The fields as they are, not spread into a second keyword dict.
        self._write_fields("decision", fields)

    def _counter(self, family: LoopCounter, labels: tuple[str, ...]) -> CounterChild:
        """A counter child remembered per family and labels (`labels()` per line costs a key
        tuple, a check and a lookup). Bounded: every label here is from a fixed vocabulary."""
        counter = self._counters.get((family.name, labels))
        if counter is None:
            counter = self._counters[(family.name, labels)] = family.labels(*labels)
        return counter

    def _closing(self, kind: str, reason: str) -> tuple[str, CounterChild, bytes]:
        """A close reason's outcome, its counter child (`labels()` per line costs a key tuple and
        a lookup), and the `close_reason` and `outcome` members with a leading comma."""
        closing = self._closings.get((kind, reason))
        if closing is None:
            outcome = outcome_for_close(reason)
            members = b"," + json_members({"close_reason": reason, "outcome": outcome})
            closing = self._closings.put((kind, reason), (outcome, metrics.OUTCOMES.labels(kind, outcome), members))
        return closing

    def connection_closed(
        self,
        *,
        kind: str,
        principal: str,
        host: str,
        port: int,
        bytes_up: int,
        bytes_down: int,
        duration_s: float,
        reason: str,
        target: DecidedTarget | None = None,
        **extra: Any,
    ) -> None:
        """The close line of a tunnel or a forwarded request: the proxy writes one per connection.
        With `target`, it repeats the generation and rule it was allowed under."""
        outcome, counter, _ = self._closing(kind, reason)
        counter.value += 1
        if self._sink is None:
            return
        record = {
            "event": "close",
            "kind": kind,
            "principal": principal,
            "host": host,
            "port": port,
            "bytes_up": bytes_up,
            "bytes_down": bytes_down,
            # Microseconds; round(x, 6) would format and parse a decimal string for the same value.
            "duration_s": round(duration_s * 1e6) / 1e6,
            "close_reason": reason,
            "outcome": outcome,
        }
        if target is not None:
            record["generation"] = target.generation
            if target.rule is not None:
                record["rule"] = target.rule
                if target.rule_pattern is not None:
                    record["rule_pattern"] = target.rule_pattern
        if None in extra.values():
            for key, value in extra.items():
                if value is not None:
                    record[key] = value
        else:
            record.update(extra)  # a tunnel's extras (address, conn, client) are all known
        self._append_record(record, time.time())

    def close_format(
        self, kind: str, principal: str, target: TunnelTarget, reason: str, after_rule: bytes
    ) -> tuple[CounterChild, bytes]:
        """A close line's outcome counter and its `audit_members.close_format` for `reason`, with
        `after_rule` (a forwarded request's members, the `address`) after the decision's members."""
        _, counter, closing = self._closing(kind, reason)
        return counter, close_format(kind, principal, target, closing, after_rule)

    def tunnel_closed(
        self,
        kind: str,
        principal: str,
        target: TunnelTarget,
        *,
        address: str | None,
        client: Mapping[str, Any],
        bytes_up: int,
        bytes_down: int,
        duration_s: float,
        reason: str,
    ) -> None:
        """A tunnel's close line: the bytes `connection_closed(host=target.name, port=target.port,
        target=target, address=address, **client)` writes. Everything but the counts and the
        client's members is one format kept per (kind, target, principal, reason, address), the
        client's members are kept per connection (`ConnectionFields`)."""
        key = (kind, id(target), principal, reason, address)
        prepared = self._close_formats.get(key)
        # The target is held with its format: its id cannot be reused while the entry lives.
        if prepared is None or prepared[0] is not target:
            address_member = b"" if address is None else b',"address":' + orjson.dumps(address, default=str)
            counter, line_format = self.close_format(kind, principal, target, reason, address_member)
            prepared = self._close_formats.put(key, (target, counter, line_format))
        # The counter child's own field: `inc()` would be one more call per line.
        prepared[1].value += 1
        self.write_close(
            prepared[2],
            bytes_up,
            bytes_down,
            duration_s,
            client.line_end if type(client) is ConnectionFields else client_line_end(client, drop_none=True),
        )

    def never_opened(
        self,
        *,
        kind: str,
        principal: str,
        host: str,
        port: int,
        reason: str,
        target: DecidedTarget | None = None,
        **extra: Any,
    ) -> None:
        """The close line of an allowed connection that never carried a byte (the dial failed, or
        the client left while it ran), so the allow line is never left without its outcome."""
        self.connection_closed(
            kind=kind,
            principal=principal,
            host=host,
            port=port,
            bytes_up=0,
            bytes_down=0,
            duration_s=0.0,
            reason=reason,
            target=target,
            **extra,
        )

    def close(self) -> None:
        self._repeats.close()
        self.flush()
        if self._sink is not None:
            self._sink.close()
            self._sink = None
