"""Audit lines of every kind against the shipped JSON Schema, and the verdict/outcome split."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.observe.audit import AuditLog
from gateway.observe.audit_fields import new_connection_id, utc_timestamp
from gateway.observe.verdicts import outcome_for_close, verdict_for
from tests.harness.audit_schema import file_errors, line_errors


@dataclass(frozen=True)
class _Decided:
    generation: int
    rule: str | None
    rule_pattern: str | None


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def test_every_line_kind_is_valid_against_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), aggregate_s=0.05)
    common: dict[str, Any] = {"kind": "connect", "principal": "agent", "host": "example.org", "port": 443}
    audit.decision(
        **common,
        rule="allow_domains[0]",
        rule_pattern="*.org",
        addresses=["93.184.216.34"],
        decision="allow",
        code=None,
        generation=1,
        conn="a",
    )
    audit.decision(**common, decision="deny", code="policy_denied", reason="not allowed", generation=1)
    audit.decision(**common, decision="deny", code="policy_denied", reason="not allowed", generation=1)
    audit.decision(**common, decision="would_deny", code="policy_denied", generation=1, stage="sni")
    decided = _Decided(generation=1, rule="allow_domains[0]", rule_pattern="*.org")
    audit.connection_closed(
        **common, bytes_up=1, bytes_down=2, duration_s=0.5, reason="client_closed", target=decided, conn="a"
    )
    await asyncio.sleep(0.2)  # the aggregation window ends: one `repeated` line
    audit.close()
    lines = _lines(path)
    assert {line["event"] for line in lines} == {"decision", "close", "repeated"}
    (close,) = [line for line in lines if line["event"] == "close"]
    assert (close["generation"], close["rule"], close["rule_pattern"]) == (1, "allow_domains[0]", "*.org")
    assert file_errors(path) == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        pytest.param({"schema": 1, "event": "close"}, "time", id="missing-time"),
        pytest.param({"time": "1796123675.5", "schema": 1, "event": "decision"}, "does not match", id="epoch-time"),
        pytest.param(
            {
                "time": "2026-12-01T11:00:00.000000Z",
                "schema": 1,
                "event": "decision",
                "kind": "connect",
                "decision": "allow",
                "query": "secret",
            },
            "query",
            id="undocumented-field",
        ),
        pytest.param(
            {
                "time": "2026-12-01T11:00:00.000000Z",
                "schema": 1,
                "event": "decision",
                "kind": "connect",
                "decision": "deny",
            },
            "code",
            id="deny-without-code",
        ),
        pytest.param(
            {
                "time": "2026-12-01T11:00:00.000000Z",
                "schema": 1,
                "event": "decision",
                "kind": "http",
                "decision": "allow",
            },
            "rule",
            id="verdict-without-its-rule",
        ),
    ],
)
def test_the_schema_rejects_lines_that_break_it(line: dict[str, Any], problem: str) -> None:
    errors = line_errors(line)
    assert errors
    assert any(problem in error for error in errors), errors


def test_timestamps_are_rfc3339_utc_with_microseconds() -> None:
    text = utc_timestamp(1796123675.25)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", text)
    assert datetime.fromisoformat(text) == datetime.fromtimestamp(1796123675.25, UTC)


def test_connection_ids_are_unique() -> None:
    ids = {new_connection_id() for _ in range(1000)}
    assert len(ids) == 1000


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        pytest.param("policy_denied", "deny", id="policy"),
        pytest.param("blocked_destination", "deny", id="address-range"),
        pytest.param("auth_required", "deny", id="credential"),
        pytest.param("quota_exhausted", "deny", id="budget"),
        pytest.param("dns_failure", "allow", id="dns-is-not-a-denial"),
        pytest.param("upstream_status", "allow", id="a-404-is-not-a-denial"),
        pytest.param("too_large", "allow", id="too-large-is-not-a-denial"),
        pytest.param("store_unavailable", "allow", id="store-is-not-a-denial"),
        pytest.param("invalid_input", "none", id="malformed-has-no-verdict"),
    ],
)
def test_only_the_policys_codes_are_denials(code: str, verdict: str) -> None:
    assert verdict_for(code) == verdict


def test_a_failure_after_an_allow_is_logged_as_allow_with_its_outcome(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    common: dict[str, Any] = {"kind": "fetch", "principal": "p", "host": "h.example", "port": 443}
    audit.decision(**common, decision="deny", code="upstream_status", rule="allow_domains[0]")
    audit.decision(**common, decision="deny", code="timeout", rule="allow_domains[0]")
    # No rule had allowed it: the policy never judged it (a head too large to parse).
    audit.decision(kind="http", principal=None, host=None, port=None, decision="deny", code="too_large")
    audit.close()
    assert [(line["decision"], line["outcome"], line["code"]) for line in _lines(path)] == [
        ("allow", "upstream_error", "upstream_status"),
        ("allow", "timeout", "timeout"),
        ("none", "too_large", "too_large"),
    ]
    assert file_errors(path) == []


@pytest.mark.parametrize(
    ("reason", "outcome"),
    [("client_closed", "ok"), ("client_reset", "client_gone"), ("idle_timeout", "timeout"), ("too_large", "too_large")],
)
def test_close_reasons_map_to_outcomes(reason: str, outcome: str) -> None:
    assert outcome_for_close(reason) == outcome


@pytest.mark.parametrize(
    ("target", "path"),
    [
        pytest.param(b"/search?q=secret&key=abc", "/search", id="origin-form"),
        pytest.param(b"http://example.org/a/b?token=x#frag", "/a/b", id="absolute-form"),
        pytest.param(b"http://example.org", "/", id="no-path"),
    ],
)
def test_http_paths_never_carry_the_query(target: bytes, path: str) -> None:
    assert AuditLog("off").http_path(target) == path


def test_http_paths_can_be_dropped_by_setting() -> None:
    assert AuditLog("off", http_paths=False).http_path(b"/private/report") is None


def test_a_refusal_without_a_named_rule_names_the_check_of_its_code(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), aggregate_s=0)
    audit.decision(kind="http", principal=None, host=None, port=None, decision="deny", code="auth_required")
    audit.decision(kind="http", principal="p", host="h.example", port=80, decision="deny", code="policy_denied")
    audit.decision(
        kind="http", principal="p", host="h.example", port=80, decision="deny", code="dns_failure",
        rule="allow_domains[3]", rule_pattern="*.example",
    )  # fmt: skip
    audit.close()
    assert [(line["decision"], line["rule"]) for line in _lines(path)] == [
        ("deny", "credentials"),
        ("deny", "default_deny"),
        ("allow", "allow_domains[3]"),
    ]
    assert file_errors(path) == []
