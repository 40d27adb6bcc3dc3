"""Allow and close lines built from members serialized once are the lines built field by field, byte for byte."""

from __future__ import annotations

import ipaddress
import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.observe.audit_fields import connection_fields, new_connection_id
from gateway.policy.model import Principal
from gateway.proxy.decision.records import MAX_CLOSES_PER_REQUEST_LINES, DecisionRecords
from gateway.proxy.forward.exchange import ClientSide, ForwardExchange, ParsedRequest
from gateway.proxy.forward.upstream import UpstreamConnection
from gateway.vet.urls import vet_host

CLIENT = {"conn": new_connection_id(), "client_ip": "127.0.0.9", "client_port": 40123}


def _target(
    rule: str | None = "allow_domains[0]",
    pattern: str | None = "*.example.org",
    would_deny: GatewayError | None = None,
    generation: int = 3,
) -> PinnedTarget:
    addresses = (ipaddress.ip_address("127.0.0.3"), ipaddress.ip_address("::1"))
    return PinnedTarget(vet_host("bench.example.org"), 443, addresses, generation, 0.0, would_deny, rule, pattern)


def _bodies(path: Path) -> list[bytes]:
    """Each line without its `time` member, which differs by the microsecond it was written."""
    lines = path.read_bytes().splitlines(keepends=True)
    return [line.split(b",", 1)[1] for line in lines]


TARGETS = [
    pytest.param(_target(), id="rule-and-pattern"),
    pytest.param(_target(pattern=None), id="rule-without-pattern"),
    pytest.param(_target(rule=None, pattern=None), id="no-rule"),
    pytest.param(
        _target(would_deny=GatewayError(ErrorCode.POLICY_DENIED, "not on the list"), rule="report", pattern=None),
        id="report-mode-would-deny",
    ),
]
CLIENTS = [
    pytest.param(CLIENT, id="client-known"),
    # As the proxy's connections build them: the members serialized once per connection.
    pytest.param(connection_fields(("127.0.0.9", 40123)), id="connection-fields"),
    pytest.param(connection_fields(("::1", 40123, 0, 0)), id="connection-fields-ipv6"),
    pytest.param(connection_fields(None), id="connection-fields-no-peer"),
    pytest.param({}, id="no-client"),
    pytest.param({"conn": "x-1", "client_ip": None}, id="client-with-a-none"),
]


# Durations whose JSON text takes each of orjson's forms: zero, under 100 µs (where Python's
# repr would write an exponent), a plain decimal, whole seconds, and a large one.
DURATIONS = [0.0, 0.0000151, 0.0123456789, 3.0, 98765.4321]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("duration", DURATIONS)
def test_a_tunnels_close_line_is_the_generic_close_line(
    tmp_path: Path, target: PinnedTarget, client: dict[str, Any], duration: float
) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    fields: dict[str, Any] = {"bytes_up": 517, "bytes_down": 4096, "duration_s": duration, "reason": "client_reset"}
    for _ in range(2):  # the second line comes from the members kept for this decision
        audit.tunnel_closed("connect", "agent", target, address="127.0.0.3", client=client, **fields)
    audit.connection_closed(
        kind="connect",
        principal="agent",
        host=target.name,
        port=target.port,
        target=target,
        address="127.0.0.3",
        **fields,
        **client,
    )
    audit.close()
    prepared, again, generic = _bodies(path)
    assert prepared == generic
    assert again == generic


def test_close_lines_take_their_own_reason_outcome_and_address_and_count_each_outcome(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    target = _target()
    closes = [("client_closed", "127.0.0.3"), ("idle_timeout", "::1"), ("client_closed", None), ("idle_timeout", "::1")]
    ok, timeout = metrics.OUTCOMES.labels("connect", "ok"), metrics.OUTCOMES.labels("connect", "timeout")
    counted = ok.value, timeout.value
    for reason, address in closes:
        audit.tunnel_closed(
            "connect",
            "agent",
            target,
            address=address,
            client=CLIENT,
            bytes_up=1,
            bytes_down=2,
            duration_s=0.5,
            reason=reason,
        )
    audit.close()
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [(line["close_reason"], line["outcome"], line.get("address")) for line in lines] == [
        ("client_closed", "ok", "127.0.0.3"),
        ("idle_timeout", "timeout", "::1"),
        ("client_closed", "ok", None),
        ("idle_timeout", "timeout", "::1"),
    ]
    assert (ok.value, timeout.value) == (counted[0] + 2, counted[1] + 2)


def test_a_close_line_follows_its_own_decision_not_an_earlier_ones(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    for target in (_target(generation=3), _target(generation=4, rule=None, pattern=None)):
        audit.tunnel_closed(
            "connect",
            "agent",
            target,
            address="127.0.0.3",
            client=CLIENT,
            bytes_up=0,
            bytes_down=0,
            duration_s=0.0,
            reason="client_closed",
        )
    audit.close()
    first, second = _bodies(path)
    assert b'"generation":3,"rule":"allow_domains[0]"' in first
    assert b'"generation":4,"address"' in second


REQUESTS = [
    pytest.param(None, None, id="connect"),
    pytest.param("GET", "/docs/a", id="http-method-and-path"),
    pytest.param("GET", "/a%20b%s%d%%", id="http-percent-in-path"),
    pytest.param("POST", None, id="http-paths-off"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("method", "http_path"), REQUESTS)
@pytest.mark.parametrize("original_dst", [None, "127.0.0.3:443"], ids=["proxied", "transparent"])
def test_an_allow_line_is_the_decision_line_built_field_by_field_and_counted_each_time(
    tmp_path: Path,
    target: PinnedTarget,
    client: dict[str, Any],
    method: str | None,
    http_path: str | None,
    original_dst: str | None,
) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    decisions = DecisionRecords(audit)
    verdict, code = ("allow", "none") if target.would_deny is None else ("would_deny", "policy_denied")
    counter = metrics.DECISIONS.labels("connect", verdict, code)
    counted = counter.value
    for _ in range(2):  # the second line comes from the members kept for this decision
        decisions.record_allow(
            "connect",
            Principal("agent"),
            target,
            method=method,
            path=http_path,
            client=client,
            original_dst=original_dst,
        )
    expected: dict[str, Any] = {
        "event": "decision",
        "kind": "connect",
        "principal": "agent",
        "host": "bench.example.org",
        "port": 443,
        "addresses": ["127.0.0.3", "::1"],
    }
    if target.would_deny is None:
        expected["decision"] = "allow"
    else:
        expected.update(decision="would_deny", code="policy_denied", reason="not on the list")
    expected["generation"] = target.generation
    if target.rule is not None:
        expected["rule"] = target.rule
    if target.rule_pattern is not None:
        expected["rule_pattern"] = target.rule_pattern
    if method is not None:
        expected["method"] = method
    if http_path is not None:
        expected["path"] = http_path
    if original_dst is not None:
        expected["original_dst"] = original_dst
    expected.update(client)  # as the caller gives them: a None is written as null
    audit.write_record(expected)
    audit.close()
    prepared, again, generic = _bodies(path)
    assert prepared == generic
    assert again == generic
    assert counter.value == counted + 2


class _Client:
    """The part of a client connection a close line reads: its audit fields."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.audit_fields = fields


class _Upstream:
    """The part of an upstream connection a close line reads: its pool key (address second)."""

    def __init__(self, address: str) -> None:
        self.key = ("agent", address, "bench.example.org", 80)


EXCHANGES = [
    pytest.param("GET", "/docs/a", 200, "127.0.0.3", id="answered"),
    # A percent in a member's text must come out as itself from the close line's format.
    pytest.param("GET", "/a%20b%s%d%%", 200, "127.0.0.3", id="percent-in-path"),
    pytest.param("POST", None, 502, "127.0.0.3", id="paths-off"),
    pytest.param("GET", "/docs/a", 0, "", id="no-status-no-address"),
    pytest.param("HEAD", "/", 204, None, id="never-dialed"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("method", "http_path", "status", "address"), EXCHANGES)
def test_a_forwarded_requests_close_line_is_the_generic_close_line(
    tmp_path: Path,
    target: PinnedTarget,
    client: dict[str, Any],
    method: str,
    http_path: str | None,
    status: int,
    address: str | None,
) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    decisions = DecisionRecords(audit)
    exchange = _exchange(decisions, client, target, method, http_path)
    exchange.status = status
    exchange.bytes_up = 517
    exchange.bytes_down = 4096
    exchange.upstream = None if address is None else cast(UpstreamConnection, _Upstream(address))
    for _ in range(2):  # the second line comes from the members kept for this decision
        decisions.record_exchange_close(exchange, "client_closed")
        audit.flush()
        # The same duration for the line built field by field: the clock moves between the two.
        duration = json.loads(path.read_bytes().splitlines()[-1])["duration_s"]
        audit.connection_closed(
            kind="http",
            principal="agent",
            host=target.name,
            port=target.port,
            bytes_up=517,
            bytes_down=4096,
            duration_s=duration,
            reason="client_closed",
            target=target,
            method=method,
            path=http_path,
            status=status or None,
            address=address or None,
            **client,
        )
    audit.close()
    # The allow line `_exchange` wrote for the request's lines is not compared here.
    _, prepared, generic, again, generic_again = _bodies(path)
    assert prepared == generic
    assert again == generic_again
    assert b'"outcome":"ok"' in prepared


def _exchange(
    decisions: DecisionRecords,
    client: dict[str, Any],
    target: PinnedTarget,
    method: str,
    http_path: str | None,
    principal: str = "agent",
) -> ForwardExchange:
    """An allowed request, as the dispatcher leaves it: its allow line written, its lines held."""
    request = ParsedRequest(method.encode(), b"http://a/", b"", b"", None, False, False, True)
    exchange = ForwardExchange(request, cast(ClientSide, _Client(client)))
    exchange.target = target
    exchange.principal = Principal(principal)
    exchange.lines = decisions.record_allow(
        "http", Principal(principal), target, method=method, path=http_path, client=client
    )
    return exchange


def test_each_request_line_takes_its_own_members_when_they_alternate(tmp_path: Path) -> None:
    """Lines kept per decision and request: alternating principals, paths, statuses, addresses
    and close reasons on one target each get their own members, and each outcome is counted."""
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    decisions = DecisionRecords(audit)
    target = _target()
    client = connection_fields(("127.0.0.9", 40123))
    ok, timeout = metrics.OUTCOMES.labels("http", "ok"), metrics.OUTCOMES.labels("http", "timeout")
    counted = ok.value, timeout.value
    requests = [
        ("agent", "/a", 200, "127.0.0.3", "client_closed"),
        ("other", "/b", 404, "::1", "idle_timeout"),
        ("agent", "/a", 200, "127.0.0.3", "client_closed"),
        ("agent", "/b", 200, None, "idle_timeout"),
    ]
    for principal, http_path, status, address, reason in requests:
        exchange = _exchange(decisions, client, target, "GET", http_path, principal)
        exchange.status = status
        exchange.upstream = None if address is None else cast(UpstreamConnection, _Upstream(address))
        decisions.record_exchange_close(exchange, reason)
    audit.close()
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    allows, closes = lines[0::2], lines[1::2]
    assert [(line["principal"], line["path"]) for line in allows] == [(r[0], r[1]) for r in requests]
    assert [
        (line["principal"], line["path"], line["status"], line.get("address"), line["close_reason"]) for line in closes
    ] == requests
    assert all(line["conn"] == client["conn"] for line in lines)
    assert (ok.value, timeout.value) == (counted[0] + 2, counted[1] + 2)


def test_a_prepared_lines_time_is_the_moment_it_was_written(tmp_path: Path) -> None:
    """The line start computed inline (the second formatted once, its microseconds per line)."""
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    decisions = DecisionRecords(audit)
    target = _target()
    client = connection_fields(("127.0.0.9", 40123))
    before = time.time()
    exchange = _exchange(decisions, client, target, "GET", "/a")
    decisions.record_exchange_close(exchange, "client_closed")
    after = time.time()
    audit.close()
    for line in path.read_bytes().splitlines():
        stamp = json.loads(line)["time"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)
        written = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
        # Truncated to the microsecond, as the line start writes it.
        assert int(before * 1e6) / 1e6 - 1e-6 <= written <= after


def test_a_requests_close_lines_beyond_the_kept_formats_are_still_its_own(tmp_path: Path) -> None:
    """More (status, address, reason) outcomes than one request's lines keep formats for: each
    close line still carries its own status, and the lines keep no more than their bound."""
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    decisions = DecisionRecords(audit)
    exchange = _exchange(decisions, connection_fields(("127.0.0.9", 40123)), _target(), "GET", "/a")
    statuses = [200 + n for n in range(MAX_CLOSES_PER_REQUEST_LINES + 3)] * 2
    for status in statuses:
        exchange.status = status
        decisions.record_exchange_close(exchange, "client_closed")
    audit.close()
    assert exchange.lines is not None
    assert len(exchange.lines.closes) <= MAX_CLOSES_PER_REQUEST_LINES
    closes = [json.loads(line) for line in path.read_bytes().splitlines()][1:]
    assert [line["status"] for line in closes] == statuses
    assert all(line["path"] == "/a" and line["method"] == "GET" for line in closes)


def test_a_close_line_takes_the_duration_its_caller_measured(tmp_path: Path) -> None:
    """The duration the connection observed in its latency histogram is the line's own."""
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    decisions = DecisionRecords(audit)
    exchange = _exchange(decisions, connection_fields(("127.0.0.9", 40123)), _target(), "GET", "/a")
    decisions.record_exchange_close(exchange, "done", 98765.4321)
    decisions.record_exchange_close(exchange, "done")  # measured here: the request just started
    audit.close()
    given, measured = (json.loads(line)["duration_s"] for line in path.read_bytes().splitlines()[1:])
    assert given == 98765.4321
    assert 0.0 <= measured < 60.0
